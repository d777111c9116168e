package reactor

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// persist queues e's record, just moved from state from, as a conditional
// update; then runs on the loop once it is durable (ok; js is rec as the
// store encoded it, for a notification to carry without encoding it again)
// or failed (supervision goes on, the store reports itself degraded; js is
// nil). Loop goroutine only.
func (r *Reactor) persist(e *execution, from api.State, rec api.Record, then func(ok bool, js []byte), outs ...store.Output) {
	r.persistAnswered(e, from, rec, nil, then, outs...)
}

// persistAnswered is persist with answered, when not nil, called with the
// store's result where the store gives it (the writer goroutine; the loop
// for the Memory store or an immediate failure), before then is posted
// to the loop: what must reach a client the moment the record is durable,
// without waiting for the loop to wake (commit). answered must not touch
// the loop's state. queued: the store had not answered when
// TransitionFunc returned.
func (r *Reactor) persistAnswered(e *execution, from api.State, rec api.Record, answered func(store.Result), then func(ok bool, js []byte), outs ...store.Output) (queued bool) {
	queuedAt := time.Now()
	r.inflight++
	e.persisting++
	followUp := func(res store.Result) {
		e.persisting--
		r.inflight--
		r.obs.StoreCommit(time.Since(queuedAt), res.Err == nil)
		if res.Err != nil {
			r.log.Error().Err(res.Err).Str("exec_id", e.id).Stringer("state", rec.State).
				Msg("store: transition not durable; the execution stays supervised, the write is retried")
			r.markDirty(e)
		}
		if then != nil {
			if res.Err != nil {
				res.JSON = nil
			}
			then(res.Err == nil, res.JSON)
		}
	}
	// The store's writer calls back (the Memory store before
	// TransitionFunc returns), so the loop never waits on the disk: post
	// the follow-up to the loop, and run follow-ups in the order of their
	// transitions whatever order the answers come in (an immediate failure
	// is answered ahead of queued writes).
	seq := r.ackSeq
	r.ackSeq++
	var now atomic.Bool // answered before TransitionFunc returned
	r.store.TransitionFunc(from, rec, func(res store.Result) {
		now.Store(true)
		if answered != nil {
			answered(res)
		}
		r.post(func() { r.acked(seq, func() { followUp(res) }) })
	}, outs...)
	return !now.Load()
}

// acked runs the follow-up of the transition numbered seq once those of
// every earlier one have run. Loop goroutine only.
func (r *Reactor) acked(seq uint64, f func()) {
	if seq != r.ackNext {
		if r.ackReady == nil {
			r.ackReady = make(map[uint64]func())
		}
		r.ackReady[seq] = f
		return
	}
	f()
	r.ackNext++
	for {
		g, ok := r.ackReady[r.ackNext]
		if !ok {
			return
		}
		delete(r.ackReady, r.ackNext)
		g()
		r.ackNext++
	}
}

// markDirty remembers that e's latest record did not reach the store; it is
// written again every second until it does (and before shutdown), as a
// transition from e.prev, the state it really left: the store's catch-up
// rule (stored state <= from) lets the latest record replace whatever older
// one the store holds. Loop goroutine only.
func (r *Reactor) markDirty(e *execution) {
	r.dirty[e] = struct{}{}
	if r.retry == nil {
		r.retry = r.loop.AfterFunc(time.Second, r.retryDirty)
	}
}

func (r *Reactor) retryDirty() {
	r.retry = nil
	for e := range r.dirty {
		delete(r.dirty, e)
		if e.state == api.StateExited {
			r.releaseExit(e) // this write is the held record's (hold.go)
		}
		rec := r.snapshot(e)
		outs := r.recordOutputs(e)
		r.persist(e, e.prev, rec, func(ok bool, _ []byte) {
			if ok {
				r.durableAs(e, rec.State)
			}
			r.committedAs(e, rec)
			if ok && e.done && e.state == api.StateCleaned {
				delete(r.execs, e.id) // durable at last: the store answers for it
			}
		}, outs...)
	}
}

// recordOutputs is the kept output that goes with e's record in its
// current state, in the same commit: all of it with cleaned (the store
// answers for the output from then on), and with exited unless every
// stream that carried bytes has a working spool keeping it across a crash:
// a crash before cleaned would otherwise leave an outcome with none of the
// output behind it (found by tests/drill, kill-9). A spool that could not
// be opened, or was abandoned after a failed write, keeps nothing more.
// The first write of a record and a retry of it (retryDirty) take the same.
// Loop goroutine only.
func (r *Reactor) recordOutputs(e *execution) []store.Output {
	if e.state == api.StateCleaned || e.state == api.StateExited && !spooled(e) {
		return keptForStore(e)
	}
	return nil
}

