package reactor

import (
	"context"
	"encoding/json"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// heldStore holds every write of one state from the store until Release,
// then writes it on a goroutine of its own, as the SQLite store's writer
// answers: asked says when one was asked for.
type heldStore struct {
	store.Store
	state   api.State
	release chan struct{}
	once    sync.Once
	asked   chan string
}

func (s *heldStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	if rec.State != s.state {
		s.Store.TransitionFunc(from, rec, done, outs...)
		return
	}
	s.asked <- rec.ID
	go func() {
		<-s.release
		s.Store.TransitionFunc(from, rec, done, outs...)
	}()
}

// Release lets the held writes (and those to come) through. Idempotent.
func (s *heldStore) Release() { s.once.Do(func() { close(s.release) }) }

// killAndWaitAsked SIGKILLs pid and waits up to 10 s for the store to be
// asked to write the held state's record.
func (s *heldStore) killAndWaitAsked(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.asked:
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s record was not sent to the store within 10s of the kill", s.state)
	}
}

// loopRoundTrip returns once tr's loop has run what was posted before.
func (tr *testReactor) loopRoundTrip(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := tr.onLoop(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
}

// blockLoop blocks tr's loop in posted work until letGo is called (at the
// latest when the test ends) and returns once the loop is blocked.
func (tr *testReactor) blockLoop(t *testing.T) (letGo func()) {
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	letGo = func() { once.Do(func() { close(unblock) }) }
	t.Cleanup(letGo)
	tr.post(func() { close(blocked); <-unblock })
	<-blocked
	return letGo
}

// startHeld starts a reactor whose store holds the writes of state (a
// Memory store behind) and, in it, a sleep 60 that runs. The store is
// released when the test ends, before the reactor's shutdown.
func startHeld(ctx context.Context, t *testing.T, state api.State) (*testReactor, *heldStore, api.Record) {
	t.Helper()
	st := &heldStore{Store: store.NewMemory(), state: state, release: make(chan struct{}), asked: make(chan string, 1)}
	tr := newTestReactor(t, func(c *Config) { c.Store = st })
	t.Cleanup(st.Release) // cleanups run last first: before the reactor's shutdown
	rec, err := tr.Start(ctx, root, api.StartParams{Cwd: "/", Argv: []string{"sleep", "60"}})
	if err != nil || rec.State != api.StateRunning {
		t.Fatalf("Start = %v, %v", rec.State, err)
	}
	return tr, st, rec
}

// stateLog is a follower's notify that keeps the states of the exec.state
// notifications it gets, in order, and signals each one on seen.
type stateLog struct {
	mu     sync.Mutex
	states []api.State
	seen   chan api.State
}

func newStateLog() *stateLog { return &stateLog{seen: make(chan api.State, 16)} }

func (l *stateLog) notify(method string, params any) bool {
	if method != api.NotifyState {
		return true
	}
	var st api.State
	switch p := params.(type) {
	case api.StateNotification:
		st = p.Record.State
	case json.RawMessage:
		var n api.StateNotification
		if err := json.Unmarshal(p, &n); err != nil {
			panic(err)
		}
		st = n.Record.State
	}
	l.mu.Lock()
	l.states = append(l.states, st)
	l.mu.Unlock()
	l.seen <- st
	return true
}

func (l *stateLog) got() []api.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]api.State(nil), l.states...)
}

// waitFor waits up to 10 s for an exec.state notification with state st.
func (l *stateLog) waitFor(t *testing.T, st api.State, while string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-l.seen:
			if s == st {
				return
			}
		case <-deadline:
			t.Fatalf("no exec.state %s within 10s %s (got %v)", st, while, l.got())
		}
	}
}

