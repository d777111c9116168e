package reactor

// Handover: on a reload corrald execs the binary now on disk in place (same
// pid, so the children stay its children) and the new image re-adopts every
// execution (adopt_linux.go). This file is the old image's half: quiesce,
// describe what memory holds, let the caller exec.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/api"
)

// handoverState refuses new exec.start calls while a handover is under way
// and counts the ones already past that check.
type handoverState struct {
	active atomic.Bool
	starts atomic.Int64
}

// startBegin admits an exec.start unless a handover is under way; every
// admitted call ends with startDone.
func (r *Reactor) startBegin() bool {
	r.handover.starts.Add(1)
	if r.handover.active.Load() {
		r.handover.starts.Add(-1)
		return false
	}
	return true
}

func (r *Reactor) startDone() { r.handover.starts.Add(-1) }

// Handover is what the next image needs beyond the store: the fds to keep
// open across exec (number -> name "<exec-id>.<role>") and, per execution,
// what only memory held.
type Handover struct {
	Fds   map[int]string
	Execs map[string]HandoverExec
}

// ErrHandoverBusy says the executions did not settle for a handover in
// time (starts or cleanups kept going); nothing was handed over.
var ErrHandoverBusy = errors.New("handover: executions did not settle")

// Handover quiesces the reactor (new exec.start calls get -32005, starts
// and cleanups in flight finish, every record is durable, the kept output
// is in the spool files) and then calls exec on the loop goroutine, so that
// nothing changes until it returns. exec is expected to replace the
// process image; if it returns, its error is returned and supervision goes
// on exactly as before (the old process carries on). settle bounds the
// wait for quiet.
func (r *Reactor) Handover(ctx context.Context, settle time.Duration, exec func(Handover) error) error {
	if !r.handover.active.CompareAndSwap(false, true) {
		return errors.New("handover: one is already under way")
	}
	defer r.handover.active.Store(false)
	// Checked and handed over in one go on the loop: nothing can start
	// in between.
	deadline := time.Now().Add(settle)
	for {
		var (
			err  error
			why  string
			done bool
		)
		if lerr := r.onLoop(ctx, func() {
			var ok bool
			if ok, why = r.quiet(); !ok {
				return
			}
			done = true
			h, herr := r.describe()
			if herr != nil {
				err = herr
				return
			}
			// The warm pool may be forking a shim: let that fork finish
			// its exec first, and start no other until exec returns.
			release := r.reaper.holdForks()
			err = exec(h)
			release()
		}); lerr != nil {
			return fmt.Errorf("handover: %w", lerr)
		}
		if done {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w within %v: %s", ErrHandoverBusy, settle, why)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("handover: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// quiet reports whether nothing is in flight that the next image could not
// pick up from the store and the fds: no start, no store write; else what
// is. Loop goroutine only.
func (r *Reactor) quiet() (bool, string) {
	switch {
	case r.handover.starts.Load() > 0:
		return false, fmt.Sprintf("%d exec.start calls in flight", r.handover.starts.Load())
	case r.inflight > 0:
		return false, fmt.Sprintf("%d store writes in flight", r.inflight)
	case len(r.dirty) > 0:
		return false, fmt.Sprintf("%d records not durable yet", len(r.dirty))
	}
	held := ""
	for _, e := range r.execs {
		// One being cleaned up need not hold the handover: its record is
		// exited, and the next image cleans it up again (idempotent).
		if e.state == api.StateStarted {
			return false, "execution " + e.id + " is starting"
		}
		if e.exitHeld { // its record is not exited yet: write it, and every other held one, now
			r.flushExit(e)
			held = e.id
		}
	}
	if held != "" {
		return false, "execution " + held + " had its exited record held"
	}
	return true, ""
}

// describe collects the handover: fds, memory-only state, and the kept
// output written to the spool files. Loop goroutine only.
func (r *Reactor) describe() (Handover, error) {
	h := Handover{Fds: map[int]string{}, Execs: map[string]HandoverExec{}}
	for _, e := range r.execs {
		if e.done {
			continue // cleaned and durable: the store answers for it
		}
		he := HandoverExec{Pending: e.cancelWhy(), Spooled: true}
		if e.cancel != nil {
			he.Hard = e.cancel.hard
		}
		if e.pidfd >= 0 {
			h.Fds[e.pidfd] = FdName(e.id, RolePidfd)
		}
		for i, s := range e.streams {
			if s == nil {
				continue
			}
			switch {
			case s.fd >= 0 && s.tty:
				h.Fds[s.fd] = FdName(e.id, RolePTY)
				he.Stdin = append([]byte(nil), e.tty.buf...) // typed, not yet taken
			case s.fd >= 0:
				h.Fds[s.fd] = FdName(e.id, s.name)
			}
			he.Raw[i] = s.raw
			if r.cfg.StateDir == "" {
				continue
			}
			if !s.spool.working() {
				// Written aside and renamed over the old file, and the
				// stream spooled again: a handover that fails (this write
				// on a full disk, or the exec) leaves the old marked file,
				// or a working spool, never an unmarked one that later
				// output does not reach.
				if err := r.spoolKept(e, s); err != nil {
					return Handover{}, fmt.Errorf("handover %s: %w", e.id, err)
				}
			}
		}
		if in := e.stdin; in != nil && in.fd >= 0 {
			h.Fds[in.fd] = FdName(e.id, RoleStdin)
			he.Stdin, he.StdinClose = append([]byte(nil), in.buf...), in.closeAfter
		}
		h.Execs[e.id] = he
	}
	return h, nil
}
