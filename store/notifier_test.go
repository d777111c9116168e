package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestTransitionFunc: each store answers TransitionFunc by calling done
// once per write, in the order the writes were queued, only once the write
// is in the store (a Get in done sees it); an illegal transition and a
// late one are answered too, and a write to a closed store fails.
func TestTransitionFunc(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		n, ok := s.(Notifier)
		if !ok {
			t.Fatalf("%T does not implement Notifier", s)
		}
		const runs = 50
		var (
			mu    sync.Mutex
			order []string
			bad   []string
		)
		all := make(chan struct{})
		answered := 0
		note := func(tag string, want func(Result) bool, id string, st api.State) func(Result) {
			return func(res Result) {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, tag)
				if !want(res) {
					bad = append(bad, fmt.Sprintf("%s: %+v", tag, res))
				}
				if id != "" {
					if rec, ok, err := s.Get(id); err != nil || !ok || rec.State != st {
						bad = append(bad, fmt.Sprintf("%s: Get in done = %v %v %v, want state %s", tag, rec.State, ok, err, st))
					}
				}
				answered++
				if answered == 2*runs+1 {
					close(all)
				}
			}
		}
		applied := func(r Result) bool { return r.Err == nil && r.Applied }
		var want []string
		for i := 0; i < runs; i++ {
			rec := newRecord(fmt.Sprintf("tf-%02d", i), 1000, i, nil)
			mustCreate(t, s, rec)
			rec.State = api.StateRunning
			tag := fmt.Sprintf("%s running", rec.ID)
			n.TransitionFunc(api.StateStarted, rec, note(tag, applied, rec.ID, api.StateRunning))
			// A late duplicate: answered, not applied.
			tag2 := fmt.Sprintf("%s late", rec.ID)
			n.TransitionFunc(api.StateStarted, rec, note(tag2, func(r Result) bool { return r.Err == nil && !r.Applied && r.State == api.StateRunning }, "", 0))
			want = append(want, tag, tag2)
		}
		// Illegal (from cleaned): an error, answered before TransitionFunc
		// returns, ahead of the queued writes.
		rec := newRecord("tf-illegal", 1000, 99, nil)
		rec.State = api.StateStarted
		var illegal bool
		n.TransitionFunc(api.StateCleaned, rec, note("illegal", func(r Result) bool { illegal = true; return r.Err != nil }, "", 0))
		mu.Lock()
		if !illegal {
			t.Error("an illegal transition was not answered before TransitionFunc returned")
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d writes answered within 30s", answered, 2*runs+1)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, b := range bad {
			t.Error(b)
		}
		var queued []string
		for _, tag := range order {
			if tag != "illegal" {
				queued = append(queued, tag)
			}
		}
		if fmt.Sprint(queued) != fmt.Sprint(want) {
			t.Errorf("answers in order\n%v\nwant\n%v", queued, want)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		var res Result
		n.TransitionFunc(api.StateStarted, newRecord("tf-after", 1, 1, nil), func(r Result) { res = r })
		if !errors.Is(res.Err, ErrClosed) {
			t.Errorf("TransitionFunc after Close answered %+v before returning, want ErrClosed", res)
		}
	})
}

// TestTransitionResultJSON: every store answers a transition with the
// caller's record as json.Marshal encodes it (what the reactor sends on in
// exec.state), applied or not; a failed one carries none.
func TestTransitionResultJSON(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		n := s.(Notifier)
		rec := newRecord("json-<&>", 1000, 1, map[string]string{"k": "a<b>\u2028"})
		mustCreate(t, s, rec)
		rec.State = api.StateRunning
		want, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		// An illegal transition is answered before TransitionFunc returns.
		var illegal *Result
		n.TransitionFunc(api.StateCleaned, rec, func(r Result) { illegal = &r })
		if illegal == nil || illegal.Err == nil || illegal.JSON != nil {
			t.Errorf("illegal transition answered %+v; want an error and no JSON", illegal)
		}
		got := make(chan Result, 2)
		n.TransitionFunc(api.StateStarted, rec, func(r Result) { got <- r })
		n.TransitionFunc(api.StateStarted, rec, func(r Result) { got <- r }) // late: not applied
		for i, applied := range []bool{true, false} {
			select {
			case r := <-got:
				if r.Err != nil || r.Applied != applied || !bytes.Equal(r.JSON, want) {
					t.Errorf("answer %d = applied %v err %v JSON %s; want applied %v, JSON %s", i, r.Applied, r.Err, r.JSON, applied, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("answer %d: none within 10s", i)
			}
		}
	})
}