// spooled reports whether every stream of e that carried bytes has a
// working spool.
func spooled(e *execution) bool {
	for _, s := range e.streams {
		if s != nil && s.kept.total > 0 && !s.spool.working() {
			return false
		}
	}
	return true
}

// keptForStore is the kept output of e's streams as the store keeps it. A
// stream that has carried no byte is left out: there is nothing to keep, and
// the store answers a stream it has no output for as empty (storedOutput,
// followStored), as it would an empty one. It spares the commits on the exit
// path (exited, cleaned) of a quiet command a row write per stream.
func keptForStore(e *execution) []store.Output {
	var outs []store.Output
	for _, s := range e.streams {
		if s == nil || s.kept.total == 0 {
			continue
		}
		outs = append(outs, store.Output{Stream: s.name, Kept: store.KeptOutput{
			Head: append([]byte(nil), s.kept.head...), Tail: s.kept.tailCopy(),
			TailOffset: s.kept.tailOffset(), Total: s.kept.total,
		}})
	}
	return outs
}

// storedParams is what of exec.start is kept with the record: enough to
// audit and to compare an idempotent retry, without the environment's
// values or stdin (they may hold secrets).
func storedParams(p api.StartParams) []byte {
	p.Stdin = nil
	if len(p.Env) > 0 {
		names := make(map[string]string, len(p.Env))
		for k := range p.Env {
			names[k] = ""
		}
		p.Env = names
	}
	b, _ := json.Marshal(p)
	return b
}

// stored finds id in the store for caller: executions no longer in memory
// (cleaned, or from before a restart). Blocking read: never on the loop.
func (r *Reactor) stored(caller api.Owner, id string) (api.Record, error) {
	rec, ok, err := r.store.Get(id)
	if err != nil {
		return api.Record{}, &api.Error{Code: api.CodeInternal, Message: "store: read failed", Err: err}
	}
	if !ok || (caller.UID != 0 && rec.Owner.UID != caller.UID) {
		return api.Record{}, api.ErrNotFound
	}
	return rec, nil
}

// storedOutput answers exec.output for a record no longer in memory.
func (r *Reactor) storedOutput(caller api.Owner, p api.OutputParams, limit int64) (api.OutputResult, error) {
	if _, err := r.stored(caller, p.ID); err != nil {
		return api.OutputResult{}, err
	}
	stream := p.Stream
	if stream == "" {
		stream = store.Stdout
	}
	k, ok, err := r.store.Output(p.ID, stream)
	if err != nil {
		return api.OutputResult{}, &api.Error{Code: api.CodeInternal, Message: "store: read failed", Err: err}
	}
	if !ok {
		return api.OutputResult{Data: []byte{}, EOF: true}, nil
	}
	data, start, gap := k.Read(p.Offset, limit)
	if data == nil {
		data = []byte{}
	}
	next := start + int64(len(data))
	return api.OutputResult{Data: data, Offset: start, NextOffset: next, TotalBytes: k.Total, EOF: next >= k.Total, Gap: gap}, nil
}

// orStored runs the in-memory lookup f on the loop; when the execution is
// not in memory it falls back to the store with g.
func (r *Reactor) orStored(ctx context.Context, f func() error, g func() error) error {
	var err error
	if lerr := r.onLoop(ctx, func() { err = f() }); lerr != nil {
		return lerr
	}
	if errors.Is(err, api.ErrNotFound) {
		return g()
	}
	return err
}

// commit persists the transition e just made (from e.prev) and tells
// followers once it is durable; queued says the store had not answered
// when it returned (its writer has the record). Loop goroutine only.
//
// The followers e has when the transition is queued are told from the
// store's answer itself (the writer goroutine), as soon as the record is
// durable: the post back to the loop and the loop's wake-up are off the
// notification's path (issue 11, (b)). Only when no earlier write of e is
// in flight: the store answers writes in the order they were queued, but
// one that failed is told from the loop, and a later state must not reach
// a client before it. A follower that came since, or every follower when
// the write failed (told with the record encoded by the connection), is
// told on the loop as before.
func (r *Reactor) commit(e *execution, outs ...store.Output) (queued bool) {
	rec := r.snapshot(e)
	r.observe(e, e.prev, &rec)
	return r.commitRecord(e, rec, outs...)
}

