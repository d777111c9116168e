package reactor

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testenv"
)

// heldCancelStore keeps every canceling transition from the store until
// release is closed (then writes it), or for ever once crash is closed (a
// crash of corrald before the write). asked says when one was asked for.
type heldCancelStore struct {
	store.Store
	release, crash chan struct{}
	asked          chan string // ids whose canceling transition was asked for
	once           [2]sync.Once
}

// Release writes what is held and all later canceling transitions.
func (s *heldCancelStore) Release() { s.once[0].Do(func() { close(s.release) }) }

// Crash drops what is held and all later canceling transitions.
func (s *heldCancelStore) Crash() { s.once[1].Do(func() { close(s.crash) }) }

// crashLoser is a test store wrapper holding writes or answers back: at a
// crash (crashAndAdopt) it lets go of them and returns the store it wraps,
// which the next reactor writes through.
type crashLoser interface{ crashed() store.Store }

func (s *heldCancelStore) crashed() store.Store { s.Crash(); return s.Store }

func newHeldCancelStore() *heldCancelStore {
	return &heldCancelStore{Store: store.NewMemory(), release: make(chan struct{}),
		crash: make(chan struct{}), asked: make(chan string, 4)}
}

func (s *heldCancelStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	if rec.State != api.StateCanceling {
		s.Store.TransitionFunc(from, rec, done, outs...)
		return
	}
	s.asked <- rec.ID
	go func() {
		select {
		case <-s.release:
			s.Store.TransitionFunc(from, rec, done, outs...)
		case <-s.crash:
		}
	}()
}

// crashable is a reactor run without the test's cleanup: crash stops its
// loop as a kill -9 would (no shutdown, nothing more written), and
// readopt hands what the store and the fd store hold to a new reactor.
type crashable struct {
	*Reactor
	st      store.Store
	fs      *fakeFdStore
	dir     string
	stop    context.CancelFunc
	done    chan error
	crashed bool
}

func newCrashable(t *testing.T, st store.Store) *crashable { return newCrashableWith(t, st, nil) }

// newCrashableWith is newCrashable with the config changed by mod (a
// backend, a state directory of the test's own).
func newCrashableWith(t *testing.T, st store.Store, mod func(*Config)) *crashable {
	t.Helper()
	testenv.SkipRoot(t, "children run as the caller's uid")
	c := &crashable{st: st, fs: &fakeFdStore{fds: map[string]int{}}, done: make(chan error, 1)}
	cfg := Config{
		Backend: scope.NewPgroup(), Store: st, FdStore: c.fs, StateDir: t.TempDir(),
		Log:      zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		KillWait: 2 * time.Second, SocketGID: -1,
	}
	if mod != nil {
		mod(&cfg)
	}
	c.dir = cfg.StateDir
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Reactor = r
	var ctx context.Context
	ctx, c.stop = context.WithCancel(context.Background())
	go func() { c.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if !c.crashed {
			c.crashAndAdopt(t) // ends what is left through a second reactor
		}
	})
	return c
}

// crashAndAdopt stops c's loop without a shutdown and returns a new
// reactor that took over every unfinished execution from c's stores.
func (c *crashable) crashAndAdopt(t *testing.T) *testReactor {
	t.Helper()
	st := c.crash(t)
	adopt := c.adoptees(t, st)
	return newTestReactor(t, func(cfg *Config) {
		cfg.Store, cfg.FdStore, cfg.StateDir, cfg.Adopt, cfg.Subreaper = st, c.fs, c.dir, adopt, false
	})
}

