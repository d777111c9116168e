package store

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/testenv"
)

func TestReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // Open creates it
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	rec := newRecord("keep", 1000, 0, map[string]string{"k": "v"})
	mustCreate(t, s, rec)
	fin := finished(rec, nil)
	out := KeptOutput{Head: []byte("head"), Tail: []byte("tail"), TailOffset: 100, Total: 104}
	mustTransition(t, s, api.StateStarted, fin, Output{Stdout, out})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	for _, name := range []string{dir, filepath.Join(dir, FileName)} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s mode = %v, want no access for group and others", name, perm)
		}
	}

	s2 := openTemp(t, dir)
	if got := mustGet(t, s2, "keep"); jsonOf(t, got) != jsonOf(t, fin) {
		t.Errorf("after reopen Get = %s, want %s", jsonOf(t, got), jsonOf(t, fin))
	}
	if got, ok, err := s2.Output("keep", Stdout); err != nil || !ok || !keptEqual(got, out) {
		t.Errorf("after reopen Output = %+v, %v, %v; want %+v", got, ok, err, out)
	}
	if got, _ := s2.List(ListFilter{Labels: map[string]string{"k": "v"}}); ids(got) != "keep" {
		t.Errorf("after reopen List(label) = %q, want keep", ids(got))
	}
	if err := <-s2.Create(newRecord("keep", 1000, 0, nil), nil); !errors.Is(err, ErrExists) {
		t.Errorf("after reopen Create(known id) = %v, want ErrExists (idempotency keys survive restarts)", err)
	}
	var version int
	if err := s2.rdb.QueryRow(`SELECT MAX(version) FROM schema_version`).Scan(&version); err != nil || version != SchemaVersion {
		t.Errorf("schema version = %d, %v; want %d", version, err, SchemaVersion)
	}
}

// TestSecondOpenRefused checks that two stores (two daemons) never share a
// state directory, and that Close releases it.
func TestSecondOpenRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, testLogger(t))
	if err == nil {
		s2.Close()
		s.Close()
		t.Fatalf("second Open of %s = nil error, want 'in use'", dir)
	}
	if want := fmt.Sprintf("in use by pid %d", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("second Open = %q, want it to say %q", err, want)
	}
	mustCreate(t, s, newRecord("still", 1000, 0, nil)) // the first one is unaffected
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3 := openTemp(t, dir)
	mustGet(t, s3, "still")
}

