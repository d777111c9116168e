package durability

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"
)

// TestHandoverUnderCgroupBackend: SIGHUP hands every running execution to
// the binary on disk, same pid, without systemd: each ends with its real
// exit code, its output whole, adopted once; no connection attempt is
// refused meanwhile; daemon.info reports the adoption.
func TestHandoverUnderCgroupBackend(t *testing.T) { testHandover(t, "cgroup") }

// TestHandoverUnderPgroupBackend: the same with process groups.
func TestHandoverUnderPgroupBackend(t *testing.T) { testHandover(t, "pgroup") }

func testHandover(t *testing.T, backend string) {
	e := newEnv(t, "")
	d := e.start("--scope", backend)
	c := d.Client()
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if before.Survival == nil || !before.Survival.Handover || before.Survival.FdStore {
		t.Fatalf("daemon.info survival = %+v, want handover true, fdstore false (no systemd)", before.Survival)
	}
	type want struct {
		id   string
		code int
		out  string
	}
	var wants []want
	for i, code := range []int{0, 3, 7} {
		script := `for i in 1 2 3 4 5 6 7 8; do echo "line $i"; sleep 0.2; done; exit ` + string(rune('0'+code))
		rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", script}, Cwd: "/", TimeoutMS: 60000})
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		wants = append(wants, want{rec.ID, code, "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\n"})
	}
	stdin, err := c.Start(ctx(t), api.StartParams{Argv: []string{"cat"}, Cwd: "/", StdinOpen: true, TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx(t), api.WriteParams{ID: stdin.ID, Data: []byte("before ")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	stop := testd.DialLoop(t, d.Socket)
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The new image answers: daemon.info from the same pid, adopted 4.
	var info api.Info
	waitFor(t, "the new image to answer daemon.info", func() bool {
		c2, err := ipc.Dial(d.Socket)
		if err != nil {
			return false
		}
		defer c2.Close()
		info, err = c2.Info(ctx(t))
		return err == nil && info.StartedAt.After(before.StartedAt)
	})
	if info.PID != before.PID || info.Adopted != 4 {
		t.Errorf("after the handover: pid %d (was %d), adopted %d; want the same pid, adopted 4", info.PID, before.PID, info.Adopted)
	}
	if _, n := stop(); n > 0 {
		t.Errorf("%d connection attempts refused during the handover", n)
	}
	c = d.Client()
	if _, err := c.Write(ctx(t), api.WriteParams{ID: stdin.ID, Data: []byte("after"), Close: true}); err != nil {
		t.Fatalf("exec.write after the handover: %v", err)
	}
	for _, w := range wants {
		rec := waitCleaned(t, c, w.id)
		if outcomeOf(rec) != "exited" || rec.ExitCode == nil || *rec.ExitCode != w.code || rec.Adopted != 1 {
			t.Errorf("%s: outcome %s exit %v adopted %d error %s; want exited %d, adopted 1", w.id, outcomeOf(rec), rec.ExitCode, rec.Adopted, strOr(rec.Error, ""), w.code)
		}
		if got := joined(readAll(t, c, w.id, "stdout")); got != w.out {
			t.Errorf("%s: stdout %q, want %q", w.id, got, w.out)
		}
	}
	rec := waitCleaned(t, c, stdin.ID)
	if got := joined(readAll(t, c, stdin.ID, "stdout")); got != "before after" || outcomeOf(rec) != "exited" {
		t.Errorf("stdin execution: stdout %q outcome %s; want %q, exited", got, outcomeOf(rec), "before after")
	}
	if ents, _ := os.ReadDir(filepath.Join(e.state, "spool")); len(ents) > 0 {
		t.Errorf("spool files left after every execution was cleaned: %v", ents)
	}
}

// TestHandoverExecFailureCarriesOn: when the binary on disk cannot be
// exec'd, the old image keeps supervising: the execution ends with its
// real outcome, not adopted.
func TestHandoverExecFailureCarriesOn(t *testing.T) {
	e := newEnv(t, "")
	// A copy of corrald of our own, so it can be made non-executable.
	bin := filepath.Join(e.dir, "corrald")
	copyFile(t, filepath.Join(binDir, "corrald"), bin)
	copyFile(t, filepath.Join(binDir, "corral-shim"), filepath.Join(e.dir, "corral-shim"))
	e.runs++
	d := testd.Start(t, testd.Config{
		Corrald: bin, Socket: e.socket, StateDir: e.state, CgroupBase: e.base,
		LogPath: filepath.Join(e.dir, "corrald-1.log"),
		Args:    []string{"--scope", "cgroup", "--socket-group", ""},
	})
	c := d.Client()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sh", "-c", "sleep 1; exit 5"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the failed handover in the log", func() bool {
		b, _ := os.ReadFile(d.LogPath)
		return strings.Contains(string(b), "handover_failed")
	})
	_ = os.Chmod(bin, 0o755)
	got := waitCleaned(t, c, rec.ID)
	if outcomeOf(got) != "exited" || got.ExitCode == nil || *got.ExitCode != 5 || got.Adopted != 0 {
		t.Errorf("after a failed handover: outcome %s exit %v adopted %d; want exited 5, not adopted", outcomeOf(got), got.ExitCode, got.Adopted)
	}
	if d.Exited() {
		t.Error("corrald exited after a failed handover")
	}
	if _, err := c.Start(ctx(t), api.StartParams{Argv: []string{"true"}, Cwd: "/"}); err != nil {
		t.Errorf("exec.start after a failed handover: %v", err)
	}
}

// TestCrashWithoutFdStoreIsLost: the cgroup backend without systemd has no
// fd store, so a kill -9 of corrald ends a running execution lost, with an
// error that says so, and its tree killed.
func TestCrashWithoutFdStoreIsLost(t *testing.T) {
	for _, backend := range []string{"cgroup", "pgroup"} {
		t.Run(backend, func(t *testing.T) { testCrashLost(t, backend) })
	}
}

func testCrashLost(t *testing.T, backend string) {
	e := newEnv(t, "")
	d := e.start("--scope", backend)
	c := d.Client()
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	p := watch(t, rec.PID)
	d.kill9()
	c = e.start("--scope", backend).Client()
	got, err := c.Get(ctx(t), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if outcomeOf(got) != "lost" || !strings.Contains(strOr(got.Error, ""), "there is no fd store") {
		t.Errorf("after kill -9 without an fd store: outcome %s error %q; want lost, naming the missing fd store", outcomeOf(got), strOr(got.Error, ""))
	}
	waitFor(t, "the lost execution's process to be gone", func() bool { return !p.alive() })
}

// TestTwoDaemonsOneCgroupBase: a second corrald with another state
// directory but the same cgroup base refuses to start, naming the base,
// and kills none of the first one's cgroups (its pool shims included).
func TestTwoDaemonsOneCgroupBase(t *testing.T) {
	e := newEnv(t, "")
	d := e.start("--pool-size", "2")
	c := d.Client()
	waitFor(t, "the pool to fill", func() bool {
		info, err := c.Info(ctx(t))
		return err == nil && info.Pool != nil && info.Pool.Idle == 2
	})
	rec, err := c.Start(ctx(t), api.StartParams{Argv: []string{"sleep", "1000"}, Cwd: "/", TimeoutMS: 600000})
	if err != nil {
		t.Fatal(err)
	}
	p := watch(t, rec.PID)
	cgroups := testd.CgroupChildren(e.base)

	other := t.TempDir()
	second := exec.Command(filepath.Join(binDir, "corrald"), "--socket", filepath.Join(other, "s.sock"),
		"--state-dir", filepath.Join(other, "state"), "--scope", "cgroup", "--cgroup-base", e.base,
		"--config", "/dev/null", "--socket-group", "")
	out, err := second.CombinedOutput()
	if err == nil {
		t.Fatalf("a second corrald on the same cgroup base started:\n%s", out)
	}
	if !strings.Contains(string(out), "in use by another corrald") || !strings.Contains(string(out), e.base) {
		t.Errorf("second corrald's error does not name the cgroup base in use:\n%s", testd.Tail(string(out), 2000))
	}
	if strings.Contains(string(out), "leftover_removed") {
		t.Errorf("second corrald removed leftovers:\n%s", testd.Tail(string(out), 2000))
	}
	if !p.alive() {
		t.Error("the first daemon's execution was killed")
	}
	if now := testd.CgroupChildren(e.base); len(now) != len(cgroups) {
		t.Errorf("cgroups of the first daemon: %v before, %v after the second one", cgroups, now)
	}
	info, err := c.Info(ctx(t))
	if err != nil || info.Pool == nil || info.Pool.Idle != 2 {
		t.Errorf("first daemon's pool after the second one: %+v, %v; want 2 idle", info.Pool, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
