package reactor

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// neverAnswerExited writes every exited transition to the store it wraps
// (durable) but holds its answer until the test ends: the reactor never
// learns that its exited record is durable, so the execution's fds stay in
// the fd store (a crash in the moment between the write and its answer).
type neverAnswerExited struct {
	store.Store
	release chan struct{}
}

func (s *neverAnswerExited) crashed() store.Store { return s.Store }

func (s *neverAnswerExited) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	if rec.State == api.StateExited {
		s.Store.TransitionFunc(from, rec, func(res store.Result) {
			go func() { <-s.release; done(res) }()
		}, outs...)
		return
	}
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestAdoptedExitWithoutSpoolKeepsStoredOutput: an execution that reached
// exited without a spool (the spool directory could not be made) has its
// kept output in the store with the exited record (ffb8b9d). After a crash
// before cleaned, the restarted corrald that takes it over (its fds came
// back) finishes it with that output: exec.output and the cleaned record
// say what the child wrote. It rebuilt the kept output from the spools
// alone: finding none, it kept nothing, and the cleaned record's empty
// output replaced the stored one.
func TestAdoptedExitWithoutSpoolKeepsStoredOutput(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil { // a file where the directory goes
		t.Fatal(err)
	}
	inner := store.NewMemory()
	st := &neverAnswerExited{Store: inner, release: make(chan struct{})}
	b := newStuckBackend()
	t.Cleanup(func() { b.Release(); close(st.release) })
	r1 := newCrashableWith(t, st, func(c *Config) { c.Backend, c.StateDir = b, dir })
	id := startToRemoval(t, r1.Reactor, b, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 4"}})
	storedStateIs(t, inner, id, api.StateExited)
	r1.fs.mu.Lock()
	_, parked := r1.fs.fds[id+"."+RolePidfd]
	r1.fs.mu.Unlock()
	if !parked {
		t.Fatal("no pidfd left in the fd store: the restart would not take the execution over")
	}
	r2 := r1.crashAndAdopt(t)
	got := r2.wait(id)
	if outcome(got) != api.OutcomeExited || got.ExitCode == nil || *got.ExitCode != 4 {
		t.Errorf("outcome %s exit %s, want exited 4", outcome(got), exitCode(got))
	}
	wantFour := api.StreamInfo{TotalBytes: 4, KeptBytes: 4}
	if out := r2.stdout(id); out != "out\n" || got.Stdout != wantFour {
		t.Errorf("stdout %q, record %+v; want %q, 4 bytes kept", out, got.Stdout, "out\n")
	}
	eo, err := r2.Output(context.Background(), root, api.OutputParams{ID: id, Stream: "stderr"})
	if err != nil || string(eo.Data) != "err\n" || got.Stderr != wantFour {
		t.Errorf("stderr %q (%v), record %+v; want %q, 4 bytes kept", eo.Data, err, got.Stderr, "err\n")
	}
}

// TestAdoptedExitPrefersTheLongerAbandonedSpool: the exited record carries
// X bytes of kept output (no working spool at the exit), and output read
// after it (the pipes are drained a bounded time before the record) went
// into a spool made again later and then abandoned: the restart finds a
// spool marked as missing bytes that holds more than the store's copy. It
// keeps the spool's bytes and says truncated. The store's copy won because
// the spool was abandoned: X bytes with truncated false, although more
// were read and served. The spool is written here as the earlier process
// would have left it.
func TestAdoptedExitPrefersTheLongerAbandonedSpool(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil { // a file where the directory goes
		t.Fatal(err)
	}
	inner := store.NewMemory()
	st := &neverAnswerExited{Store: inner, release: make(chan struct{})}
	b := newStuckBackend()
	t.Cleanup(func() { b.Release(); close(st.release) })
	r1 := newCrashableWith(t, st, func(c *Config) { c.Backend, c.StateDir = b, dir })
	id := startToRemoval(t, r1.Reactor, b, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", "echo out; exit 4"}})
	storedStateIs(t, inner, id, api.StateExited)
	cst := r1.crash(t)
	if err := os.Remove(SpoolDir(dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(SpoolDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	const spooled = "out\nread after the exited record\n"
	hdr := make([]byte, spoolHeader)
	binary.LittleEndian.PutUint64(hdr, spoolLost)
	if err := os.WriteFile(spoolPath(dir, id, RoleStdout), append(hdr, spooled...), 0o600); err != nil {
		t.Fatal(err)
	}
	adopt := r1.adoptees(t, cst)
	r2 := newTestReactor(t, func(cfg *Config) {
		cfg.Store, cfg.FdStore, cfg.StateDir, cfg.Adopt, cfg.Subreaper = cst, r1.fs, dir, adopt, false
	})
	got := r2.wait(id)
	if out := r2.stdout(id); out != spooled || got.Stdout != (api.StreamInfo{TotalBytes: int64(len(spooled)), KeptBytes: int64(len(spooled)), Truncated: true}) {
		t.Errorf("stdout %q, record %+v; want the spool's %d bytes, truncated", out, got.Stdout, len(spooled))
	}
}

// startToRemoval starts p on r, whose backend is b, and returns its id once
// its cleanup began the scope's removal, which hangs (stuckBackend).
func startToRemoval(t *testing.T, r *Reactor, b *stuckBackend, p api.StartParams) string {
	t.Helper()
	rec, err := r.Start(context.Background(), root, p)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.removing:
	case <-time.After(10 * time.Second):
		t.Fatal("cleanup did not begin the scope's removal within 10s")
	}
	return rec.ID
}

// TestSettledExitWithoutSpoolKeepsStoredOutput: the same execution whose
// fds had left the fd store (its exited record durable) is not taken over
// but settled at start-up (store.RecoverWith, as cmd/corrald does): the
// cleaned record written then leaves the exited record's output in place.
func TestSettledExitWithoutSpoolKeepsStoredOutput(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st := store.NewMemory()
	b := newStuckBackend()
	t.Cleanup(b.Release)
	r1 := newCrashableWith(t, st, func(c *Config) { c.Backend, c.StateDir = b, dir })
	id := startToRemoval(t, r1.Reactor, b, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", "echo out; exit 4"}})
	storedStateIs(t, st, id, api.StateExited)
	r1.crash(t)
	if ad := r1.adoptees(t, st); len(ad) != 1 || len(ad[0].Fds) != 0 {
		t.Fatalf("adoptees %+v: want the exited one with no fds left", ad)
	}
	if _, err := store.RecoverWith(st, zerolog.Nop(), time.Now(), store.RecoverOptions{}, func(api.Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	r2 := newTestReactor(t, func(c *Config) { c.Store, c.StateDir = st, dir })
	got := r2.wait(id)
	if out := r2.stdout(id); out != "out\n" || got.Stdout != (api.StreamInfo{TotalBytes: 4, KeptBytes: 4}) {
		t.Errorf("stdout %q, record %+v; want %q, 4 bytes kept", out, got.Stdout, "out\n")
	}
}

// TestAdoptedExitKeepsOutput: an execution that reached exited and whose
// cleanup a crash cut off is finished by the restarted corrald with all
// the output its child wrote, whether its spools kept it (the exited
// record then carries none) or a spool was abandoned (its file system
// filled up) and the exited record carries it. The abandoned spool holds
// the output up to the failure only; it was taken for the whole of it,
// and the cleaned record's copy of it replaced the store's.
func TestAdoptedExitKeepsOutput(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fullDisk bool
	}{
		{"working spools", false},
		{"spool abandoned on a full disk", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeExitsAtOnce(t)
			dir := t.TempDir()
			if tc.fullDisk {
				dir = mountSmallTmpfs(t, "256k")
			}
			gate := filepath.Join(t.TempDir(), "go")
			st := store.NewMemory()
			b := newStuckBackend()
			t.Cleanup(b.Release)
			r1 := newCrashableWith(t, st, func(c *Config) { c.Backend, c.StateDir = b, dir })
			rec, err := r1.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", fullDiskScript, gate}})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, r1.Reactor, rec.ID, "first\n")
			if tc.fullDisk {
				fillUp(t, dir)
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			select {
			case <-b.removing:
			case <-time.After(10 * time.Second):
				t.Fatal("cleanup did not begin the scope's removal within 10s")
			}
			storedStateIs(t, st, rec.ID, api.StateExited)
			r2 := r1.crashAndAdopt(t)
			got := r2.wait(rec.ID)
			if outcome(got) != api.OutcomeExited || got.ExitCode == nil || *got.ExitCode != 3 {
				t.Errorf("outcome %s exit %s, want exited 3", outcome(got), exitCode(got))
			}
			n := int64(len(fullDiskOutput))
			if out := r2.stdout(rec.ID); out != fullDiskOutput || got.Stdout != (api.StreamInfo{TotalBytes: n, KeptBytes: n}) {
				t.Errorf("stdout %d bytes (ends %q), record %+v; want all %d bytes kept", len(out), out[max(0, len(out)-8):], got.Stdout, n)
			}
		})
	}
}

// TestAdoptedRunningAfterAbandonedSpoolSaysTruncated: a spool abandoned
// while the execution ran (its file system filled up) keeps the output up
// to the failure; what came after was only in memory, and a crash lost
// it. The restarted corrald keeps what the spool holds and what the child
// writes from then on, and the record says the output is truncated. The
// abandoned spool was read and appended to as if it were whole: the
// stream looked complete, the missing bytes unsaid.
func TestAdoptedRunningAfterAbandonedSpoolSaysTruncated(t *testing.T) {
	dir := mountSmallTmpfs(t, "256k")
	gate1, gate2 := filepath.Join(t.TempDir(), "one"), filepath.Join(t.TempDir(), "two")
	st := store.NewMemory()
	r1 := newCrashableWith(t, st, func(c *Config) { c.StateDir = dir })
	script := `echo first; while [ ! -e "$0" ]; do sleep 0.01; done; head -c 20000 /dev/zero | tr '\0' y; echo; while [ ! -e "$1" ]; do sleep 0.01; done; echo last; exit 3`
	rec, err := r1.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", script, gate1, gate2}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1.Reactor, rec.ID, "first\n")
	fillUp(t, dir)
	if err := os.WriteFile(gate1, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1.Reactor, rec.ID, "first\n"+strings.Repeat("y", 20000)+"\n")
	r2 := r1.crashAndAdopt(t)
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate2, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := r2.wait(rec.ID)
	if outcome(got) != api.OutcomeExited || got.ExitCode == nil || *got.ExitCode != 3 {
		t.Errorf("outcome %s exit %s, want exited 3", outcome(got), exitCode(got))
	}
	out := r2.stdout(rec.ID)
	if !strings.HasPrefix(out, "first\n") || !strings.HasSuffix(out, "y\nlast\n") && !strings.HasSuffix(out, "y"+"last\n") {
		t.Errorf("stdout %q...%q: want what the spool kept, then what came after the restart", out[:min(len(out), 8)], out[max(0, len(out)-8):])
	}
	if !got.Stdout.Truncated || got.Stdout.KeptBytes != int64(len(out)) {
		t.Errorf("record stdout %+v with %d bytes kept: want truncated (bytes lost with the crash), kept_bytes what is kept", got.Stdout, len(out))
	}
}

// TestSpoolResumesOnceTheDiskHasRoom: a stream whose spool could not be
// opened (the state directory's file system full at the start) or was
// abandoned (full later) gets a working spool again, from its kept output,
// at its first output once there is room: a crash after that loses
// nothing, and the record does not say truncated. The stream stayed
// unspooled for its life: the crash lost what was read before it (never
// opened: all of it, and the record said nothing; abandoned: from the
// failure on).
func TestSpoolResumesOnceTheDiskHasRoom(t *testing.T) {
	old := respoolEvery
	respoolEvery = 0
	t.Cleanup(func() { respoolEvery = old })
	script := `echo first; while [ ! -e "$0" ]; do sleep 0.01; done; head -c 20000 /dev/zero | tr '\0' y; echo
while [ ! -e "$1" ]; do sleep 0.01; done; echo second; while [ ! -e "$2" ]; do sleep 0.01; done; echo last; exit 3`
	ys := strings.Repeat("y", 20000) + "\n"
	for _, tc := range []struct {
		name      string
		fullFirst bool // full before the start: no spool is opened
	}{
		{"spool never opened", true},
		{"spool abandoned", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := mountSmallTmpfs(t, "256k")
			tmp := t.TempDir()
			gates := []string{filepath.Join(tmp, "1"), filepath.Join(tmp, "2"), filepath.Join(tmp, "3")}
			open := func(i int) {
				t.Helper()
				if err := os.WriteFile(gates[i], nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			st := store.NewMemory()
			r1 := newCrashableWith(t, st, func(c *Config) { c.StateDir = dir })
			if tc.fullFirst {
				if err := os.MkdirAll(SpoolDir(dir), 0o700); err != nil {
					t.Fatal(err)
				}
				fillUp(t, dir)
			}
			rec, err := r1.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: append([]string{"sh", "-c", script}, gates...)})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, r1.Reactor, rec.ID, "first\n")
			if !tc.fullFirst {
				fillUp(t, dir)
			}
			open(0)
			waitOutput(t, r1.Reactor, rec.ID, "first\n"+ys)
			if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
				t.Fatal(err)
			}
			open(1)
			waitOutput(t, r1.Reactor, rec.ID, "first\n"+ys+"second\n")
			r2 := r1.crashAndAdopt(t)
			open(2)
			got := r2.wait(rec.ID)
			want := "first\n" + ys + "second\nlast\n"
			n := int64(len(want))
			if out := r2.stdout(rec.ID); out != want || got.Stdout != (api.StreamInfo{TotalBytes: n, KeptBytes: n}) {
				t.Errorf("stdout %d bytes, record %+v; want all %d bytes kept", len(out), got.Stdout, n)
			}
		})
	}
}

// TestAdoptedRunningWithoutSpoolSaysTruncated: a stream whose spool could
// not be started (the state directory's file system full: the file is
// made, its header cannot be written) keeps its output in memory only; a
// crash while it runs loses that, and the restarted corrald says so: the
// record is truncated. It said the output was whole: only what came after
// the restart, truncated false.
func TestAdoptedRunningWithoutSpoolSaysTruncated(t *testing.T) {
	dir := mountSmallTmpfs(t, "256k")
	gate := filepath.Join(t.TempDir(), "go")
	st := store.NewMemory()
	r1 := newCrashableWith(t, st, func(c *Config) { c.StateDir = dir })
	if err := os.MkdirAll(SpoolDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	fillUp(t, dir)
	rec, err := r1.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: []string{"sh", "-c", `echo first; while [ ! -e "$0" ]; do sleep 0.01; done; echo last`, gate}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1.Reactor, rec.ID, "first\n")
	r2 := r1.crashAndAdopt(t)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := r2.wait(rec.ID)
	out := r2.stdout(rec.ID)
	if !strings.HasSuffix(out, "last\n") || !got.Stdout.Truncated || got.Stdout.KeptBytes != int64(len(out)) {
		t.Errorf("stdout %q, record %+v: want what came after the restart, and truncated (the first line was lost with the crash)", out, got.Stdout)
	}
}

// TestAdoptedRedactedExitCountsWhatTheChildWrote: a redacted stream's
// total_bytes counts the bytes the child wrote, not the redacted ones kept.
// Taken over from the exited record's stored output (no spool), it counted
// the kept ones: 11 for the 21 bytes of an access key id and its newline.
func TestAdoptedRedactedExitCountsWhatTheChildWrote(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil { // no spools
		t.Fatal(err)
	}
	inner := store.NewMemory()
	st := &neverAnswerExited{Store: inner, release: make(chan struct{})}
	b := newStuckBackend()
	t.Cleanup(func() { b.Release(); close(st.release) })
	r1 := newCrashableWith(t, st, func(c *Config) { c.Backend, c.StateDir = b, dir })
	id := startToRemoval(t, r1.Reactor, b, api.StartParams{Cwd: "/", Redact: true, Argv: []string{"echo", "AKIAABCDEFGHIJKLMNOP"}})
	storedStateIs(t, inner, id, api.StateExited)
	r2 := r1.crashAndAdopt(t)
	got := r2.wait(id)
	if out := r2.stdout(id); out != "[REDACTED]\n" || got.Stdout.TotalBytes != 21 {
		t.Errorf("stdout %q, record %+v; want %q with total_bytes 21 (what the child wrote)", out, got.Stdout, "[REDACTED]\n")
	}
}

// TestFailedHandoverKeepsAbandonedSpoolMarked: a handover of a stream
// whose spool was abandoned (its file system full) writes the kept output
// as its spool, and the handover then fails (the disk still full: the
// write fails; or the exec fails): the old process carries on, and a crash
// after that either gives back all that the child wrote or says it is
// truncated. The handover wrote straight onto the spool's path: on a full
// disk it truncated the marked file and left a page of it unmarked (4,093
// of 20,012 bytes, truncated false); with room, it left the whole snapshot
// unmarked while the stream stayed unspooled, and what came after it (the
// disk full again) was lost with truncated false.
func TestFailedHandoverKeepsAbandonedSpoolMarked(t *testing.T) {
	script := `echo first; while [ ! -e "$0" ]; do sleep 0.01; done; head -c 20000 /dev/zero | tr '\0' y; echo
while [ ! -e "$1" ]; do sleep 0.01; done; echo second; while [ ! -e "$2" ]; do sleep 0.01; done; echo last; exit 3`
	ys := strings.Repeat("y", 20000) + "\n"
	for _, tc := range []struct {
		name string
		room bool // room on the disk at the handover: the spool is written, the exec fails
	}{
		{"disk full at the handover", false},
		{"exec fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := mountSmallTmpfs(t, "256k")
			tmp := t.TempDir()
			gates := []string{filepath.Join(tmp, "1"), filepath.Join(tmp, "2"), filepath.Join(tmp, "3")}
			open := func(i int) {
				t.Helper()
				if err := os.WriteFile(gates[i], nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			st := store.NewMemory()
			r1 := newCrashableWith(t, st, func(c *Config) { c.StateDir = dir })
			rec, err := r1.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: append([]string{"sh", "-c", script}, gates...)})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, r1.Reactor, rec.ID, "first\n")
			fillUp(t, dir)
			open(0)
			waitOutput(t, r1.Reactor, rec.ID, "first\n"+ys)
			if tc.room {
				if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
					t.Fatal(err)
				}
			}
			execErr := errors.New("exec failed")
			err = r1.Handover(context.Background(), 2*time.Second, func(Handover) error { return execErr })
			if err == nil || tc.room && !errors.Is(err, execErr) {
				t.Fatalf("handover: %v, want it to fail", err)
			}
			if tc.room {
				fillUp(t, dir)
			}
			open(1)
			waitOutput(t, r1.Reactor, rec.ID, "first\n"+ys+"second\n")
			r2 := r1.crashAndAdopt(t)
			if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
				t.Fatal(err)
			}
			open(2)
			got := r2.wait(rec.ID)
			if outcome(got) != api.OutcomeExited || got.ExitCode == nil || *got.ExitCode != 3 {
				t.Errorf("outcome %s exit %s, want exited 3", outcome(got), exitCode(got))
			}
			want := "first\n" + ys + "second\nlast\n"
			out := r2.stdout(rec.ID)
			if !got.Stdout.Truncated && (out != want || got.Stdout.TotalBytes != int64(len(want))) {
				t.Errorf("stdout %d of %d bytes, record %+v: want all of it, or truncated", len(out), len(want), got.Stdout)
			}
		})
	}
}
