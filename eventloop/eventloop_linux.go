// Package eventloop is a small epoll reactor: file descriptors with handlers,
// timers that drive the epoll timeout, and an eventfd through which other
// goroutines post functions to run on the loop. It knows nothing of
// processes; the supervisor logic lives in package reactor.
//
// Ownership: a Loop is driven by exactly one goroutine, the one that calls
// Run (the "loop goroutine"). Add, Modify, Remove, AfterFunc and Timer.Stop
// must be called on the loop goroutine, that is from a handler, a timer or a
// posted function. Post and Close may be called from any goroutine.
package eventloop

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Events is a set of readiness conditions.
type Events uint32

const (
	Readable Events = unix.EPOLLIN
	Writable Events = unix.EPOLLOUT
	Priority Events = unix.EPOLLPRI
	Hangup   Events = unix.EPOLLHUP | unix.EPOLLRDHUP
	Error    Events = unix.EPOLLERR
)

// Handler is called on the loop goroutine with the events that fired.
type Handler func(ev Events)

// ErrClosed is returned by Post after the loop stopped.
var ErrClosed = errors.New("event loop closed")

type registration struct {
	fd  int
	gen uint32
	h   Handler
}

// Loop is an epoll reactor. See the package doc for which goroutine may call
// what.
type Loop struct {
	epfd int
	efd  int // eventfd for Post

	// Posted work, guarded by mu. awake coalesces wake-ups: only the poster
	// that flips it false->true writes the eventfd.
	mu     sync.Mutex
	posted []func()
	awake  atomic.Bool
	closed atomic.Bool

	// Loop-goroutine state.
	regs   map[int]*registration
	gen    uint32
	timers timerHeap
	events []unix.EpollEvent
	spare  []func()
	stop   bool
}

// New creates a loop. Call Run to drive it and Close to release it.
func New() (*Loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("eventfd", err)
	}
	l := &Loop{
		epfd:   epfd,
		efd:    efd,
		regs:   make(map[int]*registration),
		events: make([]unix.EpollEvent, 256),
	}
	// The eventfd is registered with gen 0; fd registrations start at 1.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd), Pad: 0}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		unix.Close(efd)
		unix.Close(epfd)
		return nil, os.NewSyscallError("epoll_ctl add eventfd", err)
	}
	return l, nil
}

// Add registers fd for events; h runs on the loop goroutine whenever one of
// them is ready (level-triggered). The loop does not own fd: the caller
// closes it, after Remove.
func (l *Loop) Add(fd int, events Events, h Handler) error {
	if _, ok := l.regs[fd]; ok {
		return fmt.Errorf("add fd %d: already registered", fd)
	}
	l.gen++
	if l.gen == 0 { // 0 marks the eventfd
		l.gen = 1
	}
	r := &registration{fd: fd, gen: l.gen, h: h}
	ev := unix.EpollEvent{Events: uint32(events), Fd: int32(fd), Pad: int32(r.gen)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("add fd %d: %w", fd, os.NewSyscallError("epoll_ctl", err))
	}
	l.regs[fd] = r
	return nil
}

// Modify changes the events fd is watched for.
func (l *Loop) Modify(fd int, events Events) error {
	r, ok := l.regs[fd]
	if !ok {
		return fmt.Errorf("modify fd %d: not registered", fd)
	}
	ev := unix.EpollEvent{Events: uint32(events), Fd: int32(fd), Pad: int32(r.gen)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return fmt.Errorf("modify fd %d: %w", fd, os.NewSyscallError("epoll_ctl", err))
	}
	return nil
}

// Remove unregisters fd. Events already fetched for it in this round are
// dropped (the generation check), so the caller may close fd right after.
func (l *Loop) Remove(fd int) error {
	if _, ok := l.regs[fd]; !ok {
		return fmt.Errorf("remove fd %d: not registered", fd)
	}
	delete(l.regs, fd)
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		return fmt.Errorf("remove fd %d: %w", fd, os.NewSyscallError("epoll_ctl", err))
	}
	return nil
}

// Registered reports how many fds are registered (the eventfd not counted).
func (l *Loop) Registered() int { return len(l.regs) }

// Post queues f to run on the loop goroutine. Safe from any goroutine. Posts
// run in order. It fails with ErrClosed once the loop stopped.
func (l *Loop) Post(f func()) error {
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		return ErrClosed
	}
	l.posted = append(l.posted, f)
	l.mu.Unlock()
	if l.awake.CompareAndSwap(false, true) {
		var one = [8]byte{1}
		if _, err := unix.Write(l.efd, one[:]); err != nil && err != unix.EAGAIN {
			return os.NewSyscallError("write eventfd", err)
		}
	}
	return nil
}

