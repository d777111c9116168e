// Package systemd runs corrald as a real systemd service, socket-activated,
// inside a private systemd booted by tests/harness, and checks what agent
// hosts rely on: every execution in its own transient scope, trees killed
// whole, limits, the journal audit trail, and recovery after a crash.
package systemd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/harness"
)

const (
	socket   = "/run/corral/corrald.sock"
	stateDir = "/run/corral-state" // tmpfs inside the harness
)

func TestMain(m *testing.M) {
	// The test binary doubles as a child program.
	switch os.Getenv("CORRAL_TEST_HELPER") {
	case "spin4": // four threads spinning until killed
		runtime.GOMAXPROCS(4)
		for i := 0; i < 4; i++ {
			go func() {
				//lint:ignore SA5002 this helper exists to spin a CPU until killed
				for {
				}
			}()
		}
		select {}
	case "":
	default:
		os.Exit(99)
	}
	// corral-shim next to corrald, as make install puts it: the service
	// starts its children through it.
	os.Exit(harness.RunInsideWithBinaries(m, "corrald", "corral-shim"))
}

var setupOnce sync.Once

// setup installs corrald's real units (deploy/), with ExecStart pointing at
// the binary under test and the state in a tmpfs, and starts the socket.
func setup(t *testing.T) {
	t.Helper()
	harness.Require(t)
	setupOnce.Do(func() {
		harness.Corrald{StateDir: stateDir, Args: []string{"--log-level", "debug", "--kill-wait", "3s"}}.Install(t, "corrald.socket")
	})
}

