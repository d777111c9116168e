package scope

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Locker is implemented by backends whose scopes live where another daemon
// could make its own: the cgroup backend's base directory, the systemd
// backend's slice. The state directory's lock keeps two daemons off one
// store; Lock keeps them off one cgroup base or slice, so that a second
// corrald (another state directory, the default --cgroup-base) can never
// sweep the first one's cgroups as leftovers. The daemon calls Lock before
// it touches any scope and holds the lock until it exits; the kernel drops
// it when the process dies or execs.
type Locker interface {
	Lock() (io.Closer, error)
}

// SliceLockDir holds the systemd backend's slice locks.
const SliceLockDir = "/run/corral"

var (
	_ Locker = (*cgroupBackend)(nil)
	_ Locker = (*systemdBackend)(nil)
)

// Lock takes an exclusive flock on the base directory itself.
func (b *cgroupBackend) Lock() (io.Closer, error) {
	f, err := flockPath(b.base, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, ErrScopesInUse) {
		return nil, fmt.Errorf("cgroup base %s: %w; stop it, or give this corrald a base of its own with --cgroup-base (e.g. %s-2)", b.base, err, b.base)
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup base %s: %w", b.base, err)
	}
	return f, nil
}

// Lock takes an exclusive flock on SliceLockDir/<slice>.lock.
func (b *systemdBackend) Lock() (io.Closer, error) {
	if err := os.MkdirAll(SliceLockDir, 0o755); err != nil {
		return nil, fmt.Errorf("slice %s: lock directory: %w", b.opts.Slice, err)
	}
	path := filepath.Join(SliceLockDir, b.opts.Slice+".lock")
	f, err := flockPath(path, unix.O_RDWR|unix.O_CREAT)
	if errors.Is(err, ErrScopesInUse) {
		return nil, fmt.Errorf("slice %s: %w; stop it, or give this corrald a slice of its own with --slice", b.opts.Slice, err)
	}
	if err != nil {
		return nil, fmt.Errorf("slice %s: %w", b.opts.Slice, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// ErrScopesInUse says another corrald holds the cgroup base or slice.
var ErrScopesInUse = errors.New("in use by another corrald")

func flockPath(path string, flags int) (*os.File, error) {
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", os.NewSyscallError("open", err))
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := ""
			if b, rerr := os.ReadFile(path); rerr == nil && flags&unix.O_DIRECTORY == 0 {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = fmt.Sprintf(" (pid %d)", pid)
				}
			}
			return nil, fmt.Errorf("%w%s", ErrScopesInUse, holder)
		}
		return nil, fmt.Errorf("lock: %w", os.NewSyscallError("flock", err))
	}
	return f, nil
}
