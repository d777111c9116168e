package reactor

// The ipc.Service methods: each validates its params, then posts work to the
// loop (onLoop) and waits for the answer, falling back to the store for
// executions no longer in memory. Any goroutine.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// Start implements exec.start.
func (r *Reactor) Start(ctx context.Context, caller api.Owner, p api.StartParams) (api.Record, error) {
	rec, _, err := r.StartEncoded(ctx, caller, p)
	return rec, err
}

// StartEncoded implements ipc.EncodedStarter: Start, and when it was
// answered with the running (or failed-start) record the store wrote, that
// record's JSON too (the store's bytes: not encoded again for the answer).
// Any other answer (an existing execution of the idempotency key, an error)
// has no JSON.
func (r *Reactor) StartEncoded(ctx context.Context, caller api.Owner, p api.StartParams) (api.Record, json.RawMessage, error) {
	if r.stopping.Load() {
		return api.Record{}, nil, api.Errorf(api.CodeShuttingDown, "daemon is shutting down")
	}
	if !r.startBegin() {
		return api.Record{}, nil, api.Errorf(api.CodeShuttingDown, "daemon is handing over to its new binary; retry")
	}
	defer r.startDone()
	if err := normalize(&p, r.cfg.Defaults); err != nil {
		return api.Record{}, nil, err
	}
	runAs, err := resolveUser(caller, p.User)
	if err != nil {
		return api.Record{}, nil, err
	}
	if p.Network != "none" {
		// A caller without the host's network (itself in a network "none"
		// execution) cannot get it back through corrald; nor can one
		// whose namespace corrald could not establish at accept.
		other, err := otherNetns(caller)
		if err != nil {
			r.log.Warn().Err(err).Int32("caller_pid", caller.PID).Msg("caller's network namespace unknown: network none")
		}
		if other {
			p.Network = "none"
		}
	}
	// An idempotency key may name an execution from before a restart.
	var prior *api.Record
	if p.ID != "" {
		if rec, ok, err := r.store.Get(p.ID); err == nil && ok {
			prior = &rec
		}
	}
	if err := fdHeadroom(); err != nil {
		return api.Record{}, nil, &api.Error{Code: api.CodeOverCapacity,
			Message: "over capacity: the daemon is out of file descriptors; nothing was started", Err: err}
	}
	var (
		e   *execution
		rec api.Record
		old bool
	)
	// Not ctx: create runs on the loop once posted, whether or not the
	// client is still there; giving up on it here would leave an execution
	// registered in state started that nothing ever spawns or ends.
	var durable <-chan api.Record
	if err := r.onLoop(context.Background(), func() {
		e, rec, old, err = r.create(caller, p, prior)
		if err == nil && old && e != nil {
			durable = r.whenCommitted(e, e.state) // told only once durable (a held exit is written now)
		}
	}); err != nil {
		return api.Record{}, nil, err
	}
	if err != nil {
		return rec, nil, err
	}
	if old {
		rec, err = awaitDurable(ctx, durable, rec)
		return rec, nil, err
	}
	// The record is durable before the child is forked: no execution can
	// run that the store does not know of. spawn prepares the workspace and
	// pipes while the store commits, and waits for it before the fork.
	sp, err := r.spawn(e, runAs, r.store.Create(rec, storedParams(p)))
	if err != nil {
		_ = r.onLoop(context.Background(), func() { r.abandon(e) })
		return api.Record{}, nil, &api.Error{Code: api.CodeInternal,
			Message: fmt.Sprintf("store: cannot record the execution, nothing was started: %v", err), Err: err}
	}
	// Hand the child to the loop whatever the client does now: from here
	// the execution belongs to the reactor.
	// The answer waits until the running (or failed-start) record is
	// durable: a record the client was given is one recovery knows, scope
	// and pid included.
	recCh := make(chan waitAnswer, 1)
	if r.beforeAdopt != nil {
		r.beforeAdopt()
	}
	if d := r.cfg.AdoptDelay; d > 0 && sp.startErr == nil {
		time.Sleep(d)
	}
	r.post(func() {
		e.startAck = recCh
		r.adopt(e, sp)
	})
	select {
	case a := <-recCh:
		return a.rec, a.js, nil
	case <-ctx.Done():
		return api.Record{}, nil, ctx.Err()
	}
}