func client(t *testing.T) *ipc.Client {
	t.Helper()
	c, err := ipc.Dial(socket)
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func runTo(t *testing.T, c *ipc.Client, p api.StartParams) api.Record {
	t.Helper()
	rec, err := c.Start(context.Background(), p)
	if err != nil {
		t.Fatalf("exec.start %v: %v", p.Argv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
	if err != nil || rec.State != api.StateCleaned {
		t.Fatalf("exec.wait %s: %v (state %v)", rec.ID, err, rec.State)
	}
	return rec
}

func outcome(r api.Record) string {
	if r.Outcome == nil {
		return ""
	}
	return string(*r.Outcome)
}

func stdout(t *testing.T, c *ipc.Client, id string) string {
	t.Helper()
	out, err := c.Output(context.Background(), api.OutputParams{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return string(out.Data)
}

// unitGone reports whether systemd no longer knows the unit.
func unitGone(unit string) bool {
	out, _ := exec.Command("systemctl", "show", "-p", "LoadState", "--value", unit).Output()
	return strings.TrimSpace(string(out)) == "not-found"
}

func waitGone(t *testing.T, what string, gone func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone() {
		if time.Now().After(deadline) {
			t.Fatalf("%s still there", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitPidGone fails the test, and kills pid, unless pid is gone within 10s.
// At cleaned the scope is empty, but an orphaned descendant that the kill
// ended may still be a zombie until corrald, its subreaper, reaps it on
// SIGCHLD a moment later.
func waitPidGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !pidGone(pid)() {
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Errorf("%s %d still exists 10s after cleaned: %s", what, pid, stat)
			syscallKill(pid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pidGone(pid int) func() bool {
	return func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return os.IsNotExist(err)
	}
}

func TestSocketActivationAndInfo(t *testing.T) {
	setup(t)
	info, err := client(t).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Backend != "systemd" || !info.Pidfd || info.Store != "ok" {
		t.Errorf("daemon.info = backend %q pidfd %v store %q; want systemd, true, ok", info.Backend, info.Pidfd, info.Store)
	}
	if got := harness.Sh(t, "systemctl", "is-active", "corrald.service"); got != "active" {
		t.Errorf("corrald.service is %q after the first connection, want active", got)
	}
	if got := harness.Sh(t, "systemctl", "show", "-p", "StatusText", "--value", "corrald.service"); got == "" {
		// STATUS= comes every 5 s; READY=1 made it active already.
		t.Log("no STATUS= yet")
	}
}

func TestEachExecutionInItsOwnScope(t *testing.T) {
	setup(t)
	c := client(t)
	rec := runTo(t, c, api.StartParams{Argv: []string{"cat", "/proc/self/cgroup"}})
	// corral-<id>.scope, or corral-pool-<uuid>.scope when a warm-pool shim
	// took the command: a scope of its own either way.
	unit := rec.Scope
	if !strings.HasPrefix(unit, "corral-") || !strings.HasSuffix(unit, ".scope") {
		t.Errorf("scope = %q, want a corral-*.scope unit", unit)
	}
	if out := stdout(t, c, rec.ID); !strings.Contains(out, "/corral.slice/"+unit) {
		t.Errorf("child's cgroup %q is not in %s", out, unit)
	}
	waitGone(t, unit, func() bool { return unitGone(unit) })
}

// A child that double-forks a sleep into a new session: nothing is left
// and the scope is gone — when the child exits, at timeout and at cancel.
func TestEscapedDescendantsKilled(t *testing.T) {
	setup(t)
	c := client(t)
	for _, tc := range []struct {
		name   string
		script string
		p      api.StartParams
		cancel bool
		want   string
	}{
		{"exits", `setsid sh -c 'sleep 1000 & echo $!'; exit 0`, api.StartParams{}, false, "exited"},
		{"timeout", `setsid sh -c 'sleep 1000 & echo $!'; sleep 1000`, api.StartParams{TimeoutMS: 2000, GraceMS: 200}, false, "timeout"},
		{"cancel", `setsid sh -c 'sleep 1000 & echo $!'; sleep 1000`, api.StartParams{}, true, "cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			p.Argv = []string{"sh", "-c", tc.script}
			rec, err := c.Start(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			// The escaped sleep's pid, once printed.
			var pid int
			deadline := time.Now().Add(5 * time.Second)
			for pid == 0 && time.Now().Before(deadline) {
				pid, _ = strconv.Atoi(strings.TrimSpace(stdout(t, c, rec.ID)))
				time.Sleep(20 * time.Millisecond)
			}
			if pid == 0 {
				t.Fatal("child never printed the escaped pid")
			}
			if tc.cancel {
				if _, err := c.Cancel(context.Background(), api.CancelParams{ID: rec.ID}); err != nil {
					t.Fatal(err)
				}
			}
			rec, err = c.Wait(context.Background(), api.WaitParams{ID: rec.ID})
			if err != nil || rec.State != api.StateCleaned {
				t.Fatalf("wait: %v %v", rec.State, err)
			}
			if outcome(rec) != tc.want {
				t.Errorf("outcome = %s, want %s", outcome(rec), tc.want)
			}
			waitPidGone(t, "escaped sleep", pid)
			if !unitGone(rec.Scope) {
				t.Errorf("%s still loaded after cleaned", rec.Scope)
			}
		})
	}
}

func syscallKill(pid int) { exec.Command("kill", "-9", strconv.Itoa(pid)).Run() }

// The limits hold the same way whether the command runs on pipes or on a
// terminal (tty: true, its stderr is the terminal too, read as stdout).
func TestForkBombStopsAtTasksMax(t *testing.T) {
	setup(t)
	for _, tty := range []bool{false, true} {
		t.Run(map[bool]string{false: "pipes", true: "terminal"}[tty], func(t *testing.T) {
			c := client(t)
			rec := runTo(t, c, api.StartParams{
				Argv:      []string{"sh", "-c", `i=0; while [ $i -lt 400 ]; do sleep 1000 & i=$((i+1)); done; echo spawned; sleep 1000`},
				TasksMax:  32,
				TimeoutMS: 4000, GraceMS: 200,
				TTY: tty,
			})
			// The shell may give up when fork fails (exited) or keep looping until
			// the timeout; either way the tree must end whole.
			if o := outcome(rec); o != "timeout" && o != "exited" {
				t.Errorf("outcome = %s, want timeout or exited (error %v)", o, rec.Error)
			}
			if rec.Usage.TasksPeak > 32 || rec.Usage.TasksPeak < 2 {
				t.Errorf("tasks_peak = %d, want 2..32", rec.Usage.TasksPeak)
			}
			stream := "stderr"
			if tty {
				stream = "stdout"
			}
			errOut, _ := c.Output(context.Background(), api.OutputParams{ID: rec.ID, Stream: stream})
			if !strings.Contains(strings.ToLower(string(errOut.Data)), "fork") && !strings.Contains(string(errOut.Data), "Resource temporarily unavailable") {
				t.Errorf("%s %q shows no failed fork", stream, errOut.Data)
			}
			if out, _ := exec.Command("pgrep", "-x", "-f", "sleep 1000").Output(); len(out) > 0 {
				t.Errorf("sleeps left after the fork bomb was killed: %s", out)
			}
			if !unitGone(rec.Scope) {
				t.Errorf("%s still loaded", rec.Scope)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	setup(t)
	for _, tty := range []bool{false, true} {
		t.Run(map[bool]string{false: "pipes", true: "terminal"}[tty], func(t *testing.T) {
			c := client(t)
			rec := runTo(t, c, api.StartParams{
				Argv:        []string{"python3", "-c", "b = bytearray(512 << 20); print(len(b))"},
				MemoryBytes: 64 << 20,
				TimeoutMS:   20000,
				TTY:         tty,
			})
			if outcome(rec) != "memory_limit" {
				t.Errorf("outcome = %s (signal %v, exit %v, error %v), want memory_limit", outcome(rec), rec.Signal, rec.ExitCode, rec.Error)
			}
			if rec.TTY != tty {
				t.Errorf("record tty = %v, want %v", rec.TTY, tty)
			}
		})
	}
}

// TestCPULimitCatchesThreads: cpu_ms counts the CPU time of every thread of
// the tree (four spinning threads, the main one idle), and the sampler ends
// the tree soon after the tree used it up.
//
// Nothing here is timed against the wall clock: on a busy host the four
// threads get only a share of the two cores (at load average 15-30 here
// the 1 s of CPU took 1.6-3.1 s of wall time), so the 4 s bound on the
// duration this test had failed at load average 20+ while corral did its
// job. The wall limit is far enough away (30 s: 1 s of CPU needs only a
// thirtieth of a core) that it cannot end the tree first unless cpu_ms is
// not enforced; what is checked is the CPU the tree used, which load does
// not raise.
func TestCPULimitCatchesThreads(t *testing.T) {
	setup(t)
	c := client(t)
	exe, _ := os.Executable()
	const cpuMS = 1000
	rec := runTo(t, c, api.StartParams{
		Argv:  []string{exe},
		Env:   map[string]string{"CORRAL_TEST_HELPER": "spin4"},
		CPUMS: cpuMS, TimeoutMS: 30000,
	})
	used := rec.Usage.CPUUserMS + rec.Usage.CPUSystemMS
	t.Logf("outcome %s after %d ms, %d ms of CPU (user %d, system %d)", outcome(rec), rec.DurationMS, used, rec.Usage.CPUUserMS, rec.Usage.CPUSystemMS)
	// Counting only the main thread, it would run into the 30 s timeout.
	if outcome(rec) != "cpu_limit" {
		var errText string
		if rec.Error != nil {
			errText = *rec.Error
		}
		t.Errorf("outcome = %s (error %q), want cpu_limit", outcome(rec), errText)
	}
	// The record's user and system ms are each rounded down: together they
	// may show 1 ms less than the cgroup's usage that reached cpu_ms.
	if used < cpuMS-1 {
		t.Errorf("cpu used %d ms, want >= cpu_ms %d", used, cpuMS)
	}
	// The sampler reads the cgroup every 100 ms (corrald's default
	// --sample-interval) and kills the tree at the first reading at or past
	// cpu_ms: four threads can use at most 400 ms more by then, less on a
	// busy host. The RLIMIT_CPU backstop alone (hard limit cpu_ms+1 s; the
	// Go helper ignores the soft limit's SIGXCPU) also ends it as
	// cpu_limit, but only at 2 s, shown as 1.6 s or more; counting one
	// thread of the four would let it use 4x.
	if limit := int64(cpuMS + 500); used > limit {
		t.Errorf("cpu used %d ms, want <= %d: the sampler did not end the tree soon after cpu_ms %d", used, limit, cpuMS)
	}
}

type journalEntry map[string]any

func journal(t *testing.T, id string) []journalEntry {
	t.Helper()
	out, err := exec.Command("journalctl", "-u", "corrald", "EXEC_ID="+id, "-o", "json", "--no-pager").Output()
	if err != nil {
		t.Fatalf("journalctl: %v", err)
	}
	var entries []journalEntry
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var e journalEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("journal line %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	return entries
}

func TestJournalAuditTrail(t *testing.T) {
	setup(t)
	c := client(t)
	rec := runTo(t, c, api.StartParams{Argv: []string{"sh", "-c", "exit 4"}, Labels: map[string]string{"tool_call": "t-42"}})
	var events []string
	deadline := time.Now().Add(10 * time.Second)
	var entries []journalEntry
	for time.Now().Before(deadline) {
		entries = journal(t, rec.ID)
		if len(entries) >= 4 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	byEvent := map[string]journalEntry{}
	for _, e := range entries {
		ev, _ := e["EVENT"].(string)
		events = append(events, ev)
		byEvent[ev] = e
	}
	for _, want := range []string{"started", "running", "exited", "cleaned"} {
		e, ok := byEvent[want]
		if !ok {
			t.Errorf("no %s entry for %s (events %v)", want, rec.ID, events)
			continue
		}
		if e["OWNER_UID"] != "0" || e["LABEL_TOOL_CALL"] != "t-42" {
			t.Errorf("%s entry: OWNER_UID %v LABEL_TOOL_CALL %v", want, e["OWNER_UID"], e["LABEL_TOOL_CALL"])
		}
	}
	if e := byEvent["started"]; e != nil && !strings.Contains(fmt.Sprint(e["ARGV"]), "exit 4") {
		t.Errorf("started entry ARGV = %v", e["ARGV"])
	}
	if e := byEvent["exited"]; e != nil && (e["OUTCOME"] != "exited" || e["EXIT_CODE"] != "4" || e["SCOPE"] != rec.Scope) {
		t.Errorf("exited entry: OUTCOME %v EXIT_CODE %v SCOPE %v", e["OUTCOME"], e["EXIT_CODE"], e["SCOPE"])
	}
}

// The journal trail of a terminal execution with an idle limit and a moved
// deadline: started has TTY, TTY_SIZE and IDLE_TIMEOUT_MS, running has
// DEADLINE, exec.update logs EVENT=updated with the new DEADLINE.
func TestJournalTerminalAndDeadline(t *testing.T) {
	setup(t)
	c := client(t)
	rec, err := c.Start(context.Background(), api.StartParams{Argv: []string{"sh", "-c", "sleep 0.5"}, TTY: true,
		TTYSize: &api.TTYSize{Rows: 33, Cols: 99}, IdleTimeoutMS: 20000, TimeoutMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	ms := int64(25000)
	up, err := c.Update(context.Background(), api.UpdateParams{ID: rec.ID, TimeoutMS: &ms})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(context.Background(), api.WaitParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
	byEvent := map[string]journalEntry{}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range journal(t, rec.ID) {
			ev, _ := e["EVENT"].(string)
			byEvent[ev] = e
		}
		if byEvent["cleaned"] != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if e := byEvent["started"]; e == nil || e["TTY"] != "true" || e["TTY_SIZE"] != "33x99" || e["IDLE_TIMEOUT_MS"] != "20000" {
		t.Errorf("started entry = %v, want TTY=true TTY_SIZE=33x99 IDLE_TIMEOUT_MS=20000", e)
	}
	if e := byEvent["running"]; e == nil || e["DEADLINE"] == nil || e["DEADLINE"] == "" {
		t.Errorf("running entry = %v, want a DEADLINE", e)
	}
	e := byEvent["updated"]
	if e == nil {
		t.Fatalf("no updated entry (events %v)", byEvent)
	}
	got, err := time.Parse(time.RFC3339Nano, fmt.Sprint(e["DEADLINE"]))
	if err != nil || got.Sub(*up.Deadline).Abs() > time.Second {
		t.Errorf("updated entry DEADLINE = %v (%v), want %v", e["DEADLINE"], err, up.Deadline)
	}
}

// corrald killed -9 mid-run: systemd restarts it and the fd store brings
// the execution back, in its scope (issue 9); ending it then removes the
// scope and the tree. (Lost executions' scopes: tests/durability and
// tests/survival.)
func TestLeftoverScopeAfterCrash(t *testing.T) {
	setup(t)
	c := client(t)
	rec, err := c.Start(context.Background(), api.StartParams{Argv: []string{"sh", "-c", "echo $$; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 100 && pid == 0; i++ {
		pid, _ = strconv.Atoi(strings.TrimSpace(stdout(t, c, rec.ID)))
		time.Sleep(20 * time.Millisecond)
	}
	c.Close()
	harness.Sh(t, "systemctl", "kill", "--kill-who=main", "--signal=SIGKILL", "corrald.service")
	waitGone(t, "corrald after SIGKILL", func() bool {
		out, _ := exec.Command("systemctl", "is-active", "corrald.service").Output()
		return strings.TrimSpace(string(out)) != "active"
	})
	if unitGone(rec.Scope) {
		t.Fatalf("%s vanished with the daemon; the test needs it left behind", rec.Scope)
	}
	// Restart=on-failure or the next connection brings corrald back.
	var c2 *ipc.Client
	deadline := time.Now().Add(15 * time.Second)
	for c2 == nil {
		if cc, err := ipc.Dial(socket); err == nil {
			if _, err := cc.Info(context.Background()); err == nil {
				c2 = cc
				break
			}
			cc.Close()
		}
		if time.Now().After(deadline) {
			t.Fatal("corrald did not come back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c2.Close()
	// The fd store brought the execution back (issue 9): adopted and still
	// running in its scope; ending it now removes the scope and the tree.
	got, err := c2.Get(context.Background(), rec.ID)
	if err != nil {
		t.Fatalf("exec.get after restart: %v", err)
	}
	if got.State != api.StateRunning || got.Adopted != 1 || unitGone(rec.Scope) {
		t.Fatalf("after restart: state %v adopted %d scope gone %v, want running, adopted 1, in its scope", got.State, got.Adopted, unitGone(rec.Scope))
	}
	if _, err := c2.Cancel(context.Background(), api.CancelParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err = c2.Wait(ctx, api.WaitParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, rec.Scope, func() bool { return unitGone(rec.Scope) })
	if pid != 0 {
		waitPidGone(t, "the crashed run's sleep", pid)
	}
	if got.State != api.StateCleaned || outcome(got) != "cancelled" {
		t.Errorf("adopted then cancelled: state %v outcome %s, want cleaned, cancelled", got.State, outcome(got))
	}
}

// Losing the D-Bus connection mid-run must not keep a timeout from killing
// the tree: daemon-reexec drops every private-socket connection.
func TestTimeoutKillsWithDBusGone(t *testing.T) {
	setup(t)
	c := client(t)
	rec, err := c.Start(context.Background(), api.StartParams{
		Argv:      []string{"sh", "-c", `trap "" TERM; setsid sh -c 'sleep 1000 & echo $!'; sleep 1000`},
		TimeoutMS: 1500, GraceMS: 300,
	})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 100 && pid == 0; i++ {
		pid, _ = strconv.Atoi(strings.TrimSpace(stdout(t, c, rec.ID)))
		time.Sleep(20 * time.Millisecond)
	}
	harness.Sh(t, "systemctl", "daemon-reexec")
	rec, err = c.Wait(context.Background(), api.WaitParams{ID: rec.ID})
	if err != nil {
		t.Fatal(err)
	}
	if outcome(rec) != "timeout" {
		t.Errorf("outcome = %s, want timeout", outcome(rec))
	}
	if pid != 0 {
		waitPidGone(t, "escaped sleep (timeout with D-Bus gone)", pid)
	}
	// And the daemon reconnected: a new execution gets its scope.
	again := runTo(t, c, api.StartParams{Argv: []string{"true"}})
	if outcome(again) != "exited" || again.Scope == "" {
		t.Errorf("after reconnect: outcome %s scope %q", outcome(again), again.Scope)
	}
}

// TestJournaldStalledDoesNotStallCorrald: corrald logs to the journal, and
// a journald that does not read (here stopped; under heavy load, slow) must
// not stall it. Its socket takes 512 entries; the per-connection debug
// lines of a few thousand connections fill it. Before the journal writer
// queued (systemd.JournalWriter), every log call then waited for journald,
// the loop's included: exec.start went unanswered and systemd killed
// corrald for its watchdog. The entries that did not fit are counted in
// the journal once journald reads again.
func TestJournaldStalledDoesNotStallCorrald(t *testing.T) {
	setup(t)
	c := client(t)
	if _, err := c.Info(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarts := func() string {
		return strings.TrimSpace(harness.Sh(t, "systemctl", "show", "-p", "NRestarts", "--value", "corrald.service"))
	}
	before := restarts()
	cont := func() { _ = exec.Command("systemctl", "kill", "--signal=SIGCONT", "systemd-journald.service").Run() }
	t.Cleanup(cont)
	if out, err := exec.Command("systemctl", "kill", "--signal=SIGSTOP", "systemd-journald.service").CombinedOutput(); err != nil {
		t.Fatalf("stop journald: %v\n%s", err, out)
	}
	// 3 debug lines each: more than the socket and corrald's queue hold.
	t0 := time.Now()
	for i := 0; i < 4000; i++ {
		if conn, err := net.Dial("unix", socket); err == nil {
			conn.Close()
		}
	}
	// Less than WatchdogSec (10 s): a wedged corrald is not restarted
	// before this gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"sh", "-c", "exit 3"}})
	if err != nil {
		t.Fatalf("exec.start with journald stopped: %v", err)
	}
	if rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID}); err != nil || rec.State != api.StateCleaned || outcome(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != 3 {
		t.Fatalf("exec.wait with journald stopped: %v (state %v, outcome %s)", err, rec.State, outcome(rec))
	}
	t.Logf("4000 connections, then exec.start and exec.wait answered, with journald stopped: %v", time.Since(t0))
	cont()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := exec.Command("journalctl", "-u", "corrald", "-o", "cat", "--no-pager", "--since", "-2min").Output()
		if strings.Contains(string(out), "log entries dropped: the journal did not take them in time") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no entry in the journal counts the entries dropped while journald was stopped")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if after := restarts(); after != before {
		t.Errorf("corrald was restarted while journald was stopped (NRestarts %s, was %s)", after, before)
	}
}
