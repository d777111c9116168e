// Package durability runs a real corrald (cgroup backend) on this host and
// checks what its execution store promises across the daemon's life: after
// kill -9 and a restart, running executions are settled as lost with their
// trees, cgroups and workspaces gone, and finished ones keep their records
// and output; idempotent retries survive a restart; a graceful stop leaves
// durable records; a full disk refuses new work but keeps supervising; and
// cleaned records expire after the retention period.
//
// The tests need root and a cgroup2 hierarchy; elsewhere they skip.
package durability

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/tests/testd"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

// running is an execution started before the kill (or stop), with what
// the test learned about it while it ran.
type running struct {
	name      string
	id        string
	procs     []proc
	cgroup    string // absolute cgroup directory
	workspace string // "" when it ran in a given cwd
}

// checkGone reports what of r is left when (after the restart, after a
// stop): a process of its tree, its cgroup, its workspace.
func (r running) checkGone(t *testing.T, when string) {
	t.Helper()
	for _, p := range r.procs {
		if p.alive() {
			t.Errorf("%s: pid %d still runs %s", r.name, p.pid, when)
		}
	}
	if exists(r.cgroup) {
		t.Errorf("%s: cgroup %s still exists %s", r.name, r.cgroup, when)
	}
	if r.workspace != "" && exists(r.workspace) {
		t.Errorf("%s: workspace %s still exists %s", r.name, r.workspace, when)
	}
}

// settledAs reads the record of id (the execution called name) from a
// restarted daemon and checks that it is cleaned with outcome want. ok is
// false where the record could not be read.
func settledAs(t *testing.T, c *ipc.Client, name, id string, want api.Outcome) (rec api.Record, ok bool) {
	t.Helper()
	rec, err := c.Get(ctx(t), id)
	if err != nil {
		t.Errorf("%s: exec.get after restart: %v", name, err)
		return rec, false
	}
	if rec.State != api.StateCleaned || outcomeOf(rec) != string(want) {
		t.Errorf("%s: after restart: state %v outcome %s error %q, want cleaned %s",
			name, rec.State, outcomeOf(rec), strOr(rec.Error, ""), want)
	}
	return rec, true
}