// create registers a new execution in state started, or finds the one with
// the same idempotency key (old: its record, and the execution itself when
// it is still in memory, else nil). Loop goroutine only.
func (r *Reactor) create(caller api.Owner, p api.StartParams, prior *api.Record) (*execution, api.Record, bool, error) {
	if p.ID != "" {
		var found *api.Record
		old, ok := r.execs[p.ID]
		if ok {
			rec := r.snapshot(old)
			found = &rec
		} else if prior != nil {
			found = prior
		}
		if found != nil {
			if found.Owner.UID != caller.UID {
				return nil, api.Record{}, false, api.Errorf(api.CodeIdempotency, "id: %q is already in use", p.ID)
			}
			if !slices.Equal(found.Argv, p.Argv) {
				return nil, api.Record{}, false, api.Errorf(api.CodeIdempotency, "id: %q was started with a different argv", p.ID)
			}
			return old, *found, true, nil
		}
	}
	if r.cfg.MaxRunning > 0 && r.running >= r.cfg.MaxRunning {
		return nil, api.Record{}, false, api.Errorf(api.CodeOverCapacity, "over capacity: %d executions running (max %d)", r.running, r.cfg.MaxRunning)
	}
	if r.cfg.MaxPerUID > 0 && r.perUID[caller.UID] >= r.cfg.MaxPerUID {
		return nil, api.Record{}, false, api.Errorf(api.CodeOverCapacity, "over capacity: uid %d has %d executions running (max %d)", caller.UID, r.perUID[caller.UID], r.cfg.MaxPerUID)
	}
	now := time.Now()
	id := p.ID
	if id == "" {
		id = newID(now)
	}
	// The namespace resolved at accept served the network check; the
	// execution and its record keep the credentials only, so a record is
	// the same in memory as decoded from the store.
	caller.Netns = nil
	e := &execution{
		id: id, owner: caller, params: p,
		state: api.StateStarted, pidfd: -1,
		waiters:   make(map[chan waitAnswer]struct{}),
		followers: make(map[*follower]struct{}),
	}
	e.rec = api.Record{
		ID: id, Owner: caller, Argv: p.Argv, Labels: p.Labels, State: api.StateStarted,
		CreatedAt: now, User: p.User, Network: p.Network, Backend: r.cfg.Backend.Name(),
		TimeoutMS: p.TimeoutMS, IdleTimeoutMS: p.IdleTimeoutMS,
		TTY: p.TTY, TTYSize: p.TTYSize,
	}
	r.execs[id] = e
	r.running++
	r.perUID[caller.UID]++
	r.total.Add(1)
	argv := make([]string, len(p.Argv))
	copy(argv, p.Argv)
	ev := r.audit(e, "started").Strs("argv", argv)
	if p.TTY {
		ev = ev.Bool("tty", true).Str("tty_size", fmt.Sprintf("%dx%d", p.TTYSize.Rows, p.TTYSize.Cols))
	}
	if p.IdleTimeoutMS > 0 {
		ev = ev.Int64("idle_timeout_ms", p.IdleTimeoutMS)
	}
	ev.Msg("execution started")
	rec := r.snapshot(e)
	r.observe(e, 0, &rec)
	return e, rec, false, nil
}

// abandon forgets an execution whose record could not be stored; nothing
// was started for it. Loop goroutine only.
func (r *Reactor) abandon(e *execution) {
	delete(r.execs, e.id)
	r.running--
	if r.perUID[e.owner.UID]--; r.perUID[e.owner.UID] <= 0 {
		delete(r.perUID, e.owner.UID)
	}
	r.runningAt.Store(int64(r.running))
	r.audit(e, "refused").Msg("execution refused: store unavailable")
	for _, w := range e.cancelAcks {
		close(w.ch)
	}
	e.cancelAcks = nil
}

