package scope

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
)

// Test helpers shared by the pgroup and cgroup tests start with "bk" so they
// cannot clash with the systemd backend's tests in this package.

// bkChild is a command started in a scope by bkStart.
type bkChild struct {
	cmd    *exec.Cmd
	scope  Scope
	lines  *bufio.Reader // the child's stdout
	waited bool
	status error
}

// bkStart prepares a scope for argv on b, starts argv as the reactor would
// (after Prepare, then Started(pid)) and registers cleanup: kill the scope,
// wait for the child, remove the scope.
func bkStart(t *testing.T, b Backend, id string, lim Limits, argv ...string) *bkChild {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("StdoutPipe: %v", err)
	}
	sc, err := b.Prepare(context.Background(), Spec{ID: id, Argv: argv, Limits: lim, Cmd: cmd})
	if err != nil {
		t.Fatalf("Prepare(%s) = %v", id, err)
	}
	if err := cmd.Start(); err != nil {
		_ = sc.Remove()
		t.Fatalf("start %v: %v", argv, err)
	}
	c := &bkChild{cmd: cmd, scope: sc, lines: bufio.NewReader(out)}
	t.Cleanup(func() {
		if err := sc.Kill(); err != nil {
			t.Errorf("cleanup Kill: %v", err)
		}
		// If Kill is broken, still end the child rather than hang the suite.
		stop := time.AfterFunc(5*time.Second, func() {
			t.Errorf("child %d outlived Kill by 5s; killing it directly", cmd.Process.Pid)
			_ = cmd.Process.Kill()
		})
		c.wait(t)
		stop.Stop()
		bkWaitEmpty(t, sc)
		if err := sc.Remove(); err != nil {
			t.Errorf("cleanup Remove: %v", err)
		}
	})
	if err := sc.Started(context.Background(), cmd.Process.Pid); err != nil {
		t.Fatalf("Started(%d) = %v", cmd.Process.Pid, err)
	}
	return c
}

// wait waits for the child (once) and returns its Wait error.
func (c *bkChild) wait(t *testing.T) error {
	t.Helper()
	if !c.waited {
		c.waited = true
		c.status = c.cmd.Wait()
	}
	return c.status
}

// pid reads the next line of the child's stdout as a pid.
func (c *bkChild) pid(t *testing.T) int {
	t.Helper()
	line, err := c.lines.ReadString('\n')
	if err != nil {
		t.Fatalf("read pid from child: %q, %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		t.Fatalf("child printed %q, want a pid", line)
	}
	return pid
}

// bkSubreaper makes the test process a child subreaper for the test, so that
// orphaned grandchildren come back to it and bkWaitGone can reap them
// instead of depending on PID 1.
func bkSubreaper(t *testing.T) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
			t.Errorf("clear PR_SET_CHILD_SUBREAPER: %v", err)
		}
	})
}

// bkWaitGone waits (bounded) until pid no longer exists, reaping it if it
// became our child. It fails the test if pid outlives the deadline.
func bkWaitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if wpid == pid {
			return // reaped
		}
		if errors.Is(err, unix.ECHILD) && errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Fatalf("pid %d still exists after 5s: %s", pid, stat)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// bkAlive reports whether pid exists and is not a zombie.
func bkAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// bkWaitEmpty polls Empty until true, failing after 5s.
func bkWaitEmpty(t *testing.T, sc Scope) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := waitEmpty(ctx, sc); err != nil {
		t.Fatalf("scope %s not empty: %v", sc.Name(), err)
	}
}

func TestPgroupPrepare(t *testing.T) {
	tests := []struct {
		name string
		attr *syscall.SysProcAttr
		want syscall.SysProcAttr
	}{
		{"nil attr", nil, syscall.SysProcAttr{Setsid: true}},
		{"keeps other fields", &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Noctty: true},
			syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Noctty: true}},
		{"drops Setpgid", &syscall.SysProcAttr{Setpgid: true, Pgid: 7},
			syscall.SysProcAttr{Setsid: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("true")
			cmd.SysProcAttr = tc.attr
			lim := Limits{MemoryBytes: 1 << 20, TasksMax: 5, CPUMS: 100}
			sc, err := NewPgroup().Prepare(context.Background(), Spec{ID: "x", Cmd: cmd, Limits: lim})
			if err != nil {
				t.Fatalf("Prepare = %v", err)
			}
			if got := *cmd.SysProcAttr; got.Setsid != tc.want.Setsid || got.Setpgid != tc.want.Setpgid ||
				got.Pgid != tc.want.Pgid || got.Pdeathsig != tc.want.Pdeathsig || got.Noctty != tc.want.Noctty {
				t.Errorf("SysProcAttr = %+v, want %+v", got, tc.want)
			}
			if got, ok := Unenforced(sc); !ok || got != lim {
				t.Errorf("Unenforced = %+v, %v, want %+v, true", got, ok, lim)
			}
		})
	}
}

