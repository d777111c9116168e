package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockName is the lock file in the state directory. One daemon holds it
// while its store is open: a second one on the same directory would mark
// the first one's running executions lost.
const LockName = "corral.lock"

// lockDir takes the exclusive flock on dir/LockName, writing our pid into
// it. The kernel drops the lock when the process dies, so a kill -9 never
// leaves a stale lock.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, err := os.ReadFile(path); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					holder = fmt.Sprintf("pid %d", pid)
				}
			}
			return nil, fmt.Errorf("state directory %s is in use by %s", dir, holder)
		}
		return nil, fmt.Errorf("lock %s: %w", path, os.NewSyscallError("flock", err))
	}
	// Best effort: the pid only makes the error above friendlier.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