// crash stops c's loop without a shutdown and closes what it held, and
// returns the store the next reactor writes through.
func (c *crashable) crash(t *testing.T) store.Store {
	t.Helper()
	c.crashed = true
	c.stop()
	if err := <-c.done; err != nil {
		t.Fatal(err)
	}
	// What the crashed reactor held dies with it in a real crash.
	for _, e := range c.execs {
		for _, s := range e.streams {
			if s != nil && s.fd >= 0 {
				unix.Close(s.fd)
			}
			if s != nil {
				s.spool.close()
			}
		}
		if e.pidfd >= 0 {
			unix.Close(e.pidfd)
		}
		if e.proc != nil {
			_ = e.proc.Release() // its pidfd (os.Process's own)
		}
		if e.stdin != nil && e.stdin.fd >= 0 {
			unix.Close(e.stdin.fd)
		}
	}
	st := c.st
	if h, ok := st.(crashLoser); ok {
		st = h.crashed() // the crash lost what it held; the next reactor writes through
	}
	return st
}

// adoptees is what a restarted corrald takes over from st and c's fd store
// (as cmd/corrald's survival.plan does): every unfinished record, with its
// params and the fds passed back for it.
func (c *crashable) adoptees(t *testing.T, st store.Store) []Adoptee {
	t.Helper()
	recs, err := st.Unfinished()
	if err != nil {
		t.Fatal(err)
	}
	var adopt []Adoptee
	for _, rec := range recs {
		var p api.StartParams
		b, _, _ := st.Params(rec.ID)
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		adopt = append(adopt, Adoptee{Record: rec, Params: p, Fds: c.fs.passBack(t, rec.ID)})
	}
	return adopt
}

// TestCancelAnswerMeansDurable: an exec.cancel that was answered stays
// a cancel across a crash of corrald. Before, the answer went out as soon
// as the canceling record was queued for the store, and the tree was
// signalled at once: a kill -9 then left the store saying running, the
// restarted corrald re-adopted the execution as running, and the child's
// own reaction to the SIGTERM (here, as a shell's trap may, exit 0) ended
// it exited 0 (tests/drill sd-kill-9: a cancelled execution "exited" 0).
// Now the answer waits for the canceling record to come back from the
// store, and the tree is signalled only then: while the write is held,
// neither the answer nor the SIGTERM goes out; once it is written, both
// do, and a crash right after the answer ends the execution cancelled,
// with its reason.
func TestCancelAnswerMeansDurable(t *testing.T) {
	st := newHeldCancelStore()
	r1 := newCrashable(t, st)
	ctx := context.Background()
	rec, err := r1.Start(ctx, root, api.StartParams{Cwd: "/", GraceMS: 10000,
		Argv: []string{"sh", "-c", `trap 'echo term; sleep 2; exit 0' TERM; echo ready; sleep 30 & wait`}})
	if err != nil || rec.State != api.StateRunning {
		t.Fatalf("Start = %v, %v", rec.State, err)
	}
	id := rec.ID
	waitOutput(t, r1.Reactor, id, "ready\n")
	type answer struct {
		rec api.Record
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		rec, err := r1.Cancel(ctx, root, api.CancelParams{ID: id, Reason: "test: cancel then crash"})
		answered <- answer{rec, err}
	}()
	<-st.asked
	var a answer
	select {
	case a = <-answered:
		t.Errorf("exec.cancel answered (state %s) while its canceling record was not written", a.rec.State)
	case <-time.After(300 * time.Millisecond):
		// The SIGTERM waits for the write too: the trap has not run.
		if out, _ := r1.Output(ctx, root, api.OutputParams{ID: id}); strings.Contains(string(out.Data), "term") {
			t.Errorf("the tree was signalled before its canceling record was written (stdout %q)", out.Data)
		}
		st.Release()
		a = <-answered
	}
	if a.err != nil || a.rec.State != api.StateCanceling || a.rec.CancelReason != "test: cancel then crash" {
		t.Fatalf("Cancel = state %s reason %q, %v; want canceling with the reason", a.rec.State, a.rec.CancelReason, a.err)
	}
	r2 := r1.crashAndAdopt(t) // nothing held is written from here on
	final := r2.wait(id)
	if outcome(final) != api.OutcomeCancelled || final.CancelReason != "test: cancel then crash" || final.Adopted != 1 {
		t.Errorf("after an answered cancel and a crash: outcome %s (exit %v, error %q), cancel_reason %q, adopted %d; want cancelled with the reason, adopted 1",
			outcome(final), exitCode(final), strOrEmpty(final.Error), final.CancelReason, final.Adopted)
	}
}