// Get implements exec.get.
func (r *Reactor) Get(ctx context.Context, caller api.Owner, p api.IDParams) (rec api.Record, err error) {
	if p.ID == "" {
		return rec, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	err = r.orStored(ctx, func() error {
		e, err := r.lookup(caller, p.ID)
		if err == nil {
			rec = r.snapshot(e)
		}
		return err
	}, func() (err error) {
		rec, err = r.stored(caller, p.ID)
		return err
	})
	return rec, err
}

// Wait implements exec.wait: the record once cleaned, or the current one
// when timeout_ms passes first.
func (r *Reactor) Wait(ctx context.Context, caller api.Owner, p api.WaitParams) (api.Record, error) {
	rec, _, err := r.WaitEncoded(ctx, caller, p)
	return rec, err
}

// waitAnswer is what an exec.wait caller is answered with at cleaned: the
// record, and its JSON as the store encoded it (nil when the write failed).
type waitAnswer struct {
	rec api.Record
	js  []byte
}

// WaitEncoded implements ipc.EncodedWaiter: Wait, and when it was answered
// at cleaned with the record the store wrote, that record's JSON too (the
// store's bytes: the record is not encoded again for the answer). Any other
// answer (already cleaned, from the store, a timeout) has no JSON.
func (r *Reactor) WaitEncoded(ctx context.Context, caller api.Owner, p api.WaitParams) (api.Record, json.RawMessage, error) {
	if p.ID == "" {
		return api.Record{}, nil, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	if p.TimeoutMS != nil && *p.TimeoutMS < 0 {
		return api.Record{}, nil, api.Errorf(api.CodeInvalidParams, "timeout_ms: must not be negative")
	}
	// Cleaned and durable a moment ago: answered here, without the loop
	// (the store's writer kept it: toCleaned).
	if d, ok := r.recentFor(caller, p.ID); ok {
		return d.rec, d.js, nil
	}
	var (
		rec  api.Record
		ch   chan waitAnswer
		err  error
		e    *execution
		done []byte // the store's JSON of rec, a record that just left memory
	)
	if lerr := r.onLoop(ctx, func() {
		if e, err = r.lookup(caller, p.ID); err != nil {
			if d, ok := r.recentFor(caller, p.ID); ok {
				rec, done, err = d.rec, d.js, nil
			}
			return
		}
		rec = r.snapshot(e)
		if !e.done {
			ch = make(chan waitAnswer, 1)
			e.waiters[ch] = struct{}{}
		}
	}); lerr != nil {
		return rec, nil, lerr
	}
	if done != nil {
		return rec, done, nil
	}
	if errors.Is(err, api.ErrNotFound) {
		rec, err := r.stored(caller, p.ID)
		return rec, nil, err
	}
	if err != nil || ch == nil {
		return rec, nil, err
	}
	var timeout <-chan time.Time
	if p.TimeoutMS != nil {
		t := time.NewTimer(time.Duration(*p.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case a := <-ch:
		return a.rec, a.js, nil
	case <-timeout:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cur := rec
	var durable <-chan api.Record
	_ = r.onLoop(context.Background(), func() {
		delete(e.waiters, ch)
		cur = r.snapshot(e)
		durable = r.whenCommitted(e, e.state) // told only once durable (a held exit is written now)
	})
	if err != nil {
		return cur, nil, err
	}
	cur, err = awaitDurable(ctx, durable, cur)
	return cur, nil, err
}

// awaitDurable is the record an answer may tell: the one durable (from
// whenCommitted's channel ch, nil when cur is durable already) or cur when
// ch closes without one (the execution was dropped). Any goroutine but the
// loop's.
func awaitDurable(ctx context.Context, ch <-chan api.Record, cur api.Record) (api.Record, error) {
	if ch == nil {
		return cur, nil
	}
	select {
	case got, ok := <-ch:
		if ok {
			return got, nil
		}
		return cur, nil
	case <-ctx.Done():
		return api.Record{}, ctx.Err()
	}
}

// Cancel implements exec.cancel; idempotent. The answer waits until the
// decision is durable: a record of the execution at canceling or beyond
// (at least the state it was in) came back from the store, the one the
// transition committed anyway, so a corrald restarted after a crash finds
// the execution canceling and ends it cancelled (adopt_linux.go). Nothing
// is written for the wait itself.
func (r *Reactor) Cancel(ctx context.Context, caller api.Owner, p api.CancelParams) (rec api.Record, err error) {
	if p.ID == "" {
		return rec, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	var ack <-chan api.Record
	err = r.orStored(ctx, func() error {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		r.toCanceling(e, cancelRequest{why: api.OutcomeCancelled, reason: p.Reason})
		rec = r.snapshot(e)
		ack = r.whenCommitted(e, max(api.StateCanceling, e.state))
		return nil
	}, func() (err error) {
		rec, err = r.stored(caller, p.ID) // finished: cancel is a no-op
		return err
	})
	if err != nil || ack == nil {
		return rec, err
	}
	select {
	case got, ok := <-ack:
		if !ok {
			return api.Record{}, api.ErrNotFound // never started: abandon
		}
		return got, nil
	case <-ctx.Done():
		return api.Record{}, ctx.Err()
	}
}

// Signal implements exec.signal. A finished execution is not signalled; its
// record is returned unchanged.
func (r *Reactor) Signal(ctx context.Context, caller api.Owner, p api.SignalParams) (rec api.Record, err error) {
	if p.ID == "" {
		return rec, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	sig, err := parseSignal(p.Signal)
	if err != nil {
		return rec, err
	}
	if p.Target != "" && p.Target != "all" && p.Target != "main" {
		return rec, api.Errorf(api.CodeInvalidParams, "target: must be \"all\" or \"main\"")
	}
	err = r.orStored(ctx, func() (err error) {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		rec = r.snapshot(e)
		switch {
		case e.state.Finished():
		case e.state == api.StateStarted:
			err = api.Errorf(api.CodeInvalidParams, "id: execution is still starting; retry")
		case p.Target == "main" && e.proc == nil:
			err = api.Errorf(api.CodeInvalidParams, "target: cannot signal the main process: %v", os.ErrProcessDone)
		case p.Target == "main":
			if serr := e.proc.Signal(sig); serr != nil {
				err = api.Errorf(api.CodeInvalidParams, "target: cannot signal the main process: %v", serr)
			}
		default:
			r.signalTree(e, sig)
		}
		if err == nil {
			r.log.Info().Str("exec_id", e.id).Str("event", "signal").Str("signal", signalName(sig)).
				Str("target", p.Target).Uint32("caller_uid", caller.UID).Msg("signal sent")
		}
		return err
	}, func() (err error) {
		rec, err = r.stored(caller, p.ID) // finished: nothing to signal
		return err
	})
	return rec, err
}

// Write implements exec.write.
func (r *Reactor) Write(ctx context.Context, caller api.Owner, p api.WriteParams) (res api.WriteResult, err error) {
	if p.ID == "" {
		return res, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	err = r.orStored(ctx, func() (err error) {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		res.Written, err = r.writeStdin(e, p.Data, p.Close)
		return err
	}, func() error {
		if _, err := r.stored(caller, p.ID); err != nil {
			return err
		}
		return api.Errorf(api.CodeInvalidParams, "stdin: the execution has finished")
	})
	return res, err
}

// List implements exec.list, newest first.
func (r *Reactor) List(ctx context.Context, caller api.Owner, p api.ListParams) (res api.ListResult, err error) {
	var want api.State
	if p.State != "" {
		if want, err = api.ParseState(p.State); err != nil {
			return res, api.Errorf(api.CodeInvalidParams, "state: %v", err)
		}
	}
	if p.Limit < 0 {
		return res, api.Errorf(api.CodeInvalidParams, "limit: must not be negative")
	}
	if p.Limit == 0 || p.Limit > maxList {
		// An hour of retained records can be many: answers stay bounded.
		p.Limit = maxList
	}
	res.Executions = []api.Record{}
	if lerr := r.onLoop(ctx, func() {
	next:
		for _, e := range r.execs {
			if caller.UID != 0 && e.owner.UID != caller.UID {
				continue
			}
			if want != 0 && e.state != want {
				continue
			}
			for k, v := range p.Labels {
				if e.params.Labels[k] != v {
					continue next
				}
			}
			res.Executions = append(res.Executions, r.snapshot(e))
		}
	}); lerr != nil {
		return res, lerr
	}
	// Cleaned executions live in the store only.
	f := store.ListFilter{Labels: p.Labels}
	if caller.UID != 0 {
		uid := caller.UID
		f.OwnerUID = &uid
	}
	if want != 0 {
		f.State = &want
	}
	f.Limit = p.Limit + len(res.Executions)
	if want == 0 || want == api.StateCleaned {
		old, serr := r.store.List(f)
		if serr != nil {
			return res, &api.Error{Code: api.CodeInternal, Message: "store: read failed", Err: serr}
		}
		seen := make(map[string]bool, len(res.Executions))
		for _, rec := range res.Executions {
			seen[rec.ID] = true
		}
		for _, rec := range old {
			if !seen[rec.ID] {
				res.Executions = append(res.Executions, rec)
			}
		}
	}
	sort.Slice(res.Executions, func(i, j int) bool {
		return res.Executions[i].CreatedAt.After(res.Executions[j].CreatedAt)
	})
	if len(res.Executions) > p.Limit {
		res.Executions = res.Executions[:p.Limit]
	}
	return res, nil
}

// Output implements exec.output.
func (r *Reactor) Output(ctx context.Context, caller api.Owner, p api.OutputParams) (res api.OutputResult, err error) {
	if p.WaitMS != 0 {
		// Parked on the loop (wait.go); this goroutine waits for the answer.
		type answer struct {
			res api.OutputResult
			err error
		}
		ch := make(chan answer, 1)
		r.OutputWait(ctx, caller, p, func(res api.OutputResult, err error) { ch <- answer{res, err} })
		a := <-ch
		return a.res, a.err
	}
	idx, err := streamIndex(p.Stream)
	if err != nil {
		return res, err
	}
	limit, err := outputLimit(p)
	if err != nil {
		return res, err
	}
	err = r.orStored(ctx, func() (err error) {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		res = readNow(e, e.streams[idx], p.Offset, limit)
		return nil
	}, func() (err error) {
		res, err = r.storedOutput(caller, p, limit)
		return err
	})
	return res, err
}

func streamIndex(s string) (int, error) {
	switch s {
	case "", "stdout":
		return 0, nil
	case "stderr":
		return 1, nil
	}
	return 0, api.Errorf(api.CodeInvalidParams, "stream: must be \"stdout\" or \"stderr\"")
}

// Info implements daemon.info.
func (r *Reactor) Info(ctx context.Context) (api.Info, error) {
	info := r.cfg.Info
	info.PID = os.Getpid()
	info.Backend = r.cfg.Backend.Name()
	info.Pidfd = info.Pidfd && !r.cfg.NoPidfd
	info.Default = r.cfg.Defaults
	info.Running = int(r.runningAt.Load())
	info.Total = r.total.Load()
	info.Store = store.Status(r.store)
	if r.pool != nil {
		pi := &api.PoolInfo{Size: r.pool.targetSize(), Idle: r.pool.idleCount(), Hits: r.pool.hits.Load(), Misses: r.pool.misses.Load()}
		if n := pi.Hits + pi.Misses; n > 0 {
			pi.HitRate = float64(pi.Hits) / float64(n)
		}
		info.Pool = pi
	}
	info.Adopted = r.adopted
	info.StartedAt = r.startedAt
	return info, nil
}

// Shutdown refuses new executions with -32005, cancels the running ones
// after drain, and returns once all are cleaned or ctx ends.
func (r *Reactor) Shutdown(ctx context.Context, drain time.Duration) error {
	r.stopping.Store(true)
	deadline := time.Now().Add(drain)
	for {
		var left int
		_ = r.onLoop(ctx, func() {
			// Done when nothing runs and every record is durable.
			left = r.running + r.inflight + len(r.dirty)
			if r.running == 0 && len(r.dirty) > 0 && r.retry == nil {
				r.retryDirty()
			}
			if time.Now().After(deadline) {
				for _, e := range r.execs {
					if !e.ending() { // this runs every 20ms: skip what is already ending
						r.toCanceling(e, cancelRequest{why: api.OutcomeCancelled, reason: "daemon shutting down"})
					}
				}
			}
		})
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("shutdown: %d executions not cleaned: %w", left, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