func TestKillNineThenRestart(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.start()
	c := d1.Client()

	// Finished before the kill: a plain one and one with truncated output.
	plain, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	const lines, limit = 3000, 64
	wantTrunc := seqOutput(lines)
	trunc, err := c.Start(ctx(t), api.StartParams{Argv: []string{"seq", "1", strconv.Itoa(lines)}, Cwd: "/", OutputLimitBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	plainRec := waitCleaned(t, c, plain.ID)
	truncRec := waitCleaned(t, c, trunc.ID)
	if truncRec.Stdout.TotalBytes != int64(len(wantTrunc)) || !truncRec.Stdout.Truncated || truncRec.Stdout.KeptBytes != limit {
		t.Fatalf("truncated execution stdout = %+v, want total %d, kept %d, truncated", truncRec.Stdout, len(wantTrunc), limit)
	}
	truncBefore := readAll(t, c, trunc.ID, "stdout")

	// Running at the kill: one in a given cwd, one in a workspace with a
	// background child.
	var runs []running
	{
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 600000})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != api.StateRunning || rec.PID <= 0 {
			t.Fatalf("sleep: exec.start = state %v pid %d, want running with a pid", rec.State, rec.PID)
		}
		runs = append(runs, running{name: "sleep", id: rec.ID, procs: []proc{watch(t, rec.PID)},
			cgroup: scopeDir(rec)})
	}
	{
		script := `echo $$; sleep 1000 & echo $!; echo data > file; sleep 1000`
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", script}, TimeoutMS: 600000})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Workspace == nil {
			t.Fatalf("sh without cwd: workspace = nil, want one")
		}
		if want := filepath.Join(e.state, "work", rec.ID); *rec.Workspace != want {
			t.Errorf("workspace = %s, want %s", *rec.Workspace, want)
		}
		pids := pidsFromOutput(t, c, rec.ID, 2)
		r := running{name: "sh with background child", id: rec.ID, cgroup: scopeDir(rec), workspace: *rec.Workspace}
		for _, pid := range pids {
			r.procs = append(r.procs, watch(t, pid))
		}
		waitFor(t, "file in the workspace", func() bool { return exists(filepath.Join(r.workspace, "file")) })
		runs = append(runs, r)
	}
	{
		// Cancelled but ignoring SIGTERM with a long grace: canceling at the
		// kill.
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", `trap "" TERM; echo $$; sleep 1000`},
			Cwd: "/", TimeoutMS: 600000, GraceMS: 600000})
		if err != nil {
			t.Fatal(err)
		}
		r := running{name: "canceling", id: rec.ID, procs: []proc{watch(t, rec.PID)}, cgroup: scopeDir(rec)}
		pidsFromOutput(t, c, rec.ID, 1) // the trap is set
		if rec, err = c.Cancel(ctx(t), api.CancelParams{ID: rec.ID, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		if rec.State != api.StateCanceling {
			t.Fatalf("canceling: state %v after exec.cancel, want canceling", rec.State)
		}
		runs = append(runs, r)
	}
	for _, r := range runs {
		in, err := cgroupPIDs(r.cgroup)
		if err != nil {
			t.Fatalf("%s: cgroup: %v", r.name, err)
		}
		for _, p := range r.procs {
			if !containsInt(in, p.pid) {
				t.Fatalf("%s: pid %d not in its cgroup %s (%v)", r.name, p.pid, r.cgroup, in)
			}
		}
	}

	d1.kill9()
	// The trees outlive the daemon: what ends them must be the restart.
	for _, r := range runs {
		for _, p := range r.procs {
			if !p.alive() {
				t.Logf("%s: pid %d died with the daemon", r.name, p.pid)
			}
		}
	}

	d2 := e.start()
	c = d2.Client()
	for _, r := range runs {
		rec, ok := settledAs(t, c, r.name, r.id, api.OutcomeLost)
		if !ok {
			continue
		}
		if msg := strOr(rec.Error, ""); !strings.Contains(msg, "restart") {
			t.Errorf("%s: error = %q, want it to name the restart", r.name, msg)
		}
		if rec.ExitCode != nil || rec.Signal != nil {
			t.Errorf("%s: exit_code %v signal %v, want both null for a lost execution", r.name, rec.ExitCode, rec.Signal)
		}
		if rec.CleanedAt == nil || rec.ExitedAt == nil {
			t.Errorf("%s: exited_at %v cleaned_at %v, want both set", r.name, rec.ExitedAt, rec.CleanedAt)
		}
		// exec.wait answers at once: there is nothing left to wait for.
		waited := int64(5000)
		if w, err := c.Wait(ctx(t), api.WaitParams{ID: r.id, TimeoutMS: &waited}); err != nil || !reflect.DeepEqual(w, rec) {
			t.Errorf("%s: exec.wait after restart = %+v, %v; want the settled record %+v", r.name, w, err, rec)
		}
		r.checkGone(t, "after the restart")
	}

	// Finished ones: records and output as before the kill.
	got, err := c.Get(ctx(t), plain.ID)
	if err != nil {
		t.Fatalf("finished execution: exec.get after restart: %v", err)
	}
	if got.State != api.StateCleaned || outcomeOf(got) != string(api.OutcomeExited) || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("finished execution after restart: state %v outcome %s exit %v, want cleaned exited 3", got.State, outcomeOf(got), got.ExitCode)
	}
	if got.Stdout != plainRec.Stdout || got.Stderr != plainRec.Stderr {
		t.Errorf("finished execution streams after restart = %+v %+v, want %+v %+v", got.Stdout, got.Stderr, plainRec.Stdout, plainRec.Stderr)
	}
	if out := joined(readAll(t, c, plain.ID, "stdout")); out != "hello\n" {
		t.Errorf("finished execution stdout after restart = %q, want %q", out, "hello\n")
	}
	if out := joined(readAll(t, c, plain.ID, "stderr")); out != "oops\n" {
		t.Errorf("finished execution stderr after restart = %q, want %q", out, "oops\n")
	}

	got, err = c.Get(ctx(t), trunc.ID)
	if err != nil {
		t.Fatalf("truncated execution: exec.get after restart: %v", err)
	}
	if got.Stdout != truncRec.Stdout || outcomeOf(got) != string(api.OutcomeExited) {
		t.Errorf("truncated execution after restart: stdout %+v outcome %s, want %+v exited", got.Stdout, outcomeOf(got), truncRec.Stdout)
	}
	truncAfter := readAll(t, c, trunc.ID, "stdout")
	if !reflect.DeepEqual(truncAfter, truncBefore) {
		t.Errorf("truncated output after restart = %+v, before = %+v", truncAfter, truncBefore)
	}
	checkTruncatedReads(t, truncAfter, wantTrunc, limit)

	list, err := c.List(ctx(t), api.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, rec := range list.Executions {
		listed[rec.ID] = true
	}
	for _, id := range []string{plain.ID, trunc.ID, runs[0].id, runs[1].id, runs[2].id} {
		if !listed[id] {
			t.Errorf("exec.list after restart lacks %s", id)
		}
	}
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Store != "ok" || info.Running != 0 {
		t.Errorf("daemon.info after restart: store %q running %d, want ok 0", info.Store, info.Running)
	}

	// Settled records stay as they are across later restarts.
	ids := []string{plain.ID, trunc.ID, runs[0].id, runs[1].id, runs[2].id}
	seen := map[string]api.Record{}
	for _, id := range ids {
		if seen[id], err = c.Get(ctx(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := d2.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	c = e.start().Client()
	for _, id := range ids {
		got, err := c.Get(ctx(t), id)
		if err != nil {
			t.Errorf("exec.get %s after a second restart: %v", id, err)
		} else if !reflect.DeepEqual(got, seen[id]) {
			t.Errorf("exec.get %s after a second restart = %+v, want unchanged %+v", id, got, seen[id])
		}
	}
}

// checkTruncatedReads checks the exec.output answers of a truncated stream
// whose full text is want and whose kept size is limit: the kept head from
// offset 0, then one gap, then the kept tail to the end.
func checkTruncatedReads(t *testing.T, reads []outputRead, want string, limit int64) {
	t.Helper()
	gaps := 0
	var kept int64
	var off int64
	for _, r := range reads {
		if r.Gap {
			gaps++
			if r.Offset <= off {
				t.Errorf("gap read at offset %d, want past %d", r.Offset, off)
			}
		} else if r.Offset != off {
			t.Errorf("read starts at %d, want %d (no gap reported)", r.Offset, off)
		}
		if r.Offset+int64(len(r.Data)) > int64(len(want)) || want[r.Offset:r.Offset+int64(len(r.Data))] != r.Data {
			t.Errorf("data at offset %d = %q, want the stream's bytes there", r.Offset, r.Data)
		}
		if r.Total != int64(len(want)) {
			t.Errorf("total_bytes = %d, want %d", r.Total, len(want))
		}
		kept += int64(len(r.Data))
		off = r.Next
	}
	if gaps != 1 {
		t.Errorf("reads reported %d gaps, want 1: %+v", gaps, reads)
	}
	if kept != limit {
		t.Errorf("read %d kept bytes, want %d", kept, limit)
	}
	if last := reads[len(reads)-1]; !last.EOF || last.Next != int64(len(want)) {
		t.Errorf("last read = %+v, want eof at %d", last, len(want))
	}
}

// pidsFromOutput polls exec.output of a running execution until it has
// printed n lines, each a pid.
func pidsFromOutput(t *testing.T, c *ipc.Client, id string, n int) []int {
	t.Helper()
	var lines []string
	waitFor(t, strconv.Itoa(n)+" pids on stdout", func() bool {
		res, err := c.Output(ctx(t), api.OutputParams{ID: id})
		if err != nil {
			t.Fatalf("exec.output: %v", err)
		}
		lines = strings.Fields(string(res.Data))
		return len(lines) >= n
	})
	var pids []int
	for _, l := range lines[:n] {
		pid, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("pid line %q: %v", l, err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitFor polls cond every 20ms for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestIdempotentRetryAfterRestart(t *testing.T) {
	e := newEnv(t, "")
	marks := t.TempDir()
	d1 := e.start()
	c := d1.Client()

	type retry struct {
		name, id, mark string
		params         api.StartParams
		outcome        api.Outcome
	}
	var retries []retry
	for _, tc := range []struct {
		name, script string
		outcome      api.Outcome
	}{
		{"finished", `echo run >> "$MARK"`, api.OutcomeExited},
		{"running at the kill", `echo run >> "$MARK"; sleep 1000`, api.OutcomeLost},
	} {
		mark := filepath.Join(marks, strings.ReplaceAll(tc.name, " ", "-"))
		id := "dur-idem-" + strings.ReplaceAll(tc.name, " ", "-") + "-" + strconv.Itoa(os.Getpid()) + "-" + filepath.Base(e.base)
		p := api.StartParams{ID: id, Argv: []string{"sh", "-c", tc.script}, Env: map[string]string{"MARK": mark},
			Cwd: "/", TimeoutMS: 600000}
		rec, err := c.Start(ctx(t), p)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rec.ID != id {
			t.Fatalf("%s: id = %q, want %q", tc.name, rec.ID, id)
		}
		if tc.outcome == api.OutcomeLost {
			watch(t, rec.PID) // must be gone by the end
		}
		retries = append(retries, retry{name: tc.name, id: id, mark: mark, params: p, outcome: tc.outcome})
	}
	waitCleaned(t, c, retries[0].id)
	waitFor(t, "the running one's mark", func() bool { return exists(retries[1].mark) })

	d1.kill9()
	d2 := e.start()
	c = d2.Client()
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range retries {
		stored, err := c.Get(ctx(t), r.id)
		if err != nil {
			t.Fatalf("%s: exec.get after restart: %v", r.name, err)
		}
		rec, err := c.Start(ctx(t), r.params)
		if err != nil {
			t.Errorf("%s: retried exec.start: %v", r.name, err)
			continue
		}
		if !reflect.DeepEqual(rec, stored) {
			t.Errorf("%s: retried exec.start = %+v, want the stored record %+v", r.name, rec, stored)
		}
		if rec.State != api.StateCleaned || outcomeOf(rec) != string(r.outcome) {
			t.Errorf("%s: retried exec.start: state %v outcome %s, want cleaned %s", r.name, rec.State, outcomeOf(rec), r.outcome)
		}
		// Same key, another command: a conflict, not a silent success.
		other := r.params
		other.Argv = []string{"true"}
		if _, err := c.Start(ctx(t), other); rpcCode(err) != api.CodeIdempotency {
			t.Errorf("%s: same id, other argv: err = %v, want code %d", r.name, err, api.CodeIdempotency)
		}
	}
	after, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if after.Total != before.Total || after.Running != 0 {
		t.Errorf("daemon.info after retries: total %d running %d, want total %d running 0", after.Total, after.Running, before.Total)
	}
	// Anything started by mistake would have written its mark by now.
	time.Sleep(300 * time.Millisecond)
	for _, r := range retries {
		b, err := os.ReadFile(r.mark)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if string(b) != "run\n" {
			t.Errorf("%s: mark file = %q, want the command run once (%q)", r.name, b, "run\n")
		}
	}
}

func TestGracefulStopLeavesDurableRecord(t *testing.T) {
	e := newEnv(t, "")
	// The drain is long enough that a loaded host still gets a request in
	// while it lasts.
	const drain = 3 * time.Second
	d1 := e.start("--drain", drain.String())
	c := d1.Client()
	var runs []running
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"sleep", []string{"sleep", "1000"}},
		// Ignores SIGTERM: the stop must escalate to SIGKILL after grace_ms.
		{"ignores SIGTERM", []string{"sh", "-c", `trap "" TERM; sleep 1000`}},
	} {
		rec, err := c.Start(ctx(t), api.StartParams{Argv: tc.argv, Cwd: "/", TimeoutMS: 600000, GraceMS: 500})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		runs = append(runs, running{name: tc.name, id: rec.ID, procs: []proc{watch(t, rec.PID)}, cgroup: scopeDir(rec)})
	}

	began := time.Now()
	if err := d1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// While it drains, new work is refused with -32005.
	refused := false
	for !refused && !d1.Exited() && time.Since(began) < drain-500*time.Millisecond {
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"true"}, Cwd: "/"})
		switch {
		case rpcCode(err) == api.CodeShuttingDown:
			refused = true
		case err != nil:
			t.Fatalf("exec.start while draining: %v, want code %d", err, api.CodeShuttingDown)
		default:
			waitCleaned(t, c, rec.ID) // raced the signal; try again
		}
	}
	if !refused {
		t.Errorf("exec.start was not refused with %d during the %v drain", api.CodeShuttingDown, drain)
	}
	if err := d1.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d1.WaitErr(); err != nil {
		t.Errorf("corrald after SIGTERM: %v, want a clean exit", err)
	}
	if took := time.Since(began); took < drain {
		t.Errorf("corrald stopped after %v, before its %v drain", took, drain)
	}
	for _, r := range runs {
		r.checkGone(t, "after corrald stopped")
	}

	d2 := e.start()
	c = d2.Client()
	for _, r := range runs {
		got, ok := settledAs(t, c, r.name, r.id, api.OutcomeCancelled)
		if !ok {
			continue
		}
		if got.CleanedAt == nil {
			t.Errorf("%s: cleaned_at not set", r.name)
		}
	}
}

func TestFullDiskRefusesNewWorkButKeepsSupervising(t *testing.T) {
	sd := startOnSmallDisk(t, 3*time.Second)
	c, long, p, fill := sd.c, sd.long, sd.p, sd.fill
	filled := time.Now()
	fillUp(t, fill)

	// The store may still write into space its WAL already holds (a
	// checkpointed WAL starts over from its first frame): exec.start is
	// refused once a write needs a block the disk no longer has, within a
	// few executions. Each one accepted until then is a known, supervised
	// execution.
	var err error
	for i := 0; ; i++ {
		var rec api.Record
		rec, err = c.Start(ctx(t), api.StartParams{Argv: []string{"true"}, Cwd: "/"})
		if err != nil || i == 20 {
			break
		}
		waitCleaned(t, c, rec.ID)
	}
	if rpcCode(err) != api.CodeInternal {
		t.Fatalf("exec.start on a full disk: err = %v, want code %d", err, api.CodeInternal)
	}
	if !strings.Contains(err.Error(), "store") {
		t.Errorf("exec.start on a full disk: message %q does not mention the store", err)
	}
	// The write that failed left the store degraded. (Later writes may
	// succeed again in space the WAL already holds, once a checkpoint
	// lets it start over: the store is then healthy, and says so.)
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.Store, "degraded") {
		t.Errorf("daemon.info store = %q right after a write failed on a full disk, want degraded...", info.Store)
	}

	got, err := c.Wait(ctx(t), api.WaitParams{ID: long.ID})
	if err != nil {
		t.Fatalf("exec.wait of the running execution: %v", err)
	}
	if got.State != api.StateCleaned || outcomeOf(got) != string(api.OutcomeTimeout) {
		t.Errorf("running execution on a full disk: state %v outcome %s, want cleaned timeout", got.State, outcomeOf(got))
	}
	if waited := time.Since(filled); waited > 15*time.Second {
		t.Errorf("timeout of 3s took effect after %v", waited)
	}
	if p.alive() {
		t.Errorf("pid %d still runs after its timeout", p.pid)
	}
	if exists(scopeDir(long)) {
		t.Errorf("cgroup of the timed-out execution still exists")
	}
	if got, err := c.Get(ctx(t), long.ID); err != nil || outcomeOf(got) != string(api.OutcomeTimeout) {
		t.Errorf("exec.get of the timed-out execution on a full disk = %s, %v", outcomeOf(got), err)
	}

	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", "echo back"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("exec.start after freeing space: %v", err)
	}
	rec = waitCleaned(t, c, rec.ID)
	if outcomeOf(rec) != string(api.OutcomeExited) || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Errorf("after freeing space: outcome %s exit %v, want exited 0", outcomeOf(rec), rec.ExitCode)
	}
	if out := joined(readAll(t, c, rec.ID, "stdout")); out != "back\n" {
		t.Errorf("after freeing space: stdout %q, want %q", out, "back\n")
	}
	if info, err = c.Info(ctx(t)); err != nil || info.Store != "ok" {
		t.Errorf("daemon.info store after freeing space = %q (%v), want ok", info.Store, err)
	}
}

