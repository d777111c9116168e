package reactor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// encodedAnswer is what WaitEncoded returned.
type encodedAnswer struct {
	rec api.Record
	js  json.RawMessage
	err error
}

// waitEncodedRegistered calls WaitEncoded for id on a goroutine of its own
// and returns once its waiter, the execution's only one, is registered on
// the loop; the answer comes on the channel.
func (tr *testReactor) waitEncodedRegistered(ctx context.Context, t *testing.T, id string) <-chan encodedAnswer {
	t.Helper()
	answered := make(chan encodedAnswer, 1)
	go func() {
		rec, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: id})
		answered <- encodedAnswer{rec, js, err}
	}()
	for waiters := 0; waiters == 0; {
		if err := tr.onLoop(ctx, func() { waiters = len(tr.execs[id].waiters) }); err != nil {
			t.Fatal(err)
		}
		if waiters > 1 {
			t.Fatalf("%d waiters registered for one exec.wait", waiters)
		}
		if waiters == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return answered
}

// TestWaitAnsweredOnceDurableWithoutTheLoop: an exec.wait caller is
// answered only once the cleaned record is written, and from the store's
// answer itself: with the loop blocked, the answer still comes, with the
// store's JSON of the cleaned record.
func TestWaitAnsweredOnceDurableWithoutTheLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, st, rec := startHeld(ctx, t, api.StateCleaned)
	waited := tr.waitEncodedRegistered(ctx, t, rec.ID)
	st.killAndWaitAsked(t, rec.PID)
	// The loop has done all it does at cleaned (a round trip behind it):
	// the caller may not have its answer yet.
	tr.loopRoundTrip(ctx, t)
	select {
	case a := <-waited:
		t.Fatalf("exec.wait answered (%v, %v) before the cleaned record was durable", a.rec.State, a.err)
	default:
	}
	letGo := tr.blockLoop(t)
	st.Release()
	var a encodedAnswer
	select {
	case a = <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("exec.wait not answered within 10s of the cleaned record's write while the loop was blocked")
	}
	letGo()
	if a.err != nil || a.rec.State != api.StateCleaned {
		t.Fatalf("WaitEncoded = %v, %v", a.rec.State, a.err)
	}
	var stored api.Record
	if err := json.Unmarshal(a.js, &stored); err != nil || stored.State != api.StateCleaned || stored.ID != rec.ID {
		t.Fatalf("the answer's JSON %s (%v) is not the cleaned record", a.js, err)
	}
}
