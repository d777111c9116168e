package scope

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/corral-dev/corral/scope/cgroupv2"
	"golang.org/x/sys/unix"
)

// Why a watcher: systemd stops a scope as soon as its cgroup empties and
// then removes the cgroup, so the counters of a tree whose last process just
// died (typically: the main process was OOM-killed) are usually gone before
// the reactor reaps the main process and asks for Stats. Measured in the
// harness: 7 of 10 OOM kills were invisible that way. The watcher reads the
// counters the moment the kernel reports a change, while they still exist:
//
//   - inotify on the scope's cgroup2 cgroup.events (and memory.events on a
//     pure v2 host): the kernel signals "populated" flipping to 0 and new
//     memory events; the watcher then takes a Stats reading.
//   - on a v1 memory hierarchy (hybrid and legacy hosts), an eventfd
//     registered for memory.oom_control through cgroup.event_control: the
//     kernel signals it synchronously when the memcg runs out of memory,
//     before it kills, and once more when the cgroup is removed.
//
// cgroupWatch is owned by its scope: started once in Started, stopped once in
// Remove (or when Started fails). Its goroutines and the backend's shared
// inotify watcher (cgroupv2.Watcher: one instance for all scopes, since
// closing one costs a kernel grace period) only call the scope's locked
// methods.
//
// The watch owns the OOM eventfd: watchOOM hands the fd over (adopt) or
// closes it itself, and stop closes what was handed over. A SetLimits that
// registers while Remove runs may finish its registration after stop; adopt
// then refuses the fd, so nothing outlives stop.
type cgroupWatch struct {
	unwatch func() // ends the cgroup.events/memory.events watch, or nil

	mu      sync.Mutex
	stopped bool       // stop began: adopt refuses
	files   []*os.File // adopted fds, closed by stop
	wg      sync.WaitGroup
}

// startWatch starts watching p for s. Failures only cost accuracy; they are
// logged.
func (s *systemdScope) startWatch(p unitCgroups) *cgroupWatch {
	w := &cgroupWatch{}
	if p.Unified != "" {
		err := s.b.watcherErr
		if s.b.watcher != nil {
			w.unwatch, err = s.b.watcher.Add(cgroupv2.Dir(p.Unified), func() { s.refreshStats() }, "cgroup.events", "memory.events")
		}
		if err != nil {
			s.b.opts.Log.Debug().Err(err).Str("unit", s.unit).Msg("cannot watch cgroup.events")
		}
	}
	if p.Memory != "" && s.limits.MemoryBytes > 0 {
		s.watchOOM(w, p)
	}
	return w
}

// watchOOM registers for the v1 memory cgroup's OOM notifications, which
// only a scope with a memory limit needs. The registration counts only if
// the scope is still starting or running with no OOM eventfd yet (two
// SetLimits may race) and w still takes it (Remove may have stopped w
// meanwhile); otherwise the eventfd is closed here and then.
func (s *systemdScope) watchOOM(w *cgroupWatch, p unitCgroups) {
	o, err := openV1OOM(p.Memory)
	if err != nil {
		s.b.opts.Log.Debug().Err(err).Str("unit", s.unit).Msg("cannot register for v1 OOM notifications")
		return
	}
	s.mu.Lock()
	live := s.state == unitStarting || s.state == unitRunning
	taken := live && s.oom == nil && w.adopt(o.file)
	if taken {
		s.oom = o
	}
	s.mu.Unlock()
	if !taken {
		o.file.Close()
		return
	}
	w.runOOM(o, s)
}

// adopt makes f w's to close, and counts the goroutine that will read it
// (runOOM), unless stop already began. It reports whether w took f.
func (w *cgroupWatch) adopt(f *os.File) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.files = append(w.files, f)
	w.wg.Add(1)
	return true
}