// smallDisk is a daemon whose state directory is on a 2 MiB tmpfs, with
// one execution (sleep 1000) running under a timeout; the test fills the
// disk at fill.
type smallDisk struct {
	e    *env
	d    *daemon
	c    *ipc.Client
	long api.Record // the sleep, as exec.start answered
	p    proc       // its process, watched: it must be gone by the end
	fill string     // the file that fills the disk
}

// startOnSmallDisk starts corrald (with args) on a small disk and the sleep
// with the given timeout (and a grace of 500ms).
func startOnSmallDisk(t *testing.T, timeout time.Duration, args ...string) smallDisk {
	t.Helper()
	mnt := mountTmpfs(t, "2m")
	e := newEnv(t, filepath.Join(mnt, "state"))
	d := e.start(args...)
	c := d.Client()
	long, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/",
		TimeoutMS: timeout.Milliseconds(), GraceMS: 500})
	if err != nil {
		t.Fatal(err)
	}
	return smallDisk{e: e, d: d, c: c, long: long, p: watch(t, long.PID), fill: filepath.Join(mnt, "fill")}
}

// fillUntilTimedOut fills the disk and waits for the sleep to end by its
// timeout, which the daemon must still enforce and report: cleaned with
// outcome timeout.
func (sd smallDisk) fillUntilTimedOut(t *testing.T) api.Record {
	t.Helper()
	fillUp(t, sd.fill)
	ended, err := sd.c.Wait(ctx(t), api.WaitParams{ID: sd.long.ID})
	if err != nil || ended.State != api.StateCleaned || outcomeOf(ended) != string(api.OutcomeTimeout) {
		t.Fatalf("exec.wait on a full disk = %v %s, %v; want cleaned timeout", ended.State, outcomeOf(ended), err)
	}
	return ended
}

