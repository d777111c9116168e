package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LockName is the lock file in the state directory. One daemon holds it
// while its store is open: a second one on the same directory would mark
// the first one's running executions lost.
const LockName = "corral.lock"

// ownLockWait is how long lockDir retries a lock held under our own pid.
const ownLockWait = 5 * time.Second

// lockDir takes the exclusive flock on dir/LockName, writing our pid into
// it. The kernel drops the lock when the process dies, so a kill -9 never
// leaves a stale lock.
//
// The lock file naming our own pid means a handover: this image replaced
// the one that held the lock (exec in place, same pid). Its lock went with
// its descriptor at the exec, unless a child it was forking at that moment
// still holds a copy of its descriptor table until that child execs; so
// then the lock is retried for up to ownLockWait instead of failing the new
// image, which would end the daemon with every execution it was handed
// (found by tests/drill, reload under load).
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(ownLockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, os.NewSyscallError("flock", err))
		}
		holder, pid := "another process", 0
		if b, err := os.ReadFile(path); err == nil {
			if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				holder = fmt.Sprintf("pid %d", pid)
			}
		}
		if pid != os.Getpid() || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("state directory %s is in use by %s", dir, holder)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Best effort: the pid only makes the error above friendlier.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
