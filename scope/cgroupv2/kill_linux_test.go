package cgroupv2

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startSleep starts a sleep the test owns and lists its pid in dir's
// cgroup.procs, as a cgroup without a freezer or cgroup.kill (a v1
// directory, an old kernel) would show it.
func startSleep(t *testing.T, dir Dir) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	writeFiles(t, dir.Path(), map[string]string{"cgroup.procs": strconv.Itoa(cmd.Process.Pid) + "\n"})
	return cmd
}

// waitSignal waits (bounded) for cmd to end and returns the signal that
// ended it.
func waitSignal(t *testing.T, cmd *exec.Cmd) syscall.Signal {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("sleep ended with %v, want a signal", err)
		}
		return ee.Sys().(syscall.WaitStatus).Signal()
	case <-time.After(10 * time.Second):
		t.Fatal("sleep still runs 10s after the signal")
	}
	return 0
}

// TestSignalWithoutFreezer: where cgroup.freeze cannot be written, Signal
// still reaches every pid listed in the tree (a child cgroup's too).
func TestSignalWithoutFreezer(t *testing.T) {
	root := Dir(filepath.Join(t.TempDir(), "c"))
	writeFiles(t, root.Path(), map[string]string{"cgroup.procs": ""})
	cmd := startSleep(t, root.Child("sub"))
	if err := root.Signal(unix.SIGTERM); err != nil {
		t.Fatalf("Signal(SIGTERM) = %v", err)
	}
	if sig := waitSignal(t, cmd); sig != syscall.SIGTERM {
		t.Errorf("sleep ended by %v, want SIGTERM", sig)
	}
}

// TestKillWithoutCgroupKill: a kernel before 5.14 has no cgroup.kill; Kill
// falls back to signalling every listed pid.
func TestKillWithoutCgroupKill(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "c"))
	cmd := startSleep(t, d)
	if err := d.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	if sig := waitSignal(t, cmd); sig != syscall.SIGKILL {
		t.Errorf("sleep ended by %v, want SIGKILL", sig)
	}
}

// TestGoneIsNotAnError: a cgroup removed before Kill, Signal or Destroy
// has nothing left to end.
func TestGoneIsNotAnError(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "gone"))
	if err := d.Kill(); err != nil {
		t.Errorf("Kill of a removed cgroup = %v, want nil", err)
	}
	if err := d.Signal(unix.SIGTERM); err != nil {
		t.Errorf("Signal of a removed cgroup = %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.Destroy(ctx); err != nil {
		t.Errorf("Destroy of a removed cgroup = %v, want nil", err)
	}
}