// v1OOM is the accounting of a v1 OOM eventfd. The kernel signals the
// eventfd once per OOM, before killing, and once more when the cgroup is
// removed (asynchronously, after the rmdir, so after every OOM signal).
// Hence: signals read while the cgroup still exists are all OOMs; two or
// more read in total once it is gone include at least one OOM; a lone one
// read once it is gone is ambiguous until the next signal (the removal's,
// if the lone one was an OOM) or settleWait settles it as the removal's.
// Both the watcher goroutine (runOOM) and Stats read the eventfd; the
// scope's mu guards this struct. Only runOOM waits: Stats and Empty run on
// the reactor's loop goroutine, which must not block (docs/design.md), so
// they read what is pending and, when that leaves the count ambiguous, set
// the settling deadline on the eventfd that runOOM reads.
type v1OOM struct {
	fd      int // the eventfd, non-blocking; owned by file
	file    *os.File
	total   uint64        // signals read so far
	certain bool          // an OOM kill happened for sure
	settled bool          // the ambiguity was resolved as "no OOM"
	waiting bool          // ambiguous: file's read deadline is the end of the settling wait
	wait    time.Duration // the settling wait: settleWait (tests change it)
	// decided is closed once certain or settled, or the watch ended
	// (OOMUndecided).
	decided chan struct{}
	closed  bool
}

// settleWait is how long a lone signal read once the cgroup is gone waits
// for the removal's before it counts as the removal's.
const settleWait = 30 * time.Millisecond

func newV1OOM(fd int, file *os.File) *v1OOM {
	return &v1OOM{fd: fd, file: file, wait: settleWait, decided: make(chan struct{})}
}

// countLocked adds n signals read just now; exists is whether the memory
// cgroup still existed after the read. It reports whether the count is
// still ambiguous; the first time it is, it starts the settling wait.
func (o *v1OOM) countLocked(n uint64, exists bool) (ambiguous bool) {
	o.total += n
	if o.total > 0 && (exists || o.total >= 2) {
		o.certain = true
	}
	ambiguous = !o.certain && !o.settled && o.total == 1 && !exists
	if ambiguous && !o.waiting {
		o.waiting = true
		// Ends runOOM's read at the end of the wait, or now if it ran
		// ahead; fails (nothing to end) once the watch is stopped.
		_ = o.file.SetReadDeadline(time.Now().Add(o.wait))
	}
	if o.certain || o.settled {
		o.decideLocked()
	}
	return ambiguous
}

// decideLocked closes decided, once.
func (o *v1OOM) decideLocked() {
	if !o.closed {
		o.closed = true
		close(o.decided)
	}
}

// drainLocked reads what is pending without blocking and reports whether
// the count is ambiguous.
func (o *v1OOM) drainLocked(memDir string) (ambiguous bool) {
	var buf [8]byte
	var n uint64
	if k, err := unix.Read(o.fd, buf[:]); err == nil && k == 8 {
		n = binary.NativeEndian.Uint64(buf[:])
	}
	return o.countLocked(n, cgroupv2.Dir(memDir).Exists())
}

// undecidedLocked is OOMUndecided's answer for o: nil once decided.
func (o *v1OOM) undecidedLocked(memDir string) <-chan struct{} {
	if o.drainLocked(memDir) {
		return o.decided
	}
	return nil
}

// OOMUndecided: the count is undecided while a lone signal read once the
// cgroup was gone waits for the removal's (at most settleWait).
func (s *systemdScope) OOMUndecided() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.oom == nil || s.state != unitRunning && s.state != unitStarting {
		return nil
	}
	return s.oom.undecidedLocked(s.paths.Memory)
}

