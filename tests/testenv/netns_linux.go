package testenv

import (
	"os/exec"
	"syscall"
	"testing"
)

// NetnsChild starts `sleep 30` in a network namespace of its own and
// returns its pid; the child is killed and reaped when t ends. It skips t
// (or fails it under CORRAL_STRICT=1) unless it runs as root.
func NetnsChild(t testing.TB) int {
	t.Helper()
	SkipRoot(t, "a new network namespace needs root")
	c := exec.Command("sleep", "30")
	c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := c.Start(); err != nil {
		t.Fatalf("start sleep in a new network namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
	})
	return c.Process.Pid
}
