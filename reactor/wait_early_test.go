package reactor

import (
	"context"
	"encoding/json"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestWaitAnsweredOnceDurableWithoutTheLoop: an exec.wait caller is
// answered only once the cleaned record is written, and from the store's
// answer itself: with the loop blocked, the answer still comes, with the
// store's JSON of the cleaned record.
func TestWaitAnsweredOnceDurableWithoutTheLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, st, rec := startHeld(ctx, t, api.StateCleaned)
	type answer struct {
		rec api.Record
		js  json.RawMessage
		err error
	}
	waited := make(chan answer, 1)
	go func() {
		r, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: rec.ID})
		waited <- answer{r, js, err}
	}()
	for registered := false; !registered; {
		if err := tr.onLoop(ctx, func() { registered = len(tr.execs[rec.ID].waiters) == 1 }); err != nil {
			t.Fatal(err)
		}
		if !registered {
			time.Sleep(time.Millisecond)
		}
	}
	if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the cleaned record was not sent to the store within 10s of the kill")
	}
	// The loop has done all it does at cleaned (a round trip behind it):
	// the caller may not have its answer yet.
	if err := tr.onLoop(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-waited:
		t.Fatalf("exec.wait answered (%v, %v) before the cleaned record was durable", a.rec.State, a.err)
	default:
	}
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var unblockOnce sync.Once
	letGo := func() { unblockOnce.Do(func() { close(unblock) }) }
	t.Cleanup(letGo)
	tr.post(func() { close(blocked); <-unblock })
	<-blocked
	st.Release()
	var a answer
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