// Run drives the loop on the calling goroutine until ctx is done or Stop is
// called. Posted functions still queued when it returns are dropped.
func (l *Loop) Run(ctx context.Context) error {
	stopWatch := context.AfterFunc(ctx, func() { _ = l.Post(func() { l.stop = true }) })
	defer stopWatch()
	for !l.stop {
		if err := l.poll(); err != nil {
			return err
		}
	}
	return nil
}

// Stop makes Run return after the current round. Loop goroutine only.
func (l *Loop) Stop() { l.stop = true }

// beforeWait, when set (tests only, before the loop runs), is called
// right before a wait that may block, after the yield.
var beforeWait func()

// poll runs the due timers, waits for events and handles them.
//
// Before a wait that may block it yields its thread (runtime.Gosched) to
// the goroutines the round just made runnable: a store write queued, an
// answer sent on a channel, a goroutine started for work off the loop. The
// Go runtime puts such a goroutine next in line on the loop's own P, and
// epoll_wait is a plain system call, during which that P is not given to
// another thread until sysmon takes it back (20 µs at best, up to 10 ms
// when sysmon has backed off) unless another P is idle to steal it (not
// the usual case on a busy 2-core host), so without the yield the
// follow-up of the loop's own work could wait for that while a core is
// idle. The yield makes that rare, not impossible: the scheduler serves
// its global run queue, where the yielded loop goes, first once in 61
// ticks.
func (l *Loop) poll() error {
	timeout := l.runTimers()
	if l.stop {
		return nil
	}
	if timeout != 0 {
		runtime.Gosched()
		if beforeWait != nil {
			beforeWait()
		}
	}
	n, err := unix.EpollWait(l.epfd, l.events, timeout)
	if err != nil {
		if err == unix.EINTR {
			return nil // recompute the timeout
		}
		return os.NewSyscallError("epoll_wait", err)
	}
	for i := 0; i < n; i++ {
		ev := l.events[i]
		fd, gen := int(ev.Fd), uint32(ev.Pad)
		if gen == 0 && fd == l.efd {
			l.runPosted()
			continue
		}
		r, ok := l.regs[fd]
		if !ok || r.gen != gen {
			continue // removed, or closed and reused, earlier in this round
		}
		r.h(Events(ev.Events))
	}
	if n == len(l.events) && n < 4096 {
		l.events = make([]unix.EpollEvent, 2*n)
	}
	return nil
}

func (l *Loop) runPosted() {
	var buf [8]byte
	_, _ = unix.Read(l.efd, buf[:])
	l.awake.Store(false)
	l.mu.Lock()
	work := l.posted
	l.posted = l.spare[:0]
	l.mu.Unlock()
	for i, f := range work {
		f()
		work[i] = nil
	}
	l.spare = work[:0]
}

// Close stops accepting posts and releases the loop's fds. Call it after Run
// returned. Registered fds are not closed: they belong to their owners.
func (l *Loop) Close() error {
	l.mu.Lock()
	already := l.closed.Swap(true)
	l.posted = nil
	l.mu.Unlock()
	if already {
		return nil
	}
	err1 := unix.Close(l.efd)
	err2 := unix.Close(l.epfd)
	return errors.Join(err1, err2)
}

// Timer is a one-shot timer running a function on the loop goroutine.
type Timer struct {
	when  time.Time
	f     func()
	index int // in the heap; -1 when not scheduled
}

// AfterFunc runs f on the loop goroutine after d. Loop goroutine only.
func (l *Loop) AfterFunc(d time.Duration, f func()) *Timer {
	t := &Timer{when: time.Now().Add(d), f: f}
	heap.Push(&l.timers, t)
	return t
}

// Stop cancels t on loop l; it reports whether t was still pending. Loop
// goroutine only. Stopping a fired or stopped timer is a no-op.
func (l *Loop) StopTimer(t *Timer) bool {
	if t == nil || t.index < 0 {
		return false
	}
	heap.Remove(&l.timers, t.index)
	return true
}

// Timers reports how many timers are pending.
func (l *Loop) Timers() int { return len(l.timers) }

// runTimers fires due timers and returns the epoll timeout in ms until the
// next one (-1: none).
func (l *Loop) runTimers() int {
	for len(l.timers) > 0 {
		t := l.timers[0]
		d := time.Until(t.when)
		if d > 0 {
			// Round up so a timer never fires early.
			ms := (d + time.Millisecond - 1) / time.Millisecond
			if ms > 1<<30 {
				ms = 1 << 30
			}
			return int(ms)
		}
		heap.Pop(&l.timers)
		t.f()
		if l.stop {
			return 0
		}
	}
	return -1
}

type timerHeap []*Timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].when.Before(h[j].when) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}
