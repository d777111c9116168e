// Package systemdscope_test runs the systemd scope backend against a real,
// private systemd (tests/harness).
package systemdscope_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
	"github.com/corral-dev/corral/tests/harness"

	"github.com/corral-dev/corral/tests/testenv"
)

func TestMain(m *testing.M) {
	// The scopes' children start as this binary (the shim re-execs
	// /proc/self/exe), so it must be able to act as the shim.
	if len(os.Args) > 1 && os.Args[1] == shim.Arg {
		shim.Main()
	}
	os.Exit(harness.RunInside(m))
}

const childPath = "PATH=/usr/local/bin:/usr/bin:/bin"

// dialer lets a test see and break the backend's D-Bus connections.
type dialer struct {
	mu    sync.Mutex
	conns []*sddbus.Conn
	down  atomic.Bool // refuse to dial, as if systemd's socket were gone
	dials atomic.Int32
}

func (d *dialer) dial(ctx context.Context) (*sddbus.Conn, error) {
	if d.down.Load() {
		return nil, errors.New("test: D-Bus is down")
	}
	d.dials.Add(1)
	c, err := sddbus.NewSystemdConnectionContext(ctx)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

// closeAll closes every connection underneath the backend.
func (d *dialer) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
}

func newBackend(t *testing.T) (scope.Backend, *dialer) {
	t.Helper()
	harness.Require(t)
	d := &dialer{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := scope.NewSystemd(ctx, scope.SystemdOptions{Dial: d.dial, JobTimeout: 15 * time.Second})
	if err != nil {
		t.Fatalf("NewSystemd: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	// The tests hold each child (hold) because the backend says so.
	if p := b.Placement(); p != scope.PlaceHeld {
		t.Fatalf("systemd backend Placement() = %v, want %v", p, scope.PlaceHeld)
	}
	return b, d
}

// child is one command started in a systemd scope.
type child struct {
	cmd    *exec.Cmd
	sc     scope.Scope
	stdout *syncBuffer
	stderr *syncBuffer
	waited chan struct{}
}

// syncBuffer is a bytes.Buffer that os/exec's copying goroutine may write
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hold wraps cmd in a shim that holds it until Release, as the reactor does
// for a backend that places after start (scope.PlaceHeld): the backend only
// places, the caller holds and releases. Cleanup closes the Handle.
func hold(t *testing.T, cmd *exec.Cmd) *shim.Handle {
	t.Helper()
	h, err := shim.Wrap(cmd, shim.Config{Argv: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Hold: true})
	if err != nil {
		t.Fatalf("shim.Wrap: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// startHeld starts cmd held by a shim (hold) in a scope prepared for it
// under id with limits, as the reactor does for a backend that places
// after start: hold, Prepare, Start, and the parent's copies of the
// child's ends closed. The caller calls Started, then releases or aborts
// the Handle. A Start that fails removes the scope and fails the test.
func startHeld(t *testing.T, b scope.Backend, id string, limits scope.Limits, cmd *exec.Cmd) (*shim.Handle, scope.Scope) {
	t.Helper()
	h := hold(t, cmd)
	sc, err := b.Prepare(context.Background(), scope.Spec{ID: id, Argv: cmd.Args, Limits: limits, Cmd: cmd})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	err = cmd.Start()
	h.CloseChildEnds()
	if err != nil {
		sc.Remove()
		t.Fatalf("Start: %v", err)
	}
	return h, sc
}

// startIn prepares a scope for argv, starts the command held, calls
// Started, then releases it. Cleanup kills the tree, reaps the child and
// removes the scope.
func startIn(t *testing.T, b scope.Backend, id string, limits scope.Limits, argv ...string) *child {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{childPath}
	c := &child{cmd: cmd, stdout: new(syncBuffer), stderr: new(syncBuffer), waited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	h, sc := startHeld(t, b, id, limits, cmd)
	c.sc = sc
	go func() { cmd.Wait(); close(c.waited) }()
	t.Cleanup(func() {
		sc.Kill()
		<-c.waited
		waitEmpty(t, sc, 10*time.Second)
		if err := sc.Remove(); err != nil {
			t.Errorf("cleanup: Remove: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := sc.Started(ctx, cmd.Process.Pid); err != nil {
		h.Abort()
		t.Fatalf("Started: %v", err)
	}
	if err := h.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return c
}

// wait reaps the main process within d.
func (c *child) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-c.waited:
	case <-time.After(d):
		t.Fatalf("main process still running after %v", d)
	}
}

func waitEmpty(t *testing.T, sc scope.Scope, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		empty, err := sc.Empty()
		if err != nil {
			t.Fatalf("Empty: %v", err)
		}
		if empty {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("scope %s not empty after %v", sc.Name(), d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unitProp reads a unit property with systemctl.
func unitProp(t *testing.T, unit, prop string) string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", "-P", prop, unit).Output()
	if err != nil {
		t.Fatalf("systemctl show %s %s: %v", prop, unit, err)
	}
	return strings.TrimSpace(string(out))
}

func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie is dead for our purpose.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func readPid(t *testing.T, file string, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		data, err := os.ReadFile(file)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s after %v", file, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func uniqueID(t *testing.T) string {
	return fmt.Sprintf("t%d-%s", time.Now().UnixNano()%1e9, strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-"))
}

func TestEscapedDescendantKilled(t *testing.T) {
	b, _ := newBackend(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The main process double-forks a setsid sleep and exits: a process
	// group kill would miss it; the scope must not.
	c := startIn(t, b, uniqueID(t), scope.Limits{},
		"sh", "-c", `(setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$1") ; exit 0`, "sh", pidFile)
	c.wait(t, 10*time.Second)
	sleepPid := readPid(t, pidFile, 5*time.Second)
	if !alive(sleepPid) {
		t.Fatal("the escaped sleep is not running; the test proves nothing")
	}
	cg, _ := os.ReadFile("/proc/" + strconv.Itoa(sleepPid) + "/cgroup")
	if !strings.Contains(string(cg), c.sc.Name()) {
		t.Errorf("escaped sleep's cgroups:\n%s\nwant them in %s", cg, c.sc.Name())
	}
	if empty, err := c.sc.Empty(); empty || err != nil {
		t.Fatalf("Empty = %v, %v while the sleep runs; want false", empty, err)
	}
	if got := unitProp(t, c.sc.Name(), "Slice"); got != scope.DefaultSlice {
		t.Errorf("Slice = %q, want %q", got, scope.DefaultSlice)
	}

	if err := c.sc.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitEmpty(t, c.sc, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for alive(sleepPid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(sleepPid) {
		t.Errorf("sleep %d survived Kill", sleepPid)
	}
	if err := c.sc.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if got := unitProp(t, c.sc.Name(), "LoadState"); got != "not-found" {
		t.Errorf("LoadState after Remove = %q, want not-found", got)
	}
	if err := c.sc.Remove(); err != nil {
		t.Errorf("second Remove = %v, want nil (idempotent)", err)
	}
}

func TestTasksMax(t *testing.T) {
	b, _ := newBackend(t)
	const max = 8
	c := startIn(t, b, uniqueID(t), scope.Limits{TasksMax: max},
		"sh", "-c", `for i in $(seq 1 40); do sleep 1000 >/dev/null 2>&1 & done`)
	if got := unitProp(t, c.sc.Name(), "TasksMax"); got != strconv.Itoa(max) {
		t.Errorf("unit TasksMax = %q, want %d", got, max)
	}
	// The shell gives up (dash exits) at the first fork the limit refuses.
	c.wait(t, 10*time.Second)
	if !strings.Contains(c.stderr.String(), "fork") {
		t.Errorf("stderr = %q, want a fork failure", c.stderr.String())
	}
	st, err := c.sc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Tasks > max || st.Tasks < max-2 {
		t.Errorf("Stats().Tasks = %d after forking 40 sleeps with TasksMax %d; want about %d", st.Tasks, max, max)
	}
	if st.TasksPeak > max {
		t.Errorf("Stats().TasksPeak = %d, want <= %d", st.TasksPeak, max)
	}
}

func TestMemoryMaxOOM(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		testenv.Skip(t, "perl not installed")
	}
	b, _ := newBackend(t)
	const limit = 64 << 20
	// perl asks for 256 MiB and is OOM-killed; the shell lives on so the
	// scope (and its counters) stay.
	c := startIn(t, b, uniqueID(t), scope.Limits{MemoryBytes: limit},
		"sh", "-c", `perl -e '$x = "a" x (256 << 20); print "survived\n"'; echo "rc=$?"; sleep 1000`)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(c.stdout.String(), "rc=") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if out := c.stdout.String(); out != "rc=137\n" {
		t.Fatalf("stdout = %q, want perl SIGKILLed (rc=137)", out)
	}
	st, err := c.sc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("Stats().OOMKills = %d, want >= 1", st.OOMKills)
	}
	if st.MemoryPeak <= 0 || st.MemoryPeak > limit+(1<<20) {
		t.Errorf("Stats().MemoryPeak = %d, want in (0, %d]", st.MemoryPeak, limit)
	}
}

// decidedStats reads sc's Stats once its OOM count is decided, as the
// reactor does at an exit: a lone v1 OOM notification read once the cgroup
// is gone waits (off Stats, scope.OOMSettler) for the removal's.
func decidedStats(t *testing.T, sc scope.Scope) scope.Stats {
	t.Helper()
	if s, ok := sc.(scope.OOMSettler); ok {
		if ch := s.OOMUndecided(); ch != nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatal("the OOM count is not decided after 10 s")
			}
		}
	}
	st, err := sc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// The OOM kill of the only process is counted although its cgroup is gone.
func TestOOMOfLastProcessCounted(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		testenv.Skip(t, "perl not installed")
	}
	b, _ := newBackend(t)
	// The OOM victim is the only process: the scope empties and systemd
	// removes its cgroup at once, usually before the main process is even
	// reaped. The kill must still be counted (it decides the outcome
	// memory_limit). Several rounds, since it is a race when done wrong.
	for i := range 3 {
		c := startIn(t, b, fmt.Sprintf("%s-%d", uniqueID(t), i), scope.Limits{MemoryBytes: 32 << 20},
			"perl", "-e", `$x = "a" x (256 << 20); print "survived\n"`)
		c.wait(t, 20*time.Second)
		ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: perl ended with %v, want SIGKILL by the OOM killer", i, c.cmd.ProcessState)
		}
		st := decidedStats(t, c.sc)
		if st.OOMKills < 1 {
			t.Errorf("round %d: Stats().OOMKills = %d after the only process was OOM-killed, want >= 1", i, st.OOMKills)
		}
	}
}

func TestTinyTasksMax(t *testing.T) {
	b, _ := newBackend(t)
	// A TasksMax below the held shim's thread count must not abort the
	// shim's runtime; the backend says it did not enforce it exactly.
	c := startIn(t, b, uniqueID(t), scope.Limits{TasksMax: 1}, "sh", "-c", "echo ok")
	c.wait(t, 10*time.Second)
	if code := c.cmd.ProcessState.ExitCode(); code != 0 || c.stdout.String() != "ok\n" {
		t.Errorf("exit %d, stdout %q, stderr %.200q; want 0, %q", code, c.stdout.String(), c.stderr.String(), "ok\n")
	}
	if un, ok := scope.Unenforced(c.sc); !ok || un.TasksMax != 1 {
		t.Errorf("Unenforced = %+v, %v; want TasksMax 1 reported", un, ok)
	}
}

func TestStatsCPUGrows(t *testing.T) {
	b, _ := newBackend(t)
	c := startIn(t, b, uniqueID(t), scope.Limits{}, "sh", "-c", `while :; do :; done`)
	first, err := c.sc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// Spinning, it gets 100ms of CPU within well under a second on an idle
	// host; a loaded one may give it less, so wait up to 10s for that.
	var second scope.Stats
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(100 * time.Millisecond)
		if second, err = c.sc.Stats(); err != nil {
			t.Fatal(err)
		}
		// The shim (this race-built test binary) may still be starting
		// on a loaded host, its runtime's threads counted and its CPU
		// too: wait until only sh is left and has spun.
		if second.CPUUsageNS-first.CPUUsageNS >= int64(100*time.Millisecond) && second.Tasks == 1 || time.Now().After(deadline) {
			break
		}
	}
	if grew := second.CPUUsageNS - first.CPUUsageNS; grew < int64(100*time.Millisecond) {
		t.Errorf("CPU usage grew by %v in 10 s of spinning (%d -> %d), want >= 100ms", time.Duration(grew), first.CPUUsageNS, second.CPUUsageNS)
	}
	if second.CPUUserNS <= 0 || second.CPUSystemNS < 0 {
		t.Errorf("CPUUserNS = %d, CPUSystemNS = %d; want known, user > 0", second.CPUUserNS, second.CPUSystemNS)
	}
	if second.Tasks != 1 {
		t.Errorf("Tasks = %d after up to 10 s, want 1 (the spinning sh)", second.Tasks)
	}
}

func TestCleanLeftovers(t *testing.T) {
	old, _ := newBackend(t)
	id := uniqueID(t)
	// A scope left behind by a "crashed daemon": created, never removed.
	cmd := exec.Command("sleep", "1000")
	cmd.Env = []string{childPath}
	h, sc := startHeld(t, old, id, scope.Limits{}, cmd)
	var waitErr error
	waited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(waited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-waited })
	if err := sc.Started(context.Background(), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	old.Close()

	fresh, _ := newBackend(t)
	names, err := fresh.(scope.LeftoverCleaner).CleanLeftovers(context.Background())
	if err != nil {
		t.Fatalf("CleanLeftovers: %v", err)
	}
	if !slices.Contains(names, sc.Name()) {
		t.Errorf("CleanLeftovers = %v, want it to include %s", names, sc.Name())
	}
	select {
	case <-waited:
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("leftover sleep ended with %v, want SIGKILL", waitErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("leftover sleep still running after CleanLeftovers")
	}
	if got := unitProp(t, sc.Name(), "LoadState"); got != "not-found" {
		t.Errorf("LoadState after CleanLeftovers = %q, want not-found", got)
	}
}

func TestKillWithoutDBus(t *testing.T) {
	b, d := newBackend(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	c := startIn(t, b, uniqueID(t), scope.Limits{},
		"sh", "-c", `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$1"; sleep 1000`, "sh", pidFile)
	sleepPid := readPid(t, pidFile, 5*time.Second)

	// Break the connection underneath the backend and make reconnecting
	// impossible: Kill must still work, through the cgroup.
	d.down.Store(true)
	d.closeAll()
	start := time.Now()
	if err := c.sc.Kill(); err != nil {
		t.Fatalf("Kill with D-Bus down: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Kill with D-Bus down took %v", took)
	}
	c.wait(t, 10*time.Second)
	waitEmpty(t, c.sc, 10*time.Second)
	if alive(sleepPid) {
		t.Errorf("setsid sleep %d survived Kill", sleepPid)
	}

	// D-Bus back: the next call reconnects.
	d.down.Store(false)
	dials := d.dials.Load()
	if err := c.sc.Remove(); err != nil {
		t.Fatalf("Remove after D-Bus came back: %v", err)
	}
	if d.dials.Load() <= dials {
		t.Error("Remove did not reconnect")
	}
	if got := unitProp(t, c.sc.Name(), "LoadState"); got != "not-found" {
		t.Errorf("LoadState after Remove = %q, want not-found", got)
	}
}

func TestSignalWithoutDBus(t *testing.T) {
	b, d := newBackend(t)
	c := startIn(t, b, uniqueID(t), scope.Limits{}, "sleep", "1000")
	d.down.Store(true)
	d.closeAll()
	if err := c.sc.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal with D-Bus down: %v", err)
	}
	c.wait(t, 10*time.Second)
	if ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGTERM {
		t.Errorf("sleep ended with %v, want SIGTERM", c.cmd.ProcessState)
	}
	d.down.Store(false) // let the cleanup's Remove reach systemd
}

func TestReactorShimExecError(t *testing.T) {
	b, _ := newBackend(t)
	// The reactor wraps the command itself (to pass user, network, rlimit
	// settings), holds it while the backend places it, and releases it.
	cmd := exec.Command("corral-no-such-command")
	cmd.Env = []string{childPath}
	h, sc := startHeld(t, b, uniqueID(t), scope.Limits{}, cmd)
	if err := sc.Started(context.Background(), cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("Started: %v", err)
	}
	if err := h.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	report, err := h.WaitExec(10 * time.Second)
	cmd.Wait()
	if err != nil || report == nil || report.Errno != "ENOENT" {
		t.Errorf("WaitExec = %+v, %v; want an ENOENT report", report, err)
	}
	if code := cmd.ProcessState.ExitCode(); code != shim.ExitNotFound {
		t.Errorf("exit = %d, want %d", code, shim.ExitNotFound)
	}
	waitEmpty(t, sc, 10*time.Second)
	if err := sc.Remove(); err != nil {
		t.Errorf("Remove: %v", err)
	}
}

func TestHeldUntilScopeExists(t *testing.T) {
	b, _ := newBackend(t)
	// The command reports its own cgroup: it must already be the scope's
	// when the command's first instruction runs.
	c := startIn(t, b, uniqueID(t), scope.Limits{}, "cat", "/proc/self/cgroup")
	c.wait(t, 10*time.Second)
	for _, line := range strings.Split(strings.TrimSpace(c.stdout.String()), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			t.Fatalf("bad /proc/self/cgroup line %q", line)
		}
		ctrl, path := f[1], f[2]
		// The hierarchies the backend reads hold the process in the scope
		// (v1 controllers systemd does not manage for us stay elsewhere).
		if slices.Contains([]string{"", "name=systemd", "memory", "pids"}, ctrl) &&
			!strings.HasSuffix(path, "/"+c.sc.Name()) {
			t.Errorf("command started in %s (%q), want %s", path, ctrl, c.sc.Name())
		}
	}
}

func TestKillBeforeStarted(t *testing.T) {
	b, _ := newBackend(t)
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := exec.Command("touch", marker)
	cmd.Env = []string{childPath}
	h, sc := startHeld(t, b, uniqueID(t), scope.Limits{}, cmd)
	if err := sc.Kill(); err != nil {
		t.Errorf("Kill before Started: %v", err)
	}
	if err := sc.Started(context.Background(), cmd.Process.Pid); err == nil {
		t.Error("Started after Kill succeeded, want an error")
	}
	// Started failed: the holder aborts, and the child runs nothing.
	h.Abort()
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != shim.ExitParentGone {
		t.Errorf("exit = %d, want %d", code, shim.ExitParentGone)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran although it was killed while held")
	}
	if err := sc.Remove(); err != nil {
		t.Errorf("Remove: %v", err)
	}
}

// TestSetLimitsOOMCounted: a pool scope is created without limits and gets
// the request's memory limit from SetLimits, which must then register the
// v1 OOM notification itself (hybrid host) so that the OOM kill of the
// only process is counted although its cgroup is gone by the time Stats is
// asked; and Remove must close that registration's eventfd.
func TestSetLimitsOOMCounted(t *testing.T) {
	if _, err := exec.LookPath("perl"); err != nil {
		testenv.Skip(t, "perl not installed")
	}
	b, _ := newBackend(t)
	fds := testenv.Measure()
	for i := range 3 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			goFile := filepath.Join(t.TempDir(), "go")
			c := startIn(t, b, uniqueID(t), scope.Limits{},
				"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.01; done; exec perl -e '$x = "a" x (256 << 20); print "survived\n"'`, goFile)
			lim, ok := c.sc.(scope.Limiter)
			if !ok {
				t.Fatalf("systemd scope %T is not a scope.Limiter", c.sc)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := lim.SetLimits(ctx, scope.Limits{MemoryBytes: 32 << 20}); err != nil {
				t.Fatalf("SetLimits: %v", err)
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			c.wait(t, 20*time.Second)
			ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("perl ended with %v (stdout %q), want SIGKILL by the OOM killer under the limit SetLimits set", c.cmd.ProcessState, c.stdout.String())
			}
			st := decidedStats(t, c.sc)
			if st.OOMKills < 1 {
				t.Errorf("Stats().OOMKills = %d after the only process was OOM-killed under a SetLimits memory limit, want >= 1", st.OOMKills)
			}
		})
	}
	// The subtests' cleanups removed their scopes.
	if err := fds.CheckFDs(10 * time.Second); err != nil {
		t.Errorf("after Remove of scopes limited by SetLimits: %v", err)
	}
}
