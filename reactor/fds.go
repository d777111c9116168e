package reactor

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// startFDs is how many fds an execution may need at once while it starts:
// its output pipes, stdin, the pidfd and its dup, the cgroup directory, a
// shim's socket pair, /dev/null, and the store's files.
const startFDs = 16

// fdHeadroom reports whether the daemon can open startFDs more fds now, by
// duplicating one that many times and closing them again. Without it, an
// exec.start under EMFILE stored a record and then failed to spawn, an
// outcome start_failed for what is the daemon's own capacity (found by
// tests/drill, emfile); with it the start is refused with -32003 and
// nothing is recorded. Another goroutine may take fds between this check
// and the spawn; that start still ends start_failed with the reason.
func fdHeadroom() error {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	fds := []int{fd}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for len(fds) < startFDs {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%d fds free: %w", len(fds), err)
		}
		fds = append(fds, d)
	}
	return nil
}
