package reactor

import (
	"time"

	"github.com/corral-dev/corral/api"
)

// Observer is told what the reactor does, for metrics and traces: every
// state change, the output read from children and how long store writes
// take. Its methods are called on the loop goroutine and must not block:
// they bump counters, or hand a copy to a goroutine of their own and drop
// it when that one is behind.
type Observer interface {
	// Transition: an execution was created (From 0) or moved to
	// Record.State.
	Transition(t Transition)
	// Output: n bytes were read from a child's stream ("stdout", "stderr").
	Output(stream string, n int)
	// StoreCommit: a record's write was queued d before the store
	// acknowledged it (ok false: it failed and is retried).
	StoreCommit(d time.Duration, ok bool)
}

// Transition is one state change of an execution.
type Transition struct {
	From api.State // 0 when the execution was just created
	// Record is the execution's record after the change, timestamps and
	// outcome included. Read only, and only during the call: an observer
	// that keeps anything copies it.
	Record *api.Record
	// Traceparent is the W3C trace context exec.start was given, or "".
	Traceparent string
}

// Observers returns an Observer that tells each of obs in turn.
func Observers(obs ...Observer) Observer {
	var all multiObserver
	for _, o := range obs {
		if o != nil {
			all = append(all, o)
		}
	}
	return all
}

type multiObserver []Observer

func (m multiObserver) Transition(t Transition) {
	for _, o := range m {
		o.Transition(t)
	}
}

func (m multiObserver) Output(stream string, n int) {
	for _, o := range m {
		o.Output(stream, n)
	}
}

func (m multiObserver) StoreCommit(d time.Duration, ok bool) {
	for _, o := range m {
		o.StoreCommit(d, ok)
	}
}

var _ Observer = multiObserver(nil)

// observe tells the observer that e just moved from state from; rec is
// the record as it now stands. Loop goroutine only.
func (r *Reactor) observe(e *execution, from api.State, rec *api.Record) {
	r.obs.Transition(Transition{From: from, Record: rec, Traceparent: e.params.Traceparent})
}