// commitRecord is commit of rec, e's record as it stands, whose transition
// the observer was told of already. Loop goroutine only.
func (r *Reactor) commitRecord(e *execution, rec api.Record, outs ...store.Output) (queued bool) {
	r.runningAt.Store(int64(r.running))
	var (
		early    map[*follower]struct{}
		answered func(store.Result)
		told     bool // set by answered, read on the loop after the post
	)
	if e.persisting == 0 && len(e.followers) > 0 {
		early = maps.Clone(e.followers)
		answered = func(res store.Result) {
			if res.Err != nil || res.JSON == nil {
				return
			}
			n := stateParams(res.JSON)
			for f := range early {
				f.notify(api.NotifyState, n)
			}
			told = true
		}
	}
	return r.persistAnswered(e, e.prev, rec, answered, func(ok bool, js []byte) {
		if ok {
			r.durableAs(e, rec.State)
		}
		if told {
			r.tellOthers(e, rec, js, early)
		} else {
			r.tell(e, rec, js)
		}
		if e.startAck != nil {
			e.startAck <- waitAnswer{rec: rec, js: js}
			e.startAck = nil
		}
		r.committedAs(e, rec)
	}, outs...)
}

// commitWait is an exec.cancel answer waiting until a record of e at
// state at or beyond st came back from the store.
type commitWait struct {
	st api.State
	ch chan api.Record
}

// whenCommitted returns nil when a record of e at st or beyond came back
// from the store already, else a channel that gets that record once it
// has (closed if e is dropped without one: abandon). Loop goroutine only.
func (r *Reactor) whenCommitted(e *execution, st api.State) <-chan api.Record {
	if e.committed >= st {
		return nil
	}
	r.flushExit(e) // the wait is for a record written, not held (hold.go)
	ch := make(chan api.Record, 1)
	e.cancelAcks = append(e.cancelAcks, commitWait{st: st, ch: ch})
	return ch
}

// committedAs notes that e's record rec came back from the store (durable,
// or failed: the store is degraded, the write is retried, and waiting for
// it would stall exec.cancel until the disk recovers) and answers the
// waits it satisfies. It also signals the tree of a canceling execution
// whose canceling record this is (enterCanceling). Loop goroutine only.
func (r *Reactor) committedAs(e *execution, rec api.Record) {
	if rec.State <= e.committed {
		return
	}
	e.committed = rec.State
	if rec.State >= api.StateCanceling && e.endPending {
		r.endTree(e)
	}
	kept := e.cancelAcks[:0]
	for _, w := range e.cancelAcks {
		if w.st <= rec.State {
			w.ch <- rec
			continue
		}
		kept = append(kept, w)
	}
	e.cancelAcks = kept
}

// tell sends a state notification to e's followers. js, when not nil, is
// rec as the store encoded it (encoding/json): the notification's params are
// built around those bytes once for every follower, and the connections send
// them as they are, so the record is encoded once on its way to the store
// and the clients (stateParams). Without js (the write failed) each
// connection encodes rec itself.
func (r *Reactor) tell(e *execution, rec api.Record, js []byte) {
	if len(e.followers) == 0 {
		return
	}
	var n any = api.StateNotification{Record: rec}
	if js != nil {
		n = stateParams(js)
	}
	for f := range e.followers {
		f.notify(api.NotifyState, n)
	}
}

// tellOthers is tell for the followers of e not in told (those were told
// already, from the store's answer: commit).
func (r *Reactor) tellOthers(e *execution, rec api.Record, js []byte, told map[*follower]struct{}) {
	var n any
	for f := range e.followers {
		if _, ok := told[f]; ok {
			continue
		}
		if n == nil {
			n = stateParams(js)
		}
		f.notify(api.NotifyState, n)
	}
}

// stateParams is the params of an exec.state notification for a record
// encoded as js: the bytes json.Marshal(api.StateNotification{Record: rec})
// gives when js is json.Marshal(rec). ipc sends a json.RawMessage as it is.
func stateParams(js []byte) json.RawMessage {
	const head, tail = `{"record":`, `}`
	b := make([]byte, 0, len(head)+len(js)+len(tail))
	b = append(b, head...)
	b = append(b, js...)
	return append(b, tail...)
}
