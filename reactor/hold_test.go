package reactor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
)

// write is one transition a logStore was asked to write.
type write struct {
	id       string
	from, to api.State
}

// logStore is a Memory store that keeps every transition it is asked for,
// in order.
type logStore struct {
	store.Store
	mu     sync.Mutex
	writes []write
}

func (s *logStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	s.mu.Lock()
	s.writes = append(s.writes, write{rec.ID, from, rec.State})
	s.mu.Unlock()
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// of returns the writes of execution id.
func (s *logStore) of(id string) []write {
	s.mu.Lock()
	defer s.mu.Unlock()
	var w []write
	for _, x := range s.writes {
		if x.id == id {
			w = append(w, x)
		}
	}
	return w
}

// wrote reports whether a record of id at state st was asked for.
func (s *logStore) wrote(id string, st api.State) bool {
	for _, w := range s.of(id) {
		if w.to == st {
			return true
		}
	}
	return false
}

// stuckBackend is the process-group backend whose scopes' Remove waits for
// release (a slow cleanup: systemd's stop of a scope), and says on removing
// when one began.
type stuckBackend struct {
	scope.Backend
	release  chan struct{}
	removing chan struct{}
	once     sync.Once
}

func newStuckBackend() *stuckBackend {
	return &stuckBackend{Backend: scope.NewPgroup(), release: make(chan struct{}), removing: make(chan struct{}, 16)}
}

func (b *stuckBackend) Release() { b.once.Do(func() { close(b.release) }) }

func (b *stuckBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &stuckScope{Scope: sc, b: b}, nil
}

type stuckScope struct {
	scope.Scope
	b *stuckBackend
}

func (s *stuckScope) Remove() error {
	select {
	case s.b.removing <- struct{}{}:
	default:
	}
	<-s.b.release
	return s.Scope.Remove()
}

// writeExitsAtOnce makes the reactors t starts next write every exited
// record at once, unheld, for the tests of what that record carries; call
// it before newTestReactor (the reactor tests run one at a time).
func writeExitsAtOnce(t *testing.T) { holdExitsFor(t, 0) }

// holdExitsFor sets holdExitMax to d for the reactors t starts next, as
// writeExitsAtOnce does for 0.
func holdExitsFor(t *testing.T, d time.Duration) {
	old := holdExitMax
	holdExitMax = d
	t.Cleanup(func() { holdExitMax = old }) // after the reactor's shutdown
}

// stuckReactor is a reactor over st whose scopes' removal hangs until
// b.Release.
func stuckReactor(t *testing.T, st store.Store) (*testReactor, *stuckBackend) {
	b := newStuckBackend()
	tr := newTestReactor(t, func(c *Config) { c.Store = st; c.Backend = b })
	t.Cleanup(b.Release) // before the reactor's shutdown
	return tr, b
}

// startToStuckRemoval starts p on tr and returns once its cleanup began
// the scope's removal, which hangs (stuckReactor).
func startToStuckRemoval(t *testing.T, ctx context.Context, tr *testReactor, b *stuckBackend, p api.StartParams) api.Record {
	t.Helper()
	rec, err := tr.Start(ctx, root, p)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.removing:
	case <-time.After(10 * time.Second):
		t.Fatal("cleanup did not begin the scope's removal within 10s")
	}
	return rec
}

// TestExitHeldForTheCleanedRecord: an execution nobody follows, whose
// cleanup is quick, is written twice after its start, running and then
// cleaned (from exited), which carries its outcome: no exited record of its
// own is queued (hold.go). Before, every execution wrote exited too, one
// commit more between the exit and exec.wait's answer.
func TestExitHeldForTheCleanedRecord(t *testing.T) {
	holdExitsFor(t, time.Minute) // a cleanup slowed by a loaded host is still merged
	st := &logStore{Store: store.NewMemory()}
	tr := newTestReactor(t, func(c *Config) { c.Store = st })
	rec := tr.run(api.StartParams{Cwd: "/", Argv: []string{"true"}})
	if rec.Outcome == nil || *rec.Outcome != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Fatalf("cleaned record: outcome %v, exit code %v; want exited, 0", rec.Outcome, rec.ExitCode)
	}
	got := st.of(rec.ID)
	want := []write{{rec.ID, api.StateStarted, api.StateRunning}, {rec.ID, api.StateExited, api.StateCleaned}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("writes after the start = %v, want %v", got, want)
	}
	stored, ok, err := st.Get(rec.ID)
	if err != nil || !ok || stored.State != api.StateCleaned || stored.Outcome == nil || *stored.Outcome != api.OutcomeExited {
		t.Fatalf("stored record = %+v, %v, %v; want cleaned with outcome exited", stored, ok, err)
	}
}

