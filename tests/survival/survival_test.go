// Package survival checks that no running execution dies with corrald
// (issue 9): corrald runs as the real systemd service (deploy/ units)
// inside a private systemd booted by tests/harness; it is killed with
// SIGKILL and restarted by systemd (the fd store), reloaded (the handover),
// and handed over to a binary that fails; every execution must end with
// its real outcome.
package survival

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/harness"
	"github.com/corral-dev/corral/tests/testd"
)

const (
	socket   = "/run/corral/corrald.sock"
	stateDir = "/run/corral-state" // tmpfs inside the harness
	countDir = "/run/corral-counts"
	helper   = "CORRAL_TEST_HELPER"
)

func TestMain(m *testing.M) {
	// The test binary doubles as the writer the executions run.
	switch os.Getenv(helper) {
	case "writer":
		os.Exit(writer())
	case "":
	default:
		os.Exit(99)
	}
	os.Exit(harness.RunInsideWithBinaries(m, "corrald", "corral-shim"))
}

// writer writes for WRITER_MS milliseconds and until the file WRITER_UNTIL
// exists, as fast as the pipe takes it, lines "<n>\n" numbered from 0 (so a
// reader can tell a byte lost or read twice), then writes how many bytes it
// wrote to WRITER_COUNT and exits 0. WRITER_PACE_US sleeps between lines.
func writer() int {
	ms, _ := strconv.Atoi(os.Getenv("WRITER_MS"))
	pace, _ := strconv.Atoi(os.Getenv("WRITER_PACE_US"))
	until := os.Getenv("WRITER_UNTIL")
	end := time.Now().Add(time.Duration(ms) * time.Millisecond)
	var looked time.Time
	more := func() bool {
		now := time.Now()
		if now.Before(end) || until == "" {
			return now.Before(end)
		}
		if now.Sub(looked) < 10*time.Millisecond {
			return true
		}
		looked = now
		_, err := os.Stat(until)
		return err != nil
	}
	var total int64
	buf := make([]byte, 0, 64<<10)
	for n := 0; more(); {
		buf = buf[:0]
		for len(buf) < 32<<10 {
			buf = strconv.AppendInt(buf, int64(n), 10)
			buf = append(buf, '\n')
			n++
			if pace > 0 {
				break
			}
		}
		w, err := os.Stdout.Write(buf)
		total += int64(w)
		if err != nil {
			break
		}
		if pace > 0 {
			time.Sleep(time.Duration(pace) * time.Microsecond)
		}
	}
	if err := os.WriteFile(os.Getenv("WRITER_COUNT"), []byte(strconv.FormatInt(total, 10)), 0o644); err != nil {
		return 2
	}
	return 0
}

var setupOnce sync.Once

// setup installs corrald's real units (deploy/) with ExecStart pointing at
// a copy of the binary under test (so a test may replace it), the state in
// a tmpfs, and starts the socket and the service.
func setup(t *testing.T) {
	t.Helper()
	harness.Require(t)
	t.Cleanup(func() {
		// SURVIVAL_JOURNAL=<host path>: where a failing test leaves the
		// whole journal of corrald.
		if p := os.Getenv("SURVIVAL_JOURNAL"); p != "" && t.Failed() {
			out, _ := exec.Command("journalctl", "-u", "corrald", "-o", "short-precise", "--no-pager").CombinedOutput()
			os.WriteFile(harness.InsidePath(p), out, 0o644)
		}
	})
	setupOnce.Do(func() {
		os.MkdirAll(countDir, 0o777)
		corrald().Install(t, "corrald.socket", "corrald.service")
	})
}

// corrald is corrald.service as these tests run it, with extra flags: a
// debug log, --kill-wait 3s, the writers' counts writable.
func corrald(flags ...string) harness.Corrald {
	return harness.Corrald{StateDir: stateDir, ReadWritePaths: []string{countDir},
		Args: append([]string{"--log-level", "debug", "--kill-wait", "3s"}, flags...)}
}

