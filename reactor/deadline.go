package reactor

// Deadlines: the wall-clock limit (timeout_ms, movable with exec.update) and
// the idle limit (idle_timeout_ms). Both end an execution with the usual
// escalation (toCanceling: SIGTERM to the tree, SIGKILL after grace_ms).
//
// The idle limit costs no timer work per output chunk: keep() only stores
// the time of the last byte, and the one idle timer, when it fires, either
// ends the execution or re-arms itself for the moment the limit would end
// counted from that last byte. So a chatty child moves the timer at most
// once per idle period, never per chunk.

import (
	"context"
	"fmt"
	"time"

	"github.com/corral-dev/corral/api"
)

// armDeadline (re)arms e's wall-clock timer for e.deadline and records it.
// Loop goroutine only.
func (r *Reactor) armDeadline(e *execution) {
	r.stopTimer(&e.timeout)
	d := e.deadline
	e.rec.Deadline = &d
	if e.rec.StartedAt != nil {
		e.rec.TimeoutMS = d.Sub(*e.rec.StartedAt).Milliseconds()
	}
	e.timeout = r.loop.AfterFunc(time.Until(d), func() {
		e.timeout = nil
		r.toCanceling(e, cancelRequest{why: api.OutcomeTimeout})
	})
}

// armIdle starts e's idle timer, counted from now. Loop goroutine only.
func (r *Reactor) armIdle(e *execution) {
	if e.params.IdleTimeoutMS <= 0 {
		return
	}
	e.lastOutput = time.Now()
	r.idleAfter(e, time.Duration(e.params.IdleTimeoutMS)*time.Millisecond)
}

func (r *Reactor) idleAfter(e *execution, d time.Duration) {
	e.idleArms++
	e.idle = r.loop.AfterFunc(d, func() {
		e.idle = nil
		if e.state != api.StateRunning {
			return
		}
		limit := time.Duration(e.params.IdleTimeoutMS) * time.Millisecond
		if left := time.Until(e.lastOutput.Add(limit)); left > 0 {
			r.idleAfter(e, left) // output since: the limit counts from it
			return
		}
		r.toCanceling(e, cancelRequest{why: api.OutcomeIdleTimeout})
	})
}

// sawOutput notes that e produced output now (for the idle limit). Loop
// goroutine only; called for every chunk, so it only stores the time.
func (e *execution) sawOutput() {
	if e.params.IdleTimeoutMS > 0 {
		e.lastOutput = time.Now()
	}
}

// Update implements exec.update: a new wall-clock deadline, timeout_ms from
// now. The answer comes once the new deadline is durable, so that a
// restarted corrald knows it.
func (r *Reactor) Update(ctx context.Context, caller api.Owner, p api.UpdateParams) (api.Record, error) {
	if p.ID == "" {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	if p.TimeoutMS == nil {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "timeout_ms: required")
	}
	ms := *p.TimeoutMS
	if ms <= 0 {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "timeout_ms: must be positive")
	}
	if ms > maxTimeoutMS {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "timeout_ms: at most %d", maxTimeoutMS)
	}
	ack := make(chan api.Record, 1)
	var rec api.Record
	err := r.orStored(ctx, func() error {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		switch e.state {
		case api.StateExited, api.StateCleaned:
			return api.Errorf(api.CodeInvalidParams, "id: execution %s has exited; there is no deadline to move", e.id)
		case api.StateCanceling:
			return api.Errorf(api.CodeInvalidParams, "id: execution %s is already being stopped (%s)", e.id, e.cancelWhy())
		}
		e.deadline = time.Now().Add(time.Duration(ms) * time.Millisecond)
		if e.state == api.StateStarted {
			// Still spawning: toRunning arms the timer for e.deadline.
			rec = r.snapshot(e)
			ack <- rec
			return nil
		}
		r.armDeadline(e)
		r.audit(e, "updated").Time("deadline", e.deadline).Int64("timeout_ms", e.rec.TimeoutMS).Msg("deadline moved")
		rec = r.snapshot(e)
		r.persist(e, e.state, rec, func(bool, []byte) { ack <- rec })
		return nil
	}, func() error {
		if _, err := r.stored(caller, p.ID); err != nil {
			return err
		}
		return api.Errorf(api.CodeInvalidParams, "id: execution %s has exited; there is no deadline to move", p.ID)
	})
	if err != nil {
		return api.Record{}, err
	}
	select {
	case rec = <-ack:
		return rec, nil
	case <-ctx.Done():
		return api.Record{}, ctx.Err()
	}
}

// limitError is the record's error text for an outcome of corral's limits:
// timeoutMS is the wall limit in force (exec.update may have moved it), p
// the other limits. Pure: decideOutcome calls it.
func limitError(outcome api.Outcome, timeoutMS int64, p api.StartParams) string {
	switch outcome {
	case api.OutcomeTimeout:
		return fmt.Sprintf("timed out after %d ms", timeoutMS)
	case api.OutcomeIdleTimeout:
		return fmt.Sprintf("no output for %d ms (idle_timeout_ms)", p.IdleTimeoutMS)
	case api.OutcomeCPULimit:
		return fmt.Sprintf("CPU time of the tree passed cpu_ms %d", p.CPUMS)
	case api.OutcomeMemoryLimit:
		return fmt.Sprintf("the tree was OOM-killed (memory_bytes %d)", p.MemoryBytes)
	}
	return ""
}