// TestHeldExitWrittenWhenCleanupIsSlow: while the scope's removal takes
// long, the exited record is written within holdExitMax of the exit, not
// left for the cleaned one: the outcome is durable though cleaned is not.
func TestHeldExitWrittenWhenCleanupIsSlow(t *testing.T) {
	st := &logStore{Store: store.NewMemory()}
	tr, b := stuckReactor(t, st)
	rec := startToStuckRemoval(t, context.Background(), tr, b, api.StartParams{Cwd: "/", Argv: []string{"true"}})
	deadline := time.Now().Add(10 * time.Second)
	for !st.wrote(rec.ID, api.StateExited) {
		if time.Now().After(deadline) {
			t.Fatalf("exited record not written within 10s while the removal hangs; writes %v", st.of(rec.ID))
		}
		time.Sleep(time.Millisecond)
	}
	if st.wrote(rec.ID, api.StateCleaned) {
		t.Fatalf("cleaned written while the scope's removal hangs: %v", st.of(rec.ID))
	}
	b.Release()
	if got := tr.wait(rec.ID); got.Outcome == nil || *got.Outcome != api.OutcomeExited {
		t.Fatalf("outcome %v, want exited", got.Outcome)
	}
}

// TestFollowerOfAHeldExitToldOnceDurable: a follower that comes while the
// exited record is held is told of exited only once that record is in the
// store, and then of cleaned: holding a record nobody was told of never
// shows a client a state the store does not have.
func TestFollowerOfAHeldExitToldOnceDurable(t *testing.T) {
	holdExitsFor(t, time.Minute) // the hold outlasts the follow
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &logStore{Store: store.NewMemory()}
	tr, b := stuckReactor(t, st)
	rec := startToStuckRemoval(t, ctx, tr, b, api.StartParams{Cwd: "/", Argv: []string{"true"}})
	if st.wrote(rec.ID, api.StateExited) {
		t.Fatalf("exited written although nobody follows and the hold is a minute: %v", st.of(rec.ID))
	}
	var (
		mu       sync.Mutex
		states   []api.State
		durable  []api.State // the stored state when each was told
		gotState = make(chan api.State, 8)
	)
	notify := func(method string, params any) bool {
		if method != api.NotifyState {
			return true
		}
		l := newStateLog()
		l.notify(method, params)
		s := <-l.seen
		stored, _, _ := st.Get(rec.ID)
		mu.Lock()
		states = append(states, s)
		durable = append(durable, stored.State)
		mu.Unlock()
		gotState <- s
		return true
	}
	followed := make(chan error, 1)
	go func() {
		_, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, notify)
		followed <- err
	}()
	select {
	case s := <-gotState:
		if s != api.StateExited {
			t.Fatalf("first exec.state = %v, want exited", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exec.state within 10s of exec.follow")
	}
	b.Release()
	if err := <-followed; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range states {
		if durable[i] < s {
			t.Errorf("told %v while the store had %v (states told %v)", s, durable[i], states)
		}
	}
}

// TestHeldExitToldOnlyOnceDurable: while an exit is held (nobody follows,
// the cleanup under way), the answers that tell a state — an idempotent
// exec.start, exec.wait's timeout answer, exec.cancel — tell exited only
// once its record is durable: each writes the held record and waits for
// the store's answer, which this store keeps back until it is let go.
// Before, the first two answered exited at once while the store had running
// (review of aa11af8). exec.get is answered from memory by design and is
// not checked here.
func TestHeldExitToldOnlyOnceDurable(t *testing.T) {
	for _, hold := range []time.Duration{time.Minute, 5 * time.Millisecond} {
		t.Run(hold.String(), func(t *testing.T) {
			holdExitsFor(t, hold)
			st := &heldExitStore{Store: store.NewMemory(), release: make(chan struct{}), cleaned: make(chan string, 1)}
			var let sync.Once
			letGo := func() { let.Do(func() { close(st.release) }) }
			tr, b := stuckReactor(t, st)
			t.Cleanup(letGo) // before the reactor's shutdown
			ctx := context.Background()
			p := api.StartParams{Cwd: "/", Argv: []string{"true"}, ID: "held-exit-idempotent"}
			rec := startToStuckRemoval(t, ctx, tr, b, p) // exited, its record held

			type answer struct {
				what  string
				rec   api.Record
				err   error
				early bool // came before the exited record's commit was let go
			}
			var durable atomic.Bool
			answers := make(chan answer, 2)
			go func() {
				got, err := tr.Start(ctx, root, p)
				answers <- answer{"idempotent exec.start", got, err, !durable.Load()}
			}()
			go func() {
				zero := int64(0)
				got, err := tr.Wait(ctx, root, api.WaitParams{ID: rec.ID, TimeoutMS: &zero})
				answers <- answer{"exec.wait's timeout answer", got, err, !durable.Load()}
			}()
			time.Sleep(50 * time.Millisecond) // an answer that does not wait comes within this
			durable.Store(true)
			letGo()
			for range 2 {
				select {
				case a := <-answers:
					switch {
					case a.err != nil:
						t.Errorf("%s: %v", a.what, a.err)
					case a.early && a.rec.State >= api.StateExited:
						t.Errorf("%s told %v before its record was durable", a.what, a.rec.State)
					case a.rec.State != api.StateExited:
						t.Errorf("%s told %v, want exited", a.what, a.rec.State)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no answer within 10s of the exited record's commit")
				}
			}
			c, err := tr.Cancel(ctx, root, api.CancelParams{ID: rec.ID})
			if err != nil || c.State != api.StateExited {
				t.Errorf("exec.cancel = %v, %v; want exited, durable by now", c.State, err)
			}
			b.Release()
			tr.wait(rec.ID)
		})
	}
}

// failOnce is a Memory store whose first transition to state st fails
// without writing (a full disk, for one commit).
type failOnce struct {
	store.Store
	st     api.State
	failed atomic.Bool
}

func (s *failOnce) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	if rec.State == s.st && s.failed.CompareAndSwap(false, true) {
		done(store.Result{Err: errors.New("disk full")})
		return
	}
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestRetriedExitKeepsTheOutput: an exited record whose write failed is
// written again by the retry (retryDirty) with the kept output, as its
// first write had it: without a spool, a crash of corrald before cleaned
// would otherwise leave the outcome with none of the output (the retry
// wrote the record alone).
func TestRetriedExitKeepsTheOutput(t *testing.T) {
	writeExitsAtOnce(t)
	st := &failOnce{Store: store.NewMemory(), st: api.StateExited}
	tr, b := stuckReactor(t, st)
	rec := startToStuckRemoval(t, context.Background(), tr, b, api.StartParams{Cwd: "/", Argv: []string{"echo", "kept before the exit"}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		stored, _, _ := st.Get(rec.ID)
		if stored.State == api.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exited record not rewritten within 10s of its failed write (stored state %v, failed %v)", stored.State, st.failed.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out, ok, err := st.Output(rec.ID, "stdout")
	if err != nil || !ok || string(out.Head) != "kept before the exit\n" {
		t.Errorf("stored stdout with the retried exited record = %q (ok %v, err %v), want the kept output", out.Head, ok, err)
	}
	b.Release()
	tr.wait(rec.ID)
}

// storedStateIs waits up to 10 s for st's record id to be in state want.
func storedStateIs(t *testing.T, st store.Store, id string, want api.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stored, _, _ := st.Get(id)
		if stored.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s not %v within 10s (stored state %v)", id, want, stored.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRetriedCleanedDropsSpools: a cleaned record written by the retry
// (its first write failed) closes and removes the execution's spools once
// it is durable, as the first write does: the retry left both spool fds
// open for the daemon's life and their files in the state directory.
func TestRetriedCleanedDropsSpools(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	st := &failOnce{Store: store.NewMemory(), st: api.StateCleaned}
	fs := &fakeFdStore{fds: map[string]int{}}
	tr := newTestReactor(t, func(c *Config) { c.Store, c.FdStore, c.StateDir = st, fs, dir })
	rec, err := tr.Start(context.Background(), root, api.StartParams{Cwd: "/", Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	storedStateIs(t, st, rec.ID, api.StateCleaned)
	if !st.failed.Load() {
		t.Fatal("the cleaned write did not fail first")
	}
	// The retry's follow-up runs on the loop after the store's answer.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(SpoolDir(dir), "*"))
		open := spoolFdsOpen(dir)
		if len(left) == 0 && len(open) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the retried cleaned record: spool files %v, spool fds open %v", left, open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spoolFdsOpen lists this process's fds open on files of dir's spool
// directory.
func spoolFdsOpen(dir string) []string {
	var open []string
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && filepath.Dir(l) == SpoolDir(dir) {
			open = append(open, e.Name()+" -> "+l)
		}
	}
	return open
}

// TestExitedWithoutAWorkingSpoolKeepsOutput: with spooling on but no spool
// for this execution (its directory cannot be made), the exited record
// carries the kept output, as without spooling: it used to go out with
// none, and a crash before cleaned lost the output.
func TestExitedWithoutAWorkingSpoolKeepsOutput(t *testing.T) {
	writeExitsAtOnce(t)
	dir := t.TempDir()
	if err := os.WriteFile(SpoolDir(dir), nil, 0o600); err != nil { // a file where the directory goes
		t.Fatal(err)
	}
	st := store.NewMemory()
	fs := &fakeFdStore{fds: map[string]int{}}
	b := newStuckBackend()
	tr := newTestReactor(t, func(c *Config) { c.Store, c.FdStore, c.StateDir, c.Backend = st, fs, dir, b })
	t.Cleanup(b.Release)
	rec := startToStuckRemoval(t, context.Background(), tr, b, api.StartParams{Cwd: "/", Argv: []string{"echo", "kept before the exit"}})
	storedStateIs(t, st, rec.ID, api.StateExited)
	out, ok, err := st.Output(rec.ID, "stdout")
	if err != nil || !ok || string(out.Head) != "kept before the exit\n" {
		t.Errorf("stored stdout with the exited record (no spool for it) = %q (ok %v, err %v), want the kept output", out.Head, ok, err)
	}
	b.Release()
	tr.wait(rec.ID)
}