// runAs restarts corrald.service as c, and with WatchdogSec=watchdogSec
// (a drop-in) unless that is "", for the rest of the test: its cleanup
// puts back corrald() without the watchdog's drop-in, restarts the
// service and waits until it answers.
func runAs(t *testing.T, c harness.Corrald, watchdogSec string) {
	t.Helper()
	c.WriteDropIn(t)
	conf := filepath.Join(os.Getenv(harness.EnvUnitDir), "corrald.service.d", "watchdog.conf")
	if watchdogSec != "" {
		if err := os.WriteFile(conf, []byte("[Service]\nWatchdogSec="+watchdogSec+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		os.Remove(conf)
		corrald().WriteDropIn(t)
		harness.Sh(t, "systemctl", "daemon-reload")
		harness.Sh(t, "systemctl", "restart", "corrald.service")
		dial(t)
	})
	harness.Sh(t, "systemctl", "daemon-reload")
	harness.Sh(t, "systemctl", "restart", "corrald.service")
}

func prop(t *testing.T, p string) string {
	return harness.Sh(t, "systemctl", "show", "-p", p, "--value", "corrald.service")
}

func mainPID(t *testing.T) int {
	n, _ := strconv.Atoi(prop(t, "MainPID"))
	return n
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return c
}

// dial connects, retrying for up to 30s (corrald may be restarting).
func dial(t *testing.T) *ipc.Client {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := ipc.Dial(socket)
		if err == nil {
			if _, err = c.Info(ctx(t)); err == nil {
				t.Cleanup(func() { c.Close() })
				return c
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald does not answer on %s: %v\n%s", socket, err, journalTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// journalTail is what a failing test shows of corrald: systemd's view of
// the service (ExecReload says whether and when a reload's kill -HUP ran)
// and the last 60 entries of its journal at level info or above, each with
// its fields (EVENT, ERROR, EXEC_ID, ...). The debug lines are left out:
// the dial loops (testd.DialLoop) write thousands of them, and when a
// reload did not hand over (ci1 at 7205676) the last 60 lines held nothing
// else, not the handover's own lines that said why.
func journalTail() string {
	var b strings.Builder
	out, _ := exec.Command("systemctl", "show", "-p", "ActiveState,SubState,Result,MainPID,NRestarts,ExecMainStartTimestamp,ExecReload", "corrald.service").CombinedOutput()
	b.WriteString("systemctl show corrald.service:\n")
	b.Write(out)
	b.WriteString("corrald's journal, the last 60 entries at level info or above:\n")
	out, _ = exec.Command("journalctl", "-u", "corrald", "-p", "info", "-n", "60", "--no-pager", "-o", "json").Output()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) != nil {
			continue
		}
		line, _ := e["MESSAGE"].(string)
		if us, err := strconv.ParseInt(fmt.Sprint(e["__REALTIME_TIMESTAMP"]), 10, 64); err == nil {
			line = time.UnixMicro(us).UTC().Format("15:04:05.000000") + " " + line
		}
		var fields []string
		for k, v := range e {
			if k == "MESSAGE" || k == "JSON" || k == "PRIORITY" || k == "INVOCATION_ID" || k == "COMPONENT" ||
				strings.HasPrefix(k, "_") || strings.HasPrefix(k, "SYSLOG_") || strings.HasPrefix(k, "CODE_") {
				continue
			}
			fields = append(fields, fmt.Sprintf("%s=%v", k, v))
		}
		slices.Sort(fields)
		b.WriteString(strings.Join(append([]string{line}, fields...), " ") + "\n")
	}
	return b.String()
}

func outcome(r api.Record) string {
	if r.Outcome == nil {
		return ""
	}
	return string(*r.Outcome)
}

func strOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// load is the 20 executions of "What it must show".
type load struct {
	writers []string // ids; each counts its own bytes in countDir/<id>
	// stop is the file whose creation ends the writers (after writeMS):
	// check creates it, so they run across the restart whatever the load.
	stop     string
	seq      string // a paced writer whose every byte is kept (the follower's)
	sleepers []string
	stdin    string
	timeout  string
	exit7    string
	pids     map[string]int
	units    map[string]string
}

// startLoad starts the 20: 6 fast writers and a paced one for writeMS and
// until check, 10 sleepers of sleepMS, cat with stdin open, a sleep whose
// timeout is timeoutMS, and one that exits 7 after exit7MS.
func startLoad(t *testing.T, c *ipc.Client, writeMS, sleepMS, timeoutMS, exit7MS int) *load {
	t.Helper()
	exe, _ := os.Executable()
	l := &load{pids: map[string]int{}, units: map[string]string{},
		stop: fmt.Sprintf("%s/stop-%d", countDir, time.Now().UnixNano())}
	t.Cleanup(func() { os.Remove(l.stop) })
	start := func(p api.StartParams) string {
		t.Helper()
		if p.TimeoutMS == 0 {
			p.TimeoutMS = 120000
		}
		p.Cwd = "/"
		rec, err := c.Start(ctx(t), p)
		if err != nil {
			t.Fatalf("exec.start %v: %v", p.Argv, err)
		}
		if rec.State != api.StateRunning {
			t.Fatalf("exec.start %v: state %v", p.Argv, rec.State)
		}
		l.pids[rec.ID], l.units[rec.ID] = rec.PID, rec.Scope
		return rec.ID
	}
	for i := 0; i < 6; i++ {
		id := fmt.Sprintf("writer-%d-%d", i, time.Now().UnixNano())
		start(api.StartParams{ID: id, Argv: []string{exe}, Env: map[string]string{
			helper: "writer", "WRITER_MS": strconv.Itoa(writeMS), "WRITER_UNTIL": l.stop, "WRITER_COUNT": countDir + "/" + id}})
		l.writers = append(l.writers, id)
	}
	l.seq = fmt.Sprintf("seq-%d", time.Now().UnixNano())
	start(api.StartParams{ID: l.seq, Argv: []string{exe}, OutputLimitBytes: 64 << 20, Env: map[string]string{
		helper: "writer", "WRITER_MS": strconv.Itoa(writeMS), "WRITER_UNTIL": l.stop, "WRITER_PACE_US": "200", "WRITER_COUNT": countDir + "/" + l.seq}})
	for i := 0; i < 10; i++ {
		l.sleepers = append(l.sleepers, start(api.StartParams{Argv: []string{"sleep", fmt.Sprintf("%.3f", float64(sleepMS)/1000)}}))
	}
	l.stdin = start(api.StartParams{Argv: []string{"cat"}, StdinOpen: true})
	l.timeout = start(api.StartParams{Argv: []string{"sleep", "1000"}, TimeoutMS: int64(timeoutMS), GraceMS: 100})
	l.exit7 = start(api.StartParams{Argv: []string{"sh", "-c", fmt.Sprintf("sleep %.3f; exit 7", float64(exit7MS)/1000)}})
	return l
}

// check ends the writers, waits for all 20 and asserts the real outcomes,
// the byte counts, adoption, and that the trees and the fd store are empty
// at the end. since is when the image that took over started (daemon.info
// started_at): every execution whose exit that image recorded (exited_at
// not before since) ran across the restart and must have been adopted
// once; one that ended before may have been cleaned by the image before
// (adopted 0, cleaned_at before since) or handed over with only its
// cleanup left (adopted 1), and must have its real outcome either way. The
// writers and cat run until check ends them, so they were running at the
// restart whatever the load: adopted 1. It returns how many were adopted.
func (l *load) check(t *testing.T, c *ipc.Client, since time.Time) int {
	t.Helper()
	if err := os.WriteFile(l.stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx(t), api.WriteParams{ID: l.stdin, Data: []byte("still open"), Close: true}); err != nil {
		t.Errorf("exec.write to the stdin kept open: %v", err)
	}
	adopted := 0
	wait := func(id string, acrossRestart bool) api.Record {
		rec, err := c.Wait(ctx(t), api.WaitParams{ID: id})
		if err != nil || rec.State != api.StateCleaned {
			t.Fatalf("exec.wait %s: %v (state %v)\n%s", id, err, rec.State, journalTail())
		}
		t.Logf("%s (%v): started %s exited %s cleaned %s, adopted %d, %s; new image %s", id, rec.Argv,
			stamp(rec.StartedAt), stamp(rec.ExitedAt), stamp(rec.CleanedAt), rec.Adopted, outcome(rec), stamp(&since))
		if outcome(rec) == "lost" {
			t.Errorf("%s (%v): lost: %s", id, rec.Argv, strOr(rec.Error))
		}
		if rec.ExitedAt == nil || rec.CleanedAt == nil {
			t.Fatalf("%s (%v): cleaned without exited_at or cleaned_at: %+v", id, rec.Argv, rec)
		}
		adopted += rec.Adopted
		switch {
		case acrossRestart || !rec.ExitedAt.Before(since):
			if rec.Adopted != 1 {
				t.Errorf("%s (%v): adopted %d, want 1: exited %s, running when the new image started at %s",
					id, rec.Argv, rec.Adopted, stamp(rec.ExitedAt), stamp(&since))
			}
		case rec.Adopted == 0 && !rec.CleanedAt.Before(since):
			t.Errorf("%s (%v): adopted 0 but cleaned at %s, after the new image started at %s",
				id, rec.Argv, stamp(rec.CleanedAt), stamp(&since))
		case rec.Adopted > 1:
			t.Errorf("%s (%v): adopted %d, want at most 1", id, rec.Argv, rec.Adopted)
		}
		return rec
	}
	for _, id := range append(append([]string{}, l.writers...), l.seq) {
		rec := wait(id, true)
		b, err := os.ReadFile(countDir + "/" + id)
		if err != nil {
			t.Errorf("writer %s: no count: %v (outcome %s)", id, err, outcome(rec))
			continue
		}
		n, _ := strconv.ParseInt(string(b), 10, 64)
		if outcome(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != 0 {
			t.Errorf("writer %s: outcome %s exit %v error %q", id, outcome(rec), rec.ExitCode, strOr(rec.Error))
		}
		if rec.Stdout.TotalBytes != n || n == 0 {
			t.Errorf("writer %s: stdout.total_bytes %d, the writer wrote %d", id, rec.Stdout.TotalBytes, n)
		}
	}
	for _, id := range l.sleepers {
		if rec := wait(id, false); outcome(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != 0 {
			t.Errorf("sleeper %s: outcome %s exit %v error %q", id, outcome(rec), rec.ExitCode, strOr(rec.Error))
		}
	}
	if rec := wait(l.stdin, true); outcome(rec) != "exited" || rec.Stdout.TotalBytes != int64(len("still open")) {
		t.Errorf("cat with stdin open: outcome %s, stdout %d bytes; want exited, what was written after the restart", outcome(rec), rec.Stdout.TotalBytes)
	}
	if rec := wait(l.timeout, false); outcome(rec) != "timeout" {
		t.Errorf("timeout: outcome %s error %q, want timeout", outcome(rec), strOr(rec.Error))
	}
	if rec := wait(l.exit7, false); outcome(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != 7 {
		t.Errorf("exit 7: outcome %s exit %v error %q, want exited 7", outcome(rec), rec.ExitCode, strOr(rec.Error))
	}
	l.checkGone(t)
	return adopted
}

// stamp is a record's time as the failures print it.
func stamp(p *time.Time) string {
	if p == nil {
		return "-"
	}
	return p.Format("15:04:05.000000")
}

// checkGone: every tree and scope is gone, and nothing is left in the fd
// store.
func (l *load) checkGone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for id, pid := range l.pids {
		for {
			_, err := os.Stat("/proc/" + strconv.Itoa(pid))
			unit := l.units[id]
			out, _ := exec.Command("systemctl", "show", "-p", "LoadState", "--value", unit).Output()
			if os.IsNotExist(err) && (unit == "" || strings.TrimSpace(string(out)) == "not-found") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: pid %d or unit %s (%s) still there", id, pid, unit, out)
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for {
		n := prop(t, "NFileDescriptorStore")
		if n == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("fd store holds %s fds after every execution was cleaned", n)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// follow follows id from offset 0 across connection losses, resuming with
// the offsets it has, until the execution is cleaned; it returns the bytes
// received, in order.
func follow(t *testing.T, id string, done chan<- []byte) {
	var got []byte
	var mu sync.Mutex
	reconnects := 0
	for {
		c, err := ipc.Dial(socket)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		mu.Lock()
		off := int64(len(got))
		mu.Unlock()
		rec, err := c.Follow(context.Background(), api.FollowParams{ID: id, StdoutOffset: off, StderrOffset: 0},
			func(method string, params json.RawMessage) {
				if method != api.NotifyOutput {
					return
				}
				var n api.OutputNotification
				if json.Unmarshal(params, &n) != nil || n.Stream != "stdout" {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if n.Offset != int64(len(got)) {
					got = append(got, []byte(fmt.Sprintf("<offset %d at %d>", n.Offset, len(got)))...)
					return
				}
				got = append(got, n.Data...)
			})
		c.Close()
		if err == nil && rec.State == api.StateCleaned {
			mu.Lock()
			done <- got
			mu.Unlock()
			return
		}
		reconnects++
		if reconnects > 200 {
			done <- append(got, []byte("<too many reconnects>")...)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitNewMain waits until corrald's main pid differs from old and it
// answers.
func waitNewMain(t *testing.T, old int) *ipc.Client {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for mainPID(t) == old || mainPID(t) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("corrald not restarted (main pid %d)\n%s", mainPID(t), journalTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return dial(t)
}

// reloadAndWait reloads corrald.service (the handover: the running corrald
// execs its new image in place) and waits as waitNewImage does.
func reloadAndWait(t *testing.T, since time.Time, within time.Duration) (*ipc.Client, api.Info) {
	t.Helper()
	harness.Sh(t, "systemctl", "reload", "corrald.service")
	return waitNewImage(t, since, within)
}

// waitNewImage waits up to within until corrald answers daemon.info from an
// image started after since (the one a reload handed over to), dialing
// afresh each try, and returns that connection and its answer; it fails
// the test, with the journal's tail, if no new image answers by then.
func waitNewImage(t *testing.T, since time.Time, within time.Duration) (*ipc.Client, api.Info) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		c := dial(t)
		info, err := c.Info(ctx(t))
		if err == nil && info.StartedAt.After(since) {
			return c, info
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new image after the reload: %+v %v\n%s", info, err, journalTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSurviveKill9: the 20 across a kill -9 of corrald; systemd restarts
// it and the fd store brings every execution back.
func TestSurviveKill9(t *testing.T) {
	setup(t)
	c := dial(t)
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Survival == nil || !info.Survival.FdStore || !info.Survival.Handover || !info.Survival.PidfdExitInfo {
		t.Fatalf("daemon.info survival = %+v, want all true under systemd on this kernel", info.Survival)
	}
	// Killed at ~0.5s after the last start; systemd restarts it after
	// RestartSec=1s: the timeout (1.2s) and the exit 7 (0.9s) fall due
	// while it is down (unless starting the 20 took longer than that:
	// check tells by exited_at); the writers go on until check, blocking
	// on full pipes meanwhile.
	l := startLoad(t, c, 4000, 4000, 1200, 900)
	time.Sleep(500 * time.Millisecond)
	old := mainPID(t)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", "corrald.service")
	c = waitNewMain(t, old)
	info, err = c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if n := l.check(t, c, info.StartedAt); info.Adopted != n {
		t.Errorf("daemon.info adopted = %d after the restart, but %d records say adopted", info.Adopted, n)
	}
	if rec, err := c.Get(ctx(t), l.exit7); err != nil || rec.Adopted == 1 {
		out, _ := exec.Command("journalctl", "-u", "corrald", "EVENT=adopted", "EXEC_ID="+l.exit7, "-o", "cat", "--no-pager").Output()
		if !strings.Contains(string(out), "adopted") {
			t.Errorf("journal has no EVENT=adopted for %s (%v)", l.exit7, err)
		}
	}
}

// TestSurviveReload: the 20 through `systemctl reload corrald` (the
// handover): no connection refused meanwhile, and a follower that
// reconnects with its offsets gets every byte exactly once.
func TestSurviveReload(t *testing.T) {
	setup(t)
	c := dial(t)
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	l := startLoad(t, c, 5000, 6000, 1600, 1500)
	followed := make(chan []byte, 1)
	go follow(t, l.seq, followed)
	time.Sleep(700 * time.Millisecond)
	stop := testd.DialLoop(t, socket)
	c, info := reloadAndWait(t, before.StartedAt, 20*time.Second)
	if info.PID != before.PID {
		t.Errorf("after the reload: pid %d, want the same pid %d (in-place exec)", info.PID, before.PID)
	}
	childHoldsOnlyStdio(t, c, info.PID)
	time.Sleep(200 * time.Millisecond)
	tries, refused := stop()
	if refused > 0 {
		t.Errorf("%d of %d connection attempts refused during the handover", refused, tries)
	}
	// The 1.5s and 1.6s executions fall due after the handover unless it
	// (or starting the 20) took longer than that: check tells by exited_at.
	if n := l.check(t, c, info.StartedAt); info.Adopted != n {
		t.Errorf("daemon.info adopted = %d after the reload, but %d records say adopted", info.Adopted, n)
	}
	var got []byte
	select {
	case got = <-followed:
	case <-time.After(30 * time.Second):
		t.Fatal("follower did not finish")
	}
	// Exactly once: the numbered lines, each once, in order, as many bytes
	// as the writer wrote.
	b, _ := os.ReadFile(countDir + "/" + l.seq)
	n, _ := strconv.Atoi(string(b))
	if len(got) != n {
		t.Errorf("follower received %d bytes, the writer wrote %d", len(got), n)
	}
	for i, line := range strings.Split(strings.TrimSuffix(string(got), "\n"), "\n") {
		if line != strconv.Itoa(i) {
			t.Errorf("follower's line %d is %q, want %d (a byte lost or read twice)", i, line, i)
			break
		}
	}
}

// childHoldsOnlyStdio starts a child through corrald (pid daemon) and
// checks that it holds nothing but its stdio: none of corrald's fds (its
// listening socket, spools, pidfds), which the handover passed to the new
// image without close-on-exec.
func childHoldsOnlyStdio(t *testing.T, c *ipc.Client, daemon int) {
	t.Helper()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "60"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	defer func() {
		c.Cancel(ctx(t), api.CancelParams{ID: rec.ID})
		ms := int64(20000)
		c.Wait(ctx(t), api.WaitParams{ID: rec.ID, TimeoutMS: &ms})
	}()
	ours := map[string]string{} // link -> corrald's fd
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", daemon))
	for _, e := range ents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", daemon, e.Name())); err == nil {
			ours[l] = e.Name()
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", rec.PID)
	ents, err = os.ReadDir(dir)
	if err != nil {
		t.Fatalf("the child's fds: %v", err)
	}
	for _, e := range ents {
		if n, _ := strconv.Atoi(e.Name()); n <= 2 {
			continue
		}
		l, _ := os.Readlink(dir + "/" + e.Name())
		t.Errorf("the child started after the handover holds fd %s (%s; corrald's fd %q)", e.Name(), l, ours[l])
	}
}

// TestHandoverToFailingBinary: the binary on disk is a script that exits 1
// at start (having put the real one back); the handover execs it, it
// dies, systemd restarts the real corrald, and the executions still end
// with their real outcomes (the crash path).
func TestHandoverToFailingBinary(t *testing.T) {
	setup(t)
	c := dial(t)
	bin := harness.Binary("corrald")
	saved := bin + ".real"
	harness.Sh(t, "cp", "-p", bin, saved)
	script := fmt.Sprintf("#!/bin/sh\necho 'broken corrald' >&2\ncp -p %s %s.tmp && mv %s.tmp %s\nexit 1\n", saved, bin, bin, bin)
	defer os.Remove(saved)
	l := startLoad(t, c, 3000, 3000, 1200, 900)
	time.Sleep(300 * time.Millisecond)
	if err := os.WriteFile(bin+".new", []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	old := mainPID(t)
	_ = exec.Command("systemctl", "reload", "corrald.service").Run() // fails: the new image died
	c = waitNewMain(t, old)
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	l.check(t, c, info.StartedAt)
}

// TestNoPidfdExitInfoIsLost: forced to act as on a kernel without
// PIDFD_INFO_EXIT, an execution that exited while corrald was down ends
// lost with an error naming it; one still running is adopted.
func TestNoPidfdExitInfoIsLost(t *testing.T) {
	setup(t)
	runAs(t, corrald("--no-pidfd-exit-info"), "")
	c := dial(t)
	info, err := c.Info(ctx(t))
	if err != nil || info.Survival == nil || info.Survival.PidfdExitInfo {
		t.Fatalf("daemon.info survival = %+v, %v; want pidfd_exit_info false", info.Survival, err)
	}
	exited, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", "sleep 0.5; exit 7"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	running, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 120000})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	old := mainPID(t)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", "corrald.service")
	c = waitNewMain(t, old)
	rec, err := c.Wait(ctx(t), api.WaitParams{ID: exited.ID})
	if err != nil {
		t.Fatal(err)
	}
	if outcome(rec) != "lost" || !strings.Contains(strOr(rec.Error), "PIDFD_INFO_EXIT") {
		t.Errorf("exited during the outage without PIDFD_INFO_EXIT: outcome %s error %q; want lost naming PIDFD_INFO_EXIT", outcome(rec), strOr(rec.Error))
	}
	got, err := c.Get(ctx(t), running.ID)
	if err != nil || got.State != api.StateRunning || got.Adopted != 1 {
		t.Errorf("still running at the restart: state %v adopted %d err %v; want running, adopted", got.State, got.Adopted, err)
	}
	if rec, err = c.Cancel(ctx(t), api.CancelParams{ID: running.ID}); err != nil {
		t.Fatal(err)
	}
	rec, err = c.Wait(ctx(t), api.WaitParams{ID: running.ID})
	if err != nil || outcome(rec) != "cancelled" {
		t.Errorf("adopted then cancelled: outcome %s error %q, %v; want cancelled", outcome(rec), strOr(rec.Error), err)
	}
}

// TestSecondDaemonOnTheSlice: a second corrald with another state directory
// but the same slice refuses to start, and leaves the first one's
// executions and scopes alone.
func TestSecondDaemonOnTheSlice(t *testing.T) {
	setup(t)
	c := dial(t)
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 120000})
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Binary("corrald")
	other := t.TempDir()
	out, err := exec.Command(bin, "--scope", "systemd", "--state-dir", filepath.Join(other, "state"),
		"--socket", filepath.Join(other, "s.sock"), "--config", "/dev/null", "--log-format", "json").CombinedOutput()
	if err == nil {
		t.Fatalf("a second corrald on corral.slice started:\n%s", out)
	}
	if !strings.Contains(string(out), "corral.slice") || !strings.Contains(string(out), "in use by another corrald") {
		t.Errorf("second corrald's error does not name the slice in use:\n%s", testd.Tail(string(out), 2000))
	}
	got, err := c.Get(ctx(t), rec.ID)
	if err != nil || got.State != api.StateRunning {
		t.Errorf("the first daemon's execution after the second one: %v, %v; want running", got.State, err)
	}
	out2, _ := exec.Command("systemctl", "show", "-p", "ActiveState", "--value", rec.Scope).Output()
	if strings.TrimSpace(string(out2)) != "active" {
		t.Errorf("scope %s is %q after the second corrald, want active", rec.Scope, out2)
	}
	if _, err := c.Cancel(ctx(t), api.CancelParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx(t), api.WaitParams{ID: rec.ID}); err != nil {
		t.Fatal(err)
	}
}

// TestReloadWithJournaldStopped: a reload hands over while journald does
// not read (stopped here; slow on a busy host), with the debug lines of a dial loop
// filling its socket (testd.DialLoop). Before corrald's journal writer queued (3c33650)
// every log call then waited for journald, the loop's and the handover's
// included: no new image answered, and systemd killed corrald for its
// watchdog instead.
func TestReloadWithJournaldStopped(t *testing.T) {
	setup(t)
	c := dial(t)
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 2; i++ {
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.ID)
	}
	cont := func() { _ = exec.Command("systemctl", "kill", "--signal=SIGCONT", "systemd-journald.service").Run() }
	t.Cleanup(cont)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGSTOP", "systemd-journald.service")
	stop := testd.DialLoop(t, socket)
	time.Sleep(time.Second) // about 3000 debug lines: journald's socket takes 512
	c, info := reloadAndWait(t, before.StartedAt, 20*time.Second)
	tries, refused := stop()
	cont()
	if info.PID != before.PID {
		t.Errorf("after the reload: pid %d, want the same pid %d (in-place exec, not a restart)", info.PID, before.PID)
	}
	if refused > 0 {
		t.Errorf("%d of %d connection attempts refused during the handover", refused, tries)
	}
	for _, id := range ids {
		rec, err := c.Get(ctx(t), id)
		if err != nil || rec.State != api.StateRunning || rec.Adopted != 1 {
			t.Errorf("%s after the reload: state %v, adopted %d, %v; want running, adopted 1", id, rec.State, rec.Adopted, err)
		}
		if _, err := c.Cancel(ctx(t), api.CancelParams{ID: id}); err != nil {
			t.Errorf("exec.cancel %s: %v", id, err)
		}
		if rec, err = c.Wait(ctx(t), api.WaitParams{ID: id}); err != nil || outcome(rec) != "cancelled" {
			t.Errorf("exec.wait %s: %v, outcome %s, want cancelled", id, err, outcome(rec))
		}
	}
}