// runOOM reads the OOM eventfd in the background, so an OOM is seen while
// the cgroup still exists even when nobody calls Stats, and does the
// settling wait (v1OOM). w adopted o.file.
func (w *cgroupWatch) runOOM(o *v1OOM, s *systemdScope) {
	go func() {
		defer w.wg.Done()
		rc, rcErr := o.file.SyscallConn()
		for {
			// The counter is read and counted under s.mu in one step:
			// read first and counted after, a Stats between the two found
			// neither the signal nor an undecided count (an OOM missed).
			var ambiguous, exists bool
			var readErr error
			err := rcErr
			if err == nil {
				err = rc.Read(func(fd uintptr) bool {
					var buf [8]byte
					s.mu.Lock()
					defer s.mu.Unlock()
					n, rerr := unix.Read(int(fd), buf[:])
					switch {
					case rerr == unix.EAGAIN:
						return false // wait until readable
					case rerr != nil:
						readErr = os.NewSyscallError("read oom eventfd", rerr)
						return true
					case n != len(buf):
						return true // nothing to count; read again
					}
					exists = cgroupv2.Dir(s.paths.Memory).Exists()
					ambiguous = o.countLocked(binary.NativeEndian.Uint64(buf[:]), exists)
					s.readStatsLocked()
					return true
				})
				if err == nil {
					err = readErr
				}
			}
			if err != nil {
				// The settling wait ended with no signal (the lone one
				// was the removal's), or the watch was stopped.
				s.mu.Lock()
				if errors.Is(err, os.ErrDeadlineExceeded) && s.oom == o {
					// (s.oom == o: the watch is not stopped, the fd is
					// open.) What came right at the deadline counts.
					o.drainLocked(s.paths.Memory)
					if !o.certain {
						o.settled = true
					}
				}
				o.decideLocked()
				s.mu.Unlock()
				return
			}
			if !ambiguous && !exists {
				return // decided: certain (countLocked closed decided)
			}
		}
	}()
}

// stop closes the watcher's fds and waits for its goroutines; fds offered
// later are refused (adopt). Idempotent.
func (w *cgroupWatch) stop() {
	if w == nil {
		return
	}
	if w.unwatch != nil {
		w.unwatch()
	}
	w.mu.Lock()
	w.stopped = true
	files := w.files
	w.files = nil
	w.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
	w.wg.Wait()
}

// openV1OOM registers a non-blocking eventfd for OOM notifications of the
// v1 memory cgroup dir.
func openV1OOM(dir string) (*v1OOM, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("eventfd", err)
	}
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		unix.Close(efd)
		return nil, err
	}
	// The registration holds its own reference: ctl may be closed after.
	defer ctl.Close()
	if err := cgroupv2.Dir(dir).Write("cgroup.event_control", fmt.Sprintf("%d %d", efd, ctl.Fd())); err != nil {
		unix.Close(efd)
		return nil, fmt.Errorf("register OOM eventfd: %w", err)
	}
	return newV1OOM(efd, os.NewFile(uintptr(efd), "oom-eventfd:"+dir)), nil
}

// refreshStats takes a Stats reading now (the watcher saw the cgroup
// change). It returns false once the cgroup is gone.
func (s *systemdScope) refreshStats() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readStatsLocked()
	return s.paths.exists()
}

// readStatsLocked merges a fresh reading into s.last (s.mu held). It reads
// as soon as the unit has paths, also while Started is finishing.
func (s *systemdScope) readStatsLocked() { s.readStatsOfLocked(false) }

// readStatsOfLocked is readStatsLocked; with empty (the scope was just read
// unpopulated) it counts no tasks: an empty cgroup has none, gone or not.
func (s *systemdScope) readStatsOfLocked(empty bool) {
	if s.state != unitRunning && s.state != unitStarting {
		return
	}
	now := s.paths.statsOf(empty)
	gone := empty || !s.paths.exists()
	s.last = mergeStats(s.last, now, gone)
	if s.oom != nil {
		// No wait: an ambiguous count is settled by runOOM (v1OOM).
		s.oom.drainLocked(s.paths.Memory)
		if s.oom.certain {
			s.last.OOMKills = max(s.last.OOMKills, 1)
		}
	}
}
