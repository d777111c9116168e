package cgroupv2

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
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

// TestSignalThawsAtFDLimit: the fds run out while Signal has the tree
// frozen (corrald at its fd limit, tests/drill emfile): listing the pids
// fails, and the tree must still end thawed, not stay frozen. The thaw
// reuses the freeze's open file; opening cgroup.freeze anew would fail.
func TestSignalThawsAtFDLimit(t *testing.T) {
	for attempt := 1; ; attempt++ {
		frozen, serr := signalRunningOutOfFDs(t)
		if !errors.Is(serr, unix.EMFILE) {
			// The fds were not taken while the tree was frozen (the
			// filler came late, after the 100ms freeze wait): try again.
			if attempt < 5 {
				continue
			}
			t.Fatalf("Signal = %v; want EMFILE listing the pids (the test's premise) in 5 attempts", serr)
		}
		if frozen != "0" {
			t.Errorf("cgroup.freeze = %q after Signal failed at the fd limit; want \"0\": the tree was left frozen", frozen)
		}
		return
	}
}

// signalRunningOutOfFDs runs Signal(SIGCONT) on a fake cgroup that never
// reports frozen (so Signal waits 100ms for it) while a goroutine takes
// every free fd as soon as cgroup.freeze reads "1". It returns
// cgroup.freeze afterwards and Signal's error.
func signalRunningOutOfFDs(t *testing.T) (string, error) {
	t.Helper()
	d := Dir(filepath.Join(t.TempDir(), "c"))
	writeFiles(t, d.Path(), map[string]string{"cgroup.freeze": "0", "cgroup.events": "frozen 0\n"})
	startSleep(t, d)
	ff, err := os.Open(filepath.Join(d.Path(), "cgroup.freeze"))
	if err != nil {
		t.Fatal(err)
	}
	defer ff.Close()
	restore, err := testenv.LowerFDLimit(32)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := restore(); err != nil {
			t.Fatal(err)
		}
	}()
	taken := make(chan []int, 1)
	stop := make(chan struct{})
	go func() {
		var fds []int
		defer func() { taken <- fds }()
		buf := make([]byte, 1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n, _ := ff.ReadAt(buf, 0); n == 1 && buf[0] == '1' {
				break
			}
		}
		// Take every free fd, and keep taking any that comes free until
		// Signal returns: an fd Signal had open while the fds ran out (its
		// poll of cgroup.events) is freed after, and would let it list the
		// pids one file at a time.
		for {
			select {
			case <-stop:
				return
			default:
			}
			if fd, err := unix.Dup(0); err == nil {
				fds = append(fds, fd)
			}
		}
	}()
	serr := d.Signal(unix.SIGCONT)
	close(stop)
	for _, fd := range <-taken {
		unix.Close(fd)
	}
	got, err := d.Read("cgroup.freeze")
	if err != nil {
		t.Fatal(err)
	}
	return string(got), serr
}