func TestGroupCommit(t *testing.T) {
	s := openTemp(t, t.TempDir())
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			rec := newRecord(fmt.Sprintf("g%d", i), 1000, i, nil)
			if err := <-s.Create(rec, nil); err != nil {
				errs <- err
				return
			}
			rec.State = api.StateRunning
			if r := <-s.Transition(api.StateStarted, rec); r.Err != nil || !r.Applied {
				errs <- fmt.Errorf("transition %s: %+v", rec.ID, r)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Writes != 2*n {
		t.Errorf("Stats().Writes = %d, want %d", st.Writes, 2*n)
	}
	// Every write waited for its own fsync, yet far fewer commits ran.
	if st.Commits > st.Writes/4 {
		t.Errorf("Stats().Commits = %d for %d writes, want at most %d (group commit)", st.Commits, st.Writes, st.Writes/4)
	}
	t.Logf("%d writes in %d commits", st.Writes, st.Commits)
	got, err := s.List(ListFilter{State: ptr(api.StateRunning)})
	if err != nil || len(got) != n {
		t.Errorf("List(running) = %d records, %v; want %d", len(got), err, n)
	}
}

// TestOneBadWriteInABatch checks that a write failing inside a batch fails
// alone: the others in the same transaction are retried and committed.
func TestOneBadWriteInABatch(t *testing.T) {
	s := openTemp(t, t.TempDir())
	// Hold the writer inside a batch so that every write below joins it
	// (the gate is retried alone with them when the batch fails).
	gate := newGate()
	s.enqueue(gate)
	<-gate.entered
	var chans []<-chan error
	for i := range 10 {
		chans = append(chans, s.Create(newRecord(fmt.Sprintf("b%d", i), 1000, i, nil), nil))
		if i == 5 {
			op := failingOp{make(chan error, 1)}
			s.enqueue(op)
			chans = append(chans, op.ch)
		}
	}
	close(gate.release)
	if err := <-gate.ch; err != nil {
		t.Fatalf("gate: %v", err)
	}
	for i, ch := range chans {
		err := <-ch
		if (i == 6) != (err != nil) {
			t.Errorf("write %d = %v, want error only for the bad one (6)", i, err)
		}
	}
	if got, _ := s.List(ListFilter{}); len(got) != 10 {
		t.Errorf("List = %d records, want 10", len(got))
	}
	// The writes after the bad one succeeded: the store is healthy.
	if err := s.Health(); err != nil {
		t.Errorf("Health() = %v after later writes succeeded, want nil", err)
	}
	op := failingOp{make(chan error, 1)}
	s.enqueue(op)
	if err := <-op.ch; err == nil {
		t.Fatalf("failing write succeeded")
	}
	if err := s.Health(); err == nil {
		t.Errorf("Health() = nil after the last write failed, want the error")
	}
	mustCreate(t, s, newRecord("after", 1000, 0, nil))
	if err := s.Health(); err != nil {
		t.Errorf("Health() = %v after a successful write, want nil", err)
	}
}

type failingOp struct{ ch chan error }

func (op failingOp) apply(ctx context.Context, s *SQLite) error {
	_, err := s.w.conn.(driver.ExecerContext).ExecContext(ctx, `INSERT INTO no_such_table VALUES (1)`, nil)
	return err
}
func (op failingOp) finish(err error) { op.ch <- err }

// gateOp is a write that holds the writer until release is closed.
// Applied again (a failed batch's writes are retried alone), it passes.
type gateOp struct {
	entered, release chan struct{}
	ch               chan error
}

func newGate() gateOp {
	return gateOp{entered: make(chan struct{}), release: make(chan struct{}), ch: make(chan error, 1)}
}

func (op gateOp) apply(ctx context.Context, s *SQLite) error {
	select {
	case <-op.entered:
	default:
		close(op.entered)
	}
	<-op.release
	return nil
}
func (op gateOp) finish(err error) { op.ch <- err }

func TestCorruptFile(t *testing.T) {
	garbage := bytes.Repeat([]byte("this is not a sqlite database. "), 512)
	for _, tc := range []struct {
		name    string
		content []byte
		want    string
	}{
		{"garbage", garbage, "not a database"},
		{"truncated header", []byte("SQLite format 3\x00\x10\x00"), "corral.db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir, testLogger(t))
			if err == nil {
				s.Close()
				t.Fatalf("Open(corrupt file) = nil error, want one")
			}
			t.Logf("Open(%s) = %v", tc.name, err)
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open(corrupt file) = %q, want it to name %s and say %q", err, path, tc.want)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, tc.content) {
				t.Errorf("Open changed the corrupt file")
			}
		})
	}
}

