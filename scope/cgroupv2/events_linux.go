package cgroupv2

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher tells when cgroup interface files change: the kernel signals a
// modification of cgroup.events when "populated" or "frozen" flips, of
// memory.events on a new memory event. One inotify instance serves every
// watch, with one reader goroutine: closing an inotify instance waits for
// an SRCU grace period in the kernel (measured 11 ms on the project's host,
// against 19 µs for inotify_rm_watch), so an instance per cgroup would put
// that wait into every scope's removal. The kernel sends no inotify event
// when a cgroup directory is removed; a watch lasts until its stop.
// Safe for concurrent use.
type Watcher struct {
	file *os.File // the inotify instance, non-blocking, so Close ends the reader
	fd   int      // file's descriptor (file.Fd would make it blocking)

	mu     sync.Mutex
	fns    map[int]func() // by watch descriptor
	closed bool
	done   chan struct{} // closed when the reader returned
}

// NewWatcher starts a watcher; Close it when done.
func NewWatcher() (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	w := &Watcher{
		file: os.NewFile(uintptr(fd), "inotify:cgroups"),
		fd:   fd,
		fns:  map[int]func(){},
		done: make(chan struct{}),
	}
	go w.read()
	return w, nil
}

// read calls the function of each watch that reports a change, under mu,
// so that no function runs once its stop returned.
func (w *Watcher) read() {
	defer close(w.done)
	buf := make([]byte, 4096)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return // closed
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if fn := w.fns[int(ev.Wd)]; fn != nil && ev.Mask&unix.IN_MODIFY != 0 {
				fn()
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		w.mu.Unlock()
	}
}

// Add calls fn, on the watcher's goroutine, each time one of d's named
// interface files changes. The first name must exist; later ones are
// watched where they exist. fn must not block and must not call the
// watcher. stop ends the watch; once it returned fn is not called again.
// stop is idempotent.
func (w *Watcher) Add(d Dir, fn func(), names ...string) (stop func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("cgroup watcher closed")
	}
	var wds []int
	for i, name := range names {
		p := filepath.Join(string(d), name)
		wd, err := unix.InotifyAddWatch(w.fd, p, unix.IN_MODIFY)
		if err != nil {
			if i == 0 {
				return nil, fmt.Errorf("watch %s: %w", p, os.NewSyscallError("inotify_add_watch", err))
			}
			continue
		}
		w.fns[wd] = fn
		wds = append(wds, wd)
	}
	var once sync.Once
	return func() { once.Do(func() { w.remove(wds) }) }, nil
}

func (w *Watcher) remove(wds []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wd := range wds {
		delete(w.fns, wd)
		if !w.closed {
			// EINVAL: the kernel already dropped the watch.
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
		}
	}
}

// Close ends every watch and the reader goroutine. Idempotent.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.fns = map[int]func(){}
	w.mu.Unlock()
	err := w.file.Close()
	<-w.done
	return err
}

// EmptyEvents is d's cgroup.events opened for epoll: the descriptor polls
// with EPOLLPRI (and EPOLLERR) once after the open and whenever the file
// changes ("populated" or "frozen" flipped), until Empty re-reads it. Unlike
// an inotify instance it costs nothing to close. The caller owns the
// descriptor and closes it with Close.
type EmptyEvents struct {
	fd  int
	dir Dir
}

// OpenEmptyEvents opens d's cgroup.events for epoll. A removed cgroup is
// an error satisfying Gone.
func (d Dir) OpenEmptyEvents() (*EmptyEvents, error) {
	p := filepath.Join(string(d), "cgroup.events")
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, os.NewSyscallError("open", err))
	}
	return &EmptyEvents{fd: fd, dir: d}, nil
}

// FD is the descriptor to poll for EPOLLPRI.
func (ev *EmptyEvents) FD() int { return ev.fd }

// Empty re-reads cgroup.events through the descriptor, which re-arms it,
// and reports whether no process is left in the cgroup or its children. A
// cgroup removed meanwhile is empty.
func (ev *EmptyEvents) Empty() (bool, error) {
	var buf [256]byte
	n, err := unix.Pread(ev.fd, buf[:], 0)
	if err != nil {
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		return false, fmt.Errorf("read cgroup.events of %s: %w", ev.dir, os.NewSyscallError("pread", err))
	}
	v, ok := Keyed(buf[:n], "populated")
	if !ok {
		return false, fmt.Errorf("read cgroup.events of %s: no populated key", ev.dir)
	}
	return v == 0, nil
}

// Close closes the descriptor. Idempotent.
func (ev *EmptyEvents) Close() error {
	if ev.fd < 0 {
		return nil
	}
	err := unix.Close(ev.fd)
	ev.fd = -1
	return err
}
