package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// stall queues a gateOp and waits until the writer is inside it.
func stall(t *testing.T, s *SQLite) gateOp {
	t.Helper()
	op := newGate()
	if !s.enqueue(op) {
		t.Fatal("enqueue: store closed")
	}
	select {
	case <-op.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not take the gate op")
	}
	return op
}

func TestCoalesceExitPath(t *testing.T) {
	s := openTemp(t, t.TempDir())
	rec := newRecord("c", 1000, 1, nil)
	mustCreate(t, s, rec)
	before := s.Stats()

	st := stall(t, s)
	type answer struct {
		state api.State
		res   Result
	}
	answers := make(chan answer, 3)
	sent := map[api.State][]byte{} // each caller's record, encoded
	queue := func(from api.State, to api.State, outs ...Output) {
		rec.State = to
		js, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		sent[to] = js
		s.TransitionFunc(from, rec, func(r Result) { answers <- answer{to, r} }, outs...)
	}
	queue(api.StateStarted, api.StateRunning)
	queue(api.StateRunning, api.StateExited, Output{Stream: Stdout, Kept: KeptOutput{Head: []byte("ex"), Total: 2, TailOffset: 2}})
	queue(api.StateExited, api.StateCleaned, Output{Stream: Stdout, Kept: KeptOutput{Head: []byte("cleaned"), Total: 7, TailOffset: 7}})
	close(st.release)
	if err := <-st.ch; err != nil {
		t.Fatalf("stall op: %v", err)
	}
	// Each caller is answered, in the order queued, once the newest record
	// is durable.
	for _, want := range []api.State{api.StateRunning, api.StateExited, api.StateCleaned} {
		a := <-answers
		if a.state != want || a.res.Err != nil || !a.res.Applied || a.res.State != api.StateCleaned {
			t.Errorf("answer %+v, want %s applied, stored state cleaned", a, want)
		}
		// A superseded caller's JSON is its own record's, not the one
		// written in its stead: it is what a notification of its state
		// carries.
		if !bytes.Equal(a.res.JSON, sent[a.state]) {
			t.Errorf("answer for %s: JSON %s, want the caller's record %s", a.state, a.res.JSON, sent[a.state])
		}
	}
	if got := mustGet(t, s, "c"); got.State != api.StateCleaned {
		t.Errorf("stored state %s, want cleaned", got.State)
	}
	if k, ok, err := s.Output("c", Stdout); err != nil || !ok || string(k.Head) != "cleaned" {
		t.Errorf("stdout = %q, %v, %v; want the cleaned record's", k.Head, ok, err)
	}
	after := s.Stats()
	if n := after.Coalesced - before.Coalesced; n != 2 {
		t.Errorf("coalesced %d transitions, want 2 (running and exited superseded by cleaned)", n)
	}
	// The stall op and the one cleaned write, queued while it applied,
	// share one transaction (late join).
	if n := after.Commits - before.Commits; n != 1 {
		t.Errorf("%d commits, want 1", n)
	}
	if n := after.Writes - before.Writes; n != 4 {
		t.Errorf("%d writes counted, want 4 (stall op and three transitions)", n)
	}
}

// An older transition whose kept output the newer one does not cover is
// written, not superseded: its stream would be lost.
func TestCoalesceKeepsUncoveredOutput(t *testing.T) {
	s := openTemp(t, t.TempDir())
	rec := newRecord("k", 1000, 1, nil)
	mustCreate(t, s, rec)
	before := s.Stats()
	st := stall(t, s)
	rec.State = api.StateExited
	r1 := s.Transition(api.StateStarted, rec, Output{Stream: Stderr, Kept: KeptOutput{Head: []byte("err"), Total: 3, TailOffset: 3}})
	rec.State = api.StateCleaned
	r2 := s.Transition(api.StateExited, rec, Output{Stream: Stdout, Kept: KeptOutput{Head: []byte("out"), Total: 3, TailOffset: 3}})
	close(st.release)
	for _, r := range []Result{<-r1, <-r2} {
		if r.Err != nil || !r.Applied {
			t.Errorf("transition %+v, want applied", r)
		}
	}
	if n := s.Stats().Coalesced - before.Coalesced; n != 0 {
		t.Errorf("coalesced %d, want 0", n)
	}
	for stream, want := range map[string]string{Stderr: "err", Stdout: "out"} {
		if k, ok, err := s.Output("k", stream); err != nil || !ok || string(k.Head) != want {
			t.Errorf("%s = %q, %v, %v; want %q", stream, k.Head, ok, err, want)
		}
	}
}

// A late transition (the stored record is past it) is not applied whether or
// not it was coalesced, and a failed batch still answers every caller.
func TestCoalesceLateAndClosed(t *testing.T) {
	s := openTemp(t, t.TempDir())
	rec := newRecord("l", 1000, 1, nil)
	mustCreate(t, s, rec)
	rec.State = api.StateRunning
	mustTransition(t, s, api.StateStarted, rec)
	rec.State = api.StateExited
	mustTransition(t, s, api.StateRunning, rec)

	st := stall(t, s)
	old := rec
	old.State = api.StateRunning
	r1 := s.Transition(api.StateStarted, old) // late: stored is exited
	old.State = api.StateRunning
	r2 := s.Transition(api.StateRunning, old) // late too
	close(st.release)
	for _, r := range []Result{<-r1, <-r2} {
		if r.Err != nil || r.Applied || r.State != api.StateExited {
			t.Errorf("late transition %+v, want not applied, stored exited", r)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-s.Transition(api.StateExited, rec); !errors.Is(r.Err, ErrClosed) {
		t.Errorf("after Close: %+v, want ErrClosed", r)
	}
}