// TestCancelSignalsDespiteSlowStore: a store that does not write the
// canceling record does not hold the cancel back for ever: the tree is
// signalled after cancelCommitWait, and the answer follows the write.
func TestCancelSignalsDespiteSlowStore(t *testing.T) {
	st := newHeldCancelStore()
	r := newTestReactor(t, func(c *Config) { c.Store = st })
	t.Cleanup(st.Release) // before the reactor's shutdown: cleanups run last first
	ctx := context.Background()
	rec, err := r.Start(ctx, root, api.StartParams{Cwd: "/", GraceMS: 10000,
		Argv: []string{"sh", "-c", `trap 'echo term; exit 0' TERM; echo ready; sleep 30 & wait`}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r.Reactor, rec.ID, "ready\n")
	answered := make(chan error, 1)
	t0 := time.Now()
	go func() {
		_, err := r.Cancel(ctx, root, api.CancelParams{ID: rec.ID})
		answered <- err
	}()
	<-st.asked
	waitOutput(t, r.Reactor, rec.ID, "ready\nterm\n")
	if took := time.Since(t0); took < cancelCommitWait {
		t.Errorf("signalled after %v, before the canceling record was written or %v passed", took, cancelCommitWait)
	}
	select {
	case err := <-answered:
		t.Errorf("exec.cancel answered (%v) while its canceling record was not written", err)
		st.Release()
	default:
		st.Release()
		if err := <-answered; err != nil {
			t.Fatalf("Cancel = %v", err)
		}
	}
	if final := r.wait(rec.ID); outcome(final) != api.OutcomeCancelled {
		t.Errorf("outcome %s, want cancelled", outcome(final))
	}
}

// waitOutput waits up to 10 s for id's stdout to be want.
func waitOutput(t *testing.T, r *Reactor, id, want string) {
	t.Helper()
	var got []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, err := r.Output(context.Background(), root, api.OutputParams{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if got = out.Data; string(got) == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("stdout %q, want %q", got, want)
}

// exitCode is rec's exit code, or "none".
func exitCode(rec api.Record) string {
	if rec.ExitCode == nil {
		return "none"
	}
	return strconv.Itoa(*rec.ExitCode)
}

// TestCancelOutcomeSurvivesCrash: an execution corral was ending for a
// limit keeps that outcome across a crash. The canceling record says which
// (cancel_outcome); before, a restarted corrald guessed from the record,
// and an idle_timeout (or memory_limit) came out cancelled.
func TestCancelOutcomeSurvivesCrash(t *testing.T) {
	st := store.NewMemory()
	r1 := newCrashable(t, st)
	ctx := context.Background()
	// The whole tree ignores SIGTERM: it is still canceling at the crash.
	rec, err := r1.Start(ctx, root, api.StartParams{Cwd: "/", GraceMS: 20000, IdleTimeoutMS: 200,
		Argv: []string{"sh", "-c", `trap '' TERM; echo ready; sleep 30`}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, ok, err := st.Get(rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok && got.State == api.StateCanceling {
			if got.CancelOutcome != api.OutcomeIdleTimeout {
				t.Errorf("canceling record: cancel_outcome %q, want idle_timeout", got.CancelOutcome)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no canceling record within 10s (state %v)", got.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r2 := r1.crashAndAdopt(t)
	final := r2.wait(rec.ID)
	if outcome(final) != api.OutcomeIdleTimeout || final.Adopted != 1 || final.CancelOutcome != "" {
		t.Errorf("idle limit canceling at the crash: outcome %s, adopted %d, cancel_outcome %q; want idle_timeout, adopted 1, no cancel_outcome once exited",
			outcome(final), final.Adopted, final.CancelOutcome)
	}
}