// fillUp writes zeros to path until the file system is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
				t.Fatalf("fill %s: %v", path, err)
			}
			break
		}
	}
	// Whatever is left is smaller than a page.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
}

// TestFullDiskOutcomeSurvivesRestart: an execution that ended while the
// store could not write was reported to clients with its outcome; once
// space is back and the daemon stops gracefully, that outcome must be what a
// restarted daemon reports, not lost (an outcome never changes).
func TestFullDiskOutcomeSurvivesRestart(t *testing.T) {
	sd := startOnSmallDisk(t, 2*time.Second)
	c, long := sd.c, sd.long
	sd.fillUntilTimedOut(t)
	if err := os.Remove(sd.fill); err != nil {
		t.Fatal(err)
	}
	// A successful write: the store is healthy again.
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"true"}, Cwd: "/"})
	if err != nil {
		t.Fatalf("exec.start after freeing space: %v", err)
	}
	waitCleaned(t, c, rec.ID)
	if err := sd.d.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// Clients were told outcome timeout before the restart.
	settledAs(t, sd.e.start().Client(), "timed out on a full disk", long.ID, api.OutcomeTimeout)
}

// TestFullDiskRecordNeverGoesBackwards: an execution that ended while the
// store could not write is kept in memory for the retention period; once
// that passes (space long since freed), exec.get must not fall back to the
// stale stored record: states move one way only.
func TestFullDiskRecordNeverGoesBackwards(t *testing.T) {
	sd := startOnSmallDisk(t, time.Second, "--retention", "2s")
	c, long := sd.c, sd.long
	ended := sd.fillUntilTimedOut(t)
	if err := os.Remove(sd.fill); err != nil {
		t.Fatal(err)
	}
	// Past the retention period: the record may expire (-32001) but must
	// never read as anything earlier than cleaned with outcome timeout.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		got, err := c.Get(ctx(t), long.ID)
		if rpcCode(err) == api.CodeNotFound {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if got.State != api.StateCleaned || outcomeOf(got) != string(api.OutcomeTimeout) {
			t.Fatalf("exec.get %v after exec.wait answered cleaned timeout: now state %v outcome %s",
				time.Since(*ended.CleanedAt).Round(time.Millisecond), got.State, outcomeOf(got))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestRetentionExpiresCleanedRecords(t *testing.T) {
	e := newEnv(t, "")
	d := e.start("--retention", "2s")
	c := d.Client()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", "echo kept"}, Cwd: "/",
		Labels: map[string]string{"test": "retention"}})
	if err != nil {
		t.Fatal(err)
	}
	waitCleaned(t, c, rec.ID)
	if out := joined(readAll(t, c, rec.ID, "stdout")); out != "kept\n" {
		t.Fatalf("stdout right after cleaned = %q, want %q", out, "kept\n")
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Get(pctx, rec.ID)
		cancel()
		if rpcCode(err) == api.CodeNotFound {
			break
		}
		if err != nil {
			t.Fatalf("exec.get while waiting for expiry: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s still returned 30s after cleaned with --retention 2s", rec.ID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	list, err := c.List(ctx(t), api.ListParams{Labels: map[string]string{"test": "retention"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Executions {
		if r.ID == rec.ID {
			t.Errorf("exec.list still shows expired %s", rec.ID)
		}
	}
	if _, err := c.Output(ctx(t), api.OutputParams{ID: rec.ID}); rpcCode(err) != api.CodeNotFound {
		t.Errorf("exec.output of an expired record: err = %v, want code %d", err, api.CodeNotFound)
	}
}

// TestSecondDaemonLeavesRunningExecutionsAlone: a second corrald started by
// mistake with the same flags (state dir, socket, cgroup base) must refuse
// to run without touching what the live daemon supervises.
func TestSecondDaemonLeavesRunningExecutionsAlone(t *testing.T) {
	e := newEnv(t, "")
	d := e.start()
	c := d.Client()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	p := watch(t, rec.PID)

	second := exec.Command(filepath.Join(binDir, "corrald"), "--socket", e.socket, "--state-dir", e.state,
		"--scope", "cgroup", "--cgroup-base", e.base, "--config", "/dev/null", "--socket-group", "")
	var out strings.Builder
	second.Stdout, second.Stderr = &out, &out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- second.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Errorf("second corrald on the same state dir exited 0, want a refusal")
		}
	case <-time.After(20 * time.Second):
		_ = second.Process.Kill()
		<-exited
		t.Fatalf("second corrald on the same state dir still runs after 20s:\n%s", out.String())
	}
	if !p.alive() {
		t.Errorf("the live daemon's execution (pid %d) was killed by the refused second corrald:\n%s", p.pid, testd.Tail(out.String(), 3000))
	}
	got, err := c.Get(ctx(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning {
		t.Errorf("after a refused second corrald: state %v outcome %s, want still running", got.State, outcomeOf(got))
	}
	if _, err := c.Info(ctx(t)); err != nil {
		t.Errorf("the live daemon after a second corrald: daemon.info: %v", err)
	}
}

// TestRestartWithAnotherCgroupBase: a record settled as lost and cleaned
// after a restart must mean its tree is gone, even when the new daemon uses
// another cgroup base (the default base follows the daemon's own cgroup, so
// it changes when corrald is started from elsewhere). Either the tree is
// killed through the record's scope, or the record must not claim cleaned.
func TestRestartWithAnotherCgroupBase(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.start()
	c := d1.Client()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	p := watch(t, rec.PID)
	cgroup := scopeDir(rec)
	d1.kill9()

	// The env's cleanup removes the first base; this one's removes the
	// second.
	e.base = testd.CgroupBase(t, cgroupRoot, "corral-dur-moved")
	c = e.start().Client()
	got, err := c.Get(ctx(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if outcomeOf(got) != string(api.OutcomeLost) {
		t.Errorf("after restart: outcome %s, want lost", outcomeOf(got))
	}
	if got.State == api.StateCleaned && (p.alive() || exists(cgroup)) {
		t.Errorf("record %s says cleaned (scope %s) but pid %d alive %v, cgroup %s exists %v",
			rec.ID, got.Scope, p.pid, p.alive(), cgroup, exists(cgroup))
	}
}

// scopeDir is the cgroup directory that held rec's tree: the record's scope
// is its path under the cgroup2 root (a warm-pool scope has its own name,
// not the execution id).
func scopeDir(rec api.Record) string {
	return filepath.Join(scope.Detect().Cgroup2Mount, rec.Scope)
}
