package testenv

import (
	"fmt"
	"syscall"
)

// LowerFDLimit lowers this process's soft RLIMIT_NOFILE to its lowest free
// fd number plus spare, so that about spare more files open: every
// goroutine's open fails with EMFILE alike, as in a daemon out of fds. An
// fd below the limit that another goroutine closes meanwhile is a hole one
// more open may take. spare 0 sets the limit to 0 instead: no fd can be
// allocated at all, whatever is closed meanwhile (what a test needs when
// one open must fail). The caller must call restore (once the fault is
// over, and before the test ends: the limit is process-wide), which puts
// the old limit back.
func LowerFDLimit(spare int) (restore func() error, err error) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		return nil, fmt.Errorf("get RLIMIT_NOFILE: %w", err)
	}
	// The lowest free fd number: the kernel hands out the lowest one.
	free, err := syscall.Dup(0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	syscall.Close(free)
	lim := syscall.Rlimit{Cur: uint64(free + spare), Max: old.Max}
	if spare == 0 {
		lim.Cur = 0
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("set RLIMIT_NOFILE to %d: %w", lim.Cur, err)
	}
	return func() error {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			return fmt.Errorf("restore RLIMIT_NOFILE: %w", err)
		}
		return nil
	}, nil
}
