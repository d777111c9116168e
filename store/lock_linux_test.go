package store

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdLock takes dir's lock on a descriptor of its own (as another open
// file description would: a second daemon, or the child of a daemon that
// exec'd in place), writing pid into the lock file.
func holdLock(t *testing.T, dir string, pid int) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, LockName), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLockHeldUnderOwnPidIsWaitedFor: after a handover (exec in place, same
// pid) the old image's lock can linger for a moment in a child it was
// forking; the new image must wait for it, not fail (which ended the daemon
// and everything it was handed; found by tests/drill, reload under load).
func TestLockHeldUnderOwnPidIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	held := holdLock(t, dir, os.Getpid())
	go func() {
		time.Sleep(300 * time.Millisecond)
		held.Close() // the child execs: its copy of the descriptor goes
	}()
	f, err := lockDir(dir)
	if err != nil {
		t.Fatalf("lockDir with our own pid's lock released after 300ms = %v, want the lock", err)
	}
	f.Close()
}

// TestLockHeldByAnotherPidFailsAtOnce: a second daemon on the same state
// directory still stops at once, naming the holder.
func TestLockHeldByAnotherPidFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	held := holdLock(t, dir, os.Getpid()+1)
	defer held.Close()
	t0 := time.Now()
	_, err := lockDir(dir)
	if err == nil || !strings.Contains(err.Error(), "in use by pid "+strconv.Itoa(os.Getpid()+1)) {
		t.Fatalf("lockDir with another pid's lock = %v, want in use by pid %d", err, os.Getpid()+1)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("lockDir took %v to refuse another daemon's lock, want at once", d)
	}
}