// TestCorruptPage damages a page in the middle of a valid database: Open
// must refuse it rather than run on it.
func TestCorruptPage(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		rec := newRecord(fmt.Sprintf("p%d", i), 1000, i, map[string]string{"n": fmt.Sprint(i)})
		mustCreate(t, s, rec)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close the WAL is still there (%v), want it checkpointed and removed", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if fi.Size() < 8*4096 {
		t.Fatalf("database is only %d bytes", fi.Size())
	}
	// Scribble over the middle of every page but the first (the header).
	junk := bytes.Repeat([]byte{0xa5}, 512)
	for off := int64(4096); off+4096 <= fi.Size(); off += 4096 {
		if _, err := f.WriteAt(junk, off+1024); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if s, err := Open(dir, testLogger(t)); err == nil {
		s.Close()
		t.Fatalf("Open(database with damaged pages) = nil error, want one")
	} else {
		t.Logf("Open(damaged) = %v", err)
		if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("Open(damaged) = %q, want it to name %s and say it is corrupt", err, path)
		}
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO schema_version VALUES (?, 0)`, SchemaVersion+1)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(dir, testLogger(t)); err == nil || !strings.Contains(err.Error(), "newer") {
		if s != nil {
			s.Close()
		}
		t.Errorf("Open(newer schema) = %v, want a 'newer' error", err)
	}
}

// TestDiskFull fills a small tmpfs under the store: writes fail promptly with
// the error, Health reports it, reads keep working, and once space is back
// writes succeed and Health clears.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		testenv.Skipf(t, "cannot mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	s := openTemp(t, dir) // closed before the unmount (cleanups run last-in first-out)
	mustCreate(t, s, newRecord("before", 1000, 0, nil))

	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	f.Close()

	big := bytes.Repeat([]byte("x"), 512<<10) // more than the WAL already holds
	start := time.Now()
	err = <-s.Create(newRecord("full", 1000, 1, nil), big)
	if err == nil {
		t.Fatalf("Create on a full disk = nil, want an error")
	}
	if !strings.Contains(err.Error(), "full") {
		t.Errorf("Create on a full disk = %q, want it to say the disk is full", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Create on a full disk took %v, want a prompt error", d)
	}
	if h := s.Health(); h == nil {
		t.Errorf("Health() = nil on a full disk, want the error")
	}
	if _, ok, _ := s.Get("full"); ok {
		t.Errorf("failed Create left a record")
	}
	if _, ok, err := s.Get("before"); !ok || err != nil {
		t.Errorf("Get on a full disk = %v, %v; want the earlier record", ok, err)
	}

	// The record fits in SQLite's page cache: it is the write's commit,
	// writing the WAL, that fails (the INSERT's own, in autocommit), and
	// the writer's statements (prepared once, on the driver's connection)
	// must come out of it usable for a transaction and a lone write alike.

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, newRecord("after", 1000, 2, nil))
	if h := s.Health(); h != nil {
		t.Errorf("Health() = %v after space came back, want nil", h)
	}
	rec := mustGet(t, s, "after")
	rec.State = api.StateExited
	mustTransition(t, s, api.StateStarted, rec, Output{Stream: Stdout, Kept: KeptOutput{Head: []byte("out"), Total: 3, TailOffset: 3}})
	if k, ok, err := s.Output("after", Stdout); err != nil || !ok || string(k.Head) != "out" {
		t.Errorf("after: output %q, %v, %v after a transaction following the failed commit, want \"out\"", k.Head, ok, err)
	}
	rec = mustGet(t, s, "before")
	rec.State = api.StateRunning
	mustTransition(t, s, api.StateStarted, rec)
	if got := mustGet(t, s, "before"); got.State != api.StateRunning {
		t.Errorf("before: state %s after a transition following the failed commit, want running", got.State)
	}
}

// TestReadOnly opens an existing store through a read-only bind mount: Open
// fails with an error naming the file instead of running without writes.
func TestReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to bind-mount read-only")
	}
	dir, ro := t.TempDir(), t.TempDir()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, newRecord("x", 1000, 0, nil))
	s.Close()
	if err := syscall.Mount(dir, ro, "", syscall.MS_BIND, ""); err != nil {
		testenv.Skipf(t, "cannot bind-mount: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(ro, 0); err != nil {
			t.Errorf("unmount %s: %v", ro, err)
		}
	})
	if err := syscall.Mount("", ro, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		testenv.Skipf(t, "cannot remount read-only: %v", err)
	}
	s, err = Open(ro, testLogger(t))
	if err == nil {
		s.Close()
		t.Fatalf("Open(read-only) = nil error, want one")
	}
	if !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), ro) {
		t.Errorf("Open(read-only) = %q, want it to name %s and say read-only", err, ro)
	}
}

const crashChildEnv = "CORRAL_STORE_CRASH_CHILD"

// crashChild runs in a re-executed test binary: it writes records as fast as
// it can from several goroutines and prints "<id> <state>" for every write
// acknowledged as durable, until it is killed.
func crashChild(dir string) {
	log := zerolog.New(os.Stderr)
	s, err := Open(dir, log)
	if err != nil {
		log.Fatal().Err(err).Msg("open")
	}
	var mu sync.Mutex
	ack := func(id string, st api.State) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, "%s %d\n", id, int(st))
	}
	for w := 0; ; w++ {
		go func() {
			for i := 0; ; i++ {
				rec := newRecord(fmt.Sprintf("w%d-%d", w, i), 1000, i, nil)
				if err := <-s.Create(rec, []byte(`{}`)); err != nil {
					log.Fatal().Err(err).Msg("create")
				}
				ack(rec.ID, rec.State)
				rec.State = api.StateRunning
				if r := <-s.Transition(api.StateStarted, rec); r.Err != nil || !r.Applied {
					log.Fatal().Err(r.Err).Msg("transition")
				}
				ack(rec.ID, rec.State)
				rec = finished(rec, nil)
				out := Output{Stdout, KeptOutput{Head: []byte(rec.ID), TailOffset: int64(len(rec.ID)), Total: int64(len(rec.ID))}}
				if r := <-s.Transition(api.StateRunning, rec, out); r.Err != nil || !r.Applied {
					log.Fatal().Err(r.Err).Msg("transition")
				}
				ack(rec.ID, rec.State)
			}
		}()
		if w == 7 {
			select {}
		}
	}
}

// TestCrashDurability kills a writing process with SIGKILL and checks that
// every write it saw acknowledged is in the database afterwards.
func TestCrashDurability(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})

	acked := map[string]api.State{}
	sc := bufio.NewScanner(stdout)
	for len(acked) < 300 && sc.Scan() {
		var id string
		var st int
		if _, err := fmt.Sscanf(sc.Text(), "%s %d", &id, &st); err != nil {
			t.Fatalf("child wrote %q: %v", sc.Text(), err)
		}
		acked[id] = api.State(st)
	}
	if len(acked) < 300 {
		t.Fatalf("child stopped after %d acknowledged records; stderr: %s", len(acked), stderr.String())
	}
	cmd.Process.Signal(syscall.SIGKILL)
	// Acknowledgements already in the pipe count too.
	for sc.Scan() {
		var id string
		var st int
		if _, err := fmt.Sscanf(sc.Text(), "%s %d", &id, &st); err == nil {
			acked[id] = api.State(st)
		}
	}
	cmd.Wait()
	killed = true
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL; stderr: %s", cmd.ProcessState, stderr.String())
	}

	s := openTemp(t, dir)
	for id, st := range acked {
		rec, ok, err := s.Get(id)
		if err != nil || !ok {
			t.Errorf("acknowledged record %s missing after kill -9 (ok %v, err %v)", id, ok, err)
			continue
		}
		if rec.State < st {
			t.Errorf("record %s state = %s after kill -9, want at least the acknowledged %s", id, rec.State, st)
		}
		if rec.State == api.StateExited {
			if out, ok, _ := s.Output(id, Stdout); !ok || string(out.Head) != id {
				t.Errorf("record %s exited without its output (%q, %v)", id, out.Head, ok)
			}
		}
	}
	t.Logf("%d acknowledged records all present after SIGKILL", len(acked))
}

// BenchmarkTransitions measures durable transitions per second with many
// concurrent writers (as many executions changing state at once).
func BenchmarkTransitions(b *testing.B) {
	for _, sync := range []string{SyncFull, SyncNormal} {
		b.Run("sync="+sync, func(b *testing.B) {
			s, err := OpenOptions(b.TempDir(), zerolog.Nop(), Options{Synchronous: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const records = 256
			recs := make(chan api.Record, records)
			for i := range records {
				rec := newRecord(fmt.Sprintf("bench%d", i), 1000, i, map[string]string{"tool_call": "bench"})
				rec.Argv = []string{"python3", "-c", "print('hello world')"}
				if err := <-s.Create(rec, nil); err != nil {
					b.Fatal(err)
				}
				rec.State = api.StateRunning
				if r := <-s.Transition(api.StateStarted, rec); r.Err != nil {
					b.Fatal(r.Err)
				}
				recs <- rec
			}
			before := s.Stats()
			b.SetParallelism(64)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rec := <-recs
					rec.Usage.CPUUserMS++ // an update in place: running -> running
					if r := <-s.Transition(api.StateRunning, rec); r.Err != nil || !r.Applied {
						b.Errorf("transition: %+v", r)
					}
					recs <- rec
				}
			})
			b.StopTimer()
			st := s.Stats()
			writes, commits := st.Writes-before.Writes, st.Commits-before.Commits
			b.ReportMetric(float64(writes)/time.Since(start).Seconds(), "transitions/s")
			if commits > 0 {
				b.ReportMetric(float64(writes)/float64(commits), "writes/commit")
			}
		})
	}
}

// BenchmarkLifecycle is one execution's writes as the reactor makes them on
// a short command's exit path: created (awaited: before the fork), then
// running, exited and cleaned queued one after the other without waiting
// (the exit often comes before running is durable), each answered by
// callback. ns/op is one execution's store time, p99-ms its tail (a
// checkpoint inside a commit shows there); commits/op what it cost.
func BenchmarkLifecycle(b *testing.B) {
	s, err := OpenOptions(b.TempDir(), zerolog.Nop(), Options{Synchronous: SyncNormal})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	out := []Output{{Stream: Stdout, Kept: KeptOutput{Head: []byte("hello\n"), Total: 6, TailOffset: 6}},
		{Stream: Stderr, Kept: KeptOutput{}}}
	before := s.Stats()
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		rec := newRecord(fmt.Sprintf("life%d", i), 1000, i, map[string]string{"tool_call": "bench"})
		rec.Argv = []string{"/bin/true"}
		if err := <-s.Create(rec, nil); err != nil {
			b.Fatal(err)
		}
		done := make(chan Result, 3)
		cb := func(r Result) { done <- r }
		rec.State = api.StateRunning
		s.TransitionFunc(api.StateStarted, rec, cb)
		rec.State = api.StateExited
		s.TransitionFunc(api.StateRunning, rec, cb, out...)
		rec.State = api.StateCleaned
		s.TransitionFunc(api.StateExited, rec, cb, out...)
		for range 3 {
			if r := <-done; r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(st.Commits-before.Commits)/float64(b.N), "commits/op")
	b.ReportMetric(float64(st.ForcedCheckpoints-before.ForcedCheckpoints), "forced-ckpts")
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
}

// BenchmarkExitTransition is (b)'s store part: one record's running ->
// exited transition, alone in its commit, from the call to the answer (the
// writer's callback), as a followed execution's exit makes it.
func BenchmarkExitTransition(b *testing.B) {
	s, err := OpenOptions(b.TempDir(), zerolog.Nop(), Options{Synchronous: SyncNormal})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	took := make([]time.Duration, 0, b.N)
	done := make(chan Result, 1)
	cb := func(r Result) { done <- r }
	recs := make([]api.Record, b.N)
	for i := range b.N {
		rec := newRecord(fmt.Sprintf("exit%d", i), 1000, i, map[string]string{"tool_call": "bench"})
		rec.Argv = []string{"sleep", "60"}
		if err := <-s.Create(rec, nil); err != nil {
			b.Fatal(err)
		}
		rec.State = api.StateRunning
		if r := <-s.Transition(api.StateStarted, rec); r.Err != nil {
			b.Fatal(r.Err)
		}
		rec.State = api.StateExited
		recs[i] = rec
	}
	gap, _ := time.ParseDuration(os.Getenv("CORRAL_STORE_BENCH_GAP"))
	b.ResetTimer()
	for i := range b.N {
		if gap > 0 {
			time.Sleep(gap) // the writer parks between exits, as in (b)
		}
		t0 := time.Now()
		s.TransitionFunc(api.StateRunning, recs[i], cb)
		if r := <-done; r.Err != nil || !r.Applied {
			b.Fatalf("transition: %+v", r)
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2])/1e3, "p50-us")
	b.ReportMetric(float64(took[len(took)*99/100])/1e3, "p99-us")
}

// sqlOp is a write of arbitrary SQL, on the writer's connection.
type sqlOp struct {
	q  string
	ch chan error
}

func (op sqlOp) apply(ctx context.Context, s *SQLite) error {
	_, err := s.w.conn.(driver.ExecerContext).ExecContext(ctx, op.q, nil)
	return err
}
func (op sqlOp) finish(err error) { op.ch <- err }

// TestTransitionWithOutputIsAtomic: a lone write of one statement is its
// own transaction (autocommit), but a transition that writes kept output
// with it stays one transaction of both: when the output cannot be written,
// the record keeps its state, and a lone transition after it is applied.
func TestTransitionWithOutputIsAtomic(t *testing.T) {
	s := openTemp(t, t.TempDir())
	rec := newRecord("atomic", 1000, 0, nil)
	mustCreate(t, s, rec)
	rec.State = api.StateRunning
	mustTransition(t, s, api.StateStarted, rec)

	op := sqlOp{q: `CREATE TEMP TRIGGER outputs_refused BEFORE INSERT ON outputs
		BEGIN SELECT RAISE(ABORT, 'output refused'); END`, ch: make(chan error, 1)}
	s.enqueue(op)
	if err := <-op.ch; err != nil {
		t.Fatalf("create trigger: %v", err)
	}
	exited := rec
	exited.State = api.StateExited
	out := Output{Stream: Stdout, Kept: KeptOutput{Head: []byte("hi\n"), Total: 3, TailOffset: 3}}
	if r := <-s.Transition(api.StateRunning, exited, out); r.Err == nil {
		t.Fatalf("Transition with a refused output = %+v, want an error", r)
	}
	if got := mustGet(t, s, "atomic"); got.State != api.StateRunning {
		t.Errorf("state %s after a transition whose output failed, want running (nothing of it kept)", got.State)
	}
	mustTransition(t, s, api.StateRunning, exited)
	if got := mustGet(t, s, "atomic"); got.State != api.StateExited {
		t.Errorf("state %s after a lone transition, want exited", got.State)
	}
}
