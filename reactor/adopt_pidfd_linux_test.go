package reactor

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPidfdExitAfterSomeoneElseReaped: the status comes from the pidfd once
// the child was reaped (here by Wait, standing in for PID 1), and not
// before.
func TestPidfdExitAfterSomeoneElseReaped(t *testing.T) {
	if !ProbePidfdExitInfo() {
		t.Fatal("this kernel has no PIDFD_INFO_EXIT; the survival tests need Linux >= 6.15")
	}
	cmd := exec.Command("/bin/sh", "-c", "read x; exit 7")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd := dupPidfd(cmd.Process)
	if fd < 0 {
		t.Fatal("no pidfd")
	}
	defer unix.Close(fd)
	if _, ok, err := pidfdExit(fd); ok || err != nil {
		t.Fatalf("running child: ok %v, err %v; want neither", ok, err)
	}
	stdin.Close()
	// A zombie: exited, not reaped yet.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err == nil && info.Signo != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("child did not exit")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok, err := pidfdExit(fd); ok || err != nil {
		t.Fatalf("zombie: ok %v, err %v; want neither", ok, err)
	}
	_ = cmd.Wait()
	ws, ok, err := pidfdExit(fd)
	if !ok || err != nil || !ws.Exited() || ws.ExitStatus() != 7 {
		t.Fatalf("reaped: status %v exited %v code %d ok %v err %v; want exit 7", ws, ws.Exited(), ws.ExitStatus(), ok, err)
	}

	kill := exec.Command("sleep", "100")
	if err := kill.Start(); err != nil {
		t.Fatal(err)
	}
	kfd := dupPidfd(kill.Process)
	defer unix.Close(kfd)
	if !sameProcess(kill.Process, kfd) || sameProcess(kill.Process, fd) {
		t.Error("sameProcess cannot tell processes apart")
	}
	kill.Process.Signal(unix.SIGKILL)
	_ = kill.Wait()
	ws, ok, _ = pidfdExit(kfd)
	if !ok || !ws.Signaled() || ws.Signal() != unix.SIGKILL {
		t.Errorf("killed child: %v ok %v; want SIGKILL", ws, ok)
	}
}