// TestExitedToldOnceDurableWithoutTheLoop: a follower hears of exited only
// once the store has written it, and from the store's answer itself: while
// the loop is busy (here blocked on purpose) the notification still
// arrives. Then cleaned follows, each state once and in order.
func TestExitedToldOnceDurableWithoutTheLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, st, rec := startHeld(ctx, t, api.StateExited)
	log := newStateLog()
	followed := make(chan error, 1)
	go func() {
		final, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, log.notify)
		if err == nil && final.State != api.StateCleaned {
			err = &api.Error{Message: "final record in state " + final.State.String()}
		}
		followed <- err
	}()
	log.waitFor(t, api.StateRunning, "after exec.follow (the current record)")
	st.killAndWaitAsked(t, rec.PID)
	// The loop has done all it does at the exit (a round trip behind it):
	// nothing may have told the follower yet.
	tr.loopRoundTrip(ctx, t)
	if got := log.got(); len(got) != 1 {
		t.Fatalf("exec.state notifications before the exited record was durable: %v, want only the first (running)", got)
	}
	// Block the loop, then let the store write.
	letGo := tr.blockLoop(t)
	st.Release()
	log.waitFor(t, api.StateExited, "of the store's answer while the loop was blocked")
	letGo()
	if err := <-followed; err != nil {
		t.Fatalf("Follow = %v", err)
	}
	want := []api.State{api.StateRunning, api.StateExited, api.StateCleaned}
	if got := log.got(); !equalStates(got, want) {
		t.Errorf("exec.state notifications %v, want %v", got, want)
	}
}

// TestStatesToldInOrderBehindAHeldWrite: a state whose write is answered
// while an earlier write of the same execution is still held (here the
// canceling record: exited is written at once) is not told before the
// earlier one: the follower sees running, canceling, exited, cleaned.
func TestStatesToldInOrderBehindAHeldWrite(t *testing.T) {
	st := newHeldCancelStore()
	tr := newTestReactor(t, func(c *Config) { c.Store = st })
	t.Cleanup(st.Release) // before the reactor's shutdown: cleanups run last first
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := tr.Start(ctx, root, api.StartParams{Cwd: "/", Argv: []string{"sleep", "60"}})
	if err != nil || rec.State != api.StateRunning {
		t.Fatalf("Start = %v, %v", rec.State, err)
	}
	log := newStateLog()
	followed := make(chan error, 1)
	go func() {
		_, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, log.notify)
		followed <- err
	}()
	log.waitFor(t, api.StateRunning, "after exec.follow (the current record)")
	cancelled := make(chan error, 1)
	go func() {
		_, err := tr.Cancel(ctx, root, api.CancelParams{ID: rec.ID})
		cancelled <- err
	}()
	<-st.asked
	// The tree is signalled after cancelCommitWait without the canceling
	// write; the child dies and its exited record is written at once.
	exited := false
	for deadline := time.Now().Add(10 * time.Second); !exited && time.Now().Before(deadline); {
		if err := tr.onLoop(ctx, func() {
			e := tr.execs[rec.ID]
			exited = e != nil && e.committed < api.StateCanceling && e.state >= api.StateExited && e.persisting >= 2
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !exited {
		t.Fatal("the child did not exit behind its held canceling write within 10s")
	}
	if got := log.got(); len(got) != 1 {
		t.Errorf("exec.state notifications while the canceling write was held: %v, want only the first (running)", got)
	}
	st.Release()
	if err := <-cancelled; err != nil {
		t.Fatalf("Cancel = %v", err)
	}
	if err := <-followed; err != nil {
		t.Fatalf("Follow = %v", err)
	}
	want := []api.State{api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned}
	if got := log.got(); !equalStates(got, want) {
		t.Errorf("exec.state notifications %v, want %v", got, want)
	}
}

func equalStates(a, b []api.State) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFollowShowsOnlyDurableStates: exec.follow called while the exited
// record's write is in flight shows nothing until it is written, then
// exited, then cleaned: no state before the store has it, none twice, and
// never an older one after a newer.
func TestFollowShowsOnlyDurableStates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	writeExitsAtOnce(t) // nobody follows yet: the exited record is written, not held
	tr, st, rec := startHeld(ctx, t, api.StateExited)
	st.killAndWaitAsked(t, rec.PID)
	log := newStateLog()
	followed := make(chan error, 1)
	go func() {
		_, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, log.notify)
		followed <- err
	}()
	// Nothing is shown while the exited write is held: not exited (not
	// durable), and not running again once exited is.
	select {
	case first := <-log.seen:
		t.Errorf("exec.follow sent %s while the exited record was not durable, want nothing until it is", first)
	case <-time.After(300 * time.Millisecond):
	}
	st.Release()
	if err := <-followed; err != nil {
		t.Fatalf("Follow = %v", err)
	}
	want := []api.State{api.StateExited, api.StateCleaned}
	if got := log.got(); !equalStates(got, want) {
		t.Errorf("exec.state notifications %v, want %v", got, want)
	}
}