// Before Started the scope has no group: it must never signal pgid 0 (the
// daemon's own group).
func TestPgroupBeforeStarted(t *testing.T) {
	sc, err := NewPgroup().Prepare(context.Background(), Spec{ID: "x", Cmd: exec.Command("true")})
	if err != nil {
		t.Fatalf("Prepare = %v", err)
	}
	if err := sc.Kill(); err != nil {
		t.Errorf("Kill before Started = %v, want nil", err)
	}
	if empty, err := sc.Empty(); !empty || err != nil {
		t.Errorf("Empty before Started = %v, %v, want true, nil", empty, err)
	}
	if err := sc.Started(context.Background(), 0); err == nil {
		t.Errorf("Started(0) = nil, want an error")
	}
}

func TestPgroupKillsOrphanedGrandchild(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	c := bkStart(t, NewPgroup(), "orphan", Limits{}, "sh", "-c", "sleep 1000 & echo $!; exit 0")
	sleep := c.pid(t)
	if err := c.wait(t); err != nil {
		t.Fatalf("main exited with %v, want 0", err)
	}
	if want := "pgid:" + strconv.Itoa(c.cmd.Process.Pid); c.scope.Name() != want {
		t.Errorf("Name = %q, want %q", c.scope.Name(), want)
	}
	if !bkAlive(sleep) {
		t.Fatalf("grandchild %d not running after main exited", sleep)
	}
	if empty, err := c.scope.Empty(); empty || err != nil {
		t.Errorf("Empty with a live grandchild = %v, %v, want false, nil", empty, err)
	}
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	bkWaitGone(t, sleep)
	bkWaitEmpty(t, c.scope)
	// Signalling an empty group is not an error.
	if err := c.scope.Signal(unix.SIGTERM); err != nil {
		t.Errorf("Signal on an empty group = %v, want nil", err)
	}
	st, err := c.scope.Stats()
	if err != nil || st.CPUUsageNS != Unknown || st.Tasks != Unknown || st.MemoryPeak != Unknown {
		t.Errorf("Stats = %+v, %v, want Unknown fields", st, err)
	}
}

func TestPgroupSignalReachesGrandchild(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	c := bkStart(t, NewPgroup(), "term", Limits{}, "sh", "-c", "sleep 1000 & echo $!; wait")
	sleep := c.pid(t)
	if err := c.scope.Signal(unix.SIGTERM); err != nil {
		t.Fatalf("Signal(SIGTERM) = %v", err)
	}
	err := c.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("main exited with %v, want killed by SIGTERM", err)
	}
	bkWaitGone(t, sleep)
	bkWaitEmpty(t, c.scope)
}

// The documented limit of this backend: a descendant that calls setsid
// leaves the group, so Kill does not reach it.
func TestPgroupSetsidEscapes(t *testing.T) {
	bkSubreaper(t)
	c := bkStart(t, NewPgroup(), "escape", Limits{}, "sh", "-c", `setsid sh -c 'sleep 1000 & echo $!'; exit 0`)
	escaped := c.pid(t)
	t.Cleanup(func() {
		_ = unix.Kill(escaped, unix.SIGKILL)
		bkWaitGone(t, escaped)
	})
	c.wait(t)
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	bkWaitEmpty(t, c.scope)
	if !bkAlive(escaped) {
		t.Errorf("setsid descendant %d died with the group, want it to escape (update the backend doc)", escaped)
	}
}

type exitError = exec.ExitError

func bkCommand(argv ...string) *exec.Cmd { return exec.Command(argv[0], argv[1:]...) }
