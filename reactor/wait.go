package reactor

// exec.output with wait_ms: a call that finds nothing new parks on the loop
// goroutine, on the stream it reads, until data arrives, the stream ends or
// wait_ms passes. A parked read is a small struct, one loop timer and a
// context.AfterFunc registration: no goroutine waits for it (the ipc server
// parks the request too, see ipc.OutputWaiter), so thousands cost little.
// Parked reads of a stream are answered in the order they parked.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
)

// wakeChunk bounds the data of an answer sent from the loop goroutine (a
// woken parked read): it is encoded there, and many readers may wake at
// once. The client continues from next_offset.
const wakeChunk = 256 << 10

// parkedRead is one exec.output call waiting on a stream. Loop goroutine
// only, except reply, which is safe to call once from anywhere.
type parkedRead struct {
	s      *stream
	offset int64
	limit  int64
	reply  func(api.OutputResult, error)
	timer  *eventloop.Timer
	stop   func() bool // deregisters the context watch
	done   bool
}

// outputLimit validates exec.output's params and returns the effective
// limit.
func outputLimit(p api.OutputParams) (int64, error) {
	if p.Offset < 0 {
		return 0, api.Errorf(api.CodeInvalidParams, "offset: must not be negative")
	}
	if p.Limit < 0 {
		return 0, api.Errorf(api.CodeInvalidParams, "limit: must not be negative")
	}
	if p.WaitMS < 0 {
		return 0, api.Errorf(api.CodeInvalidParams, "wait_ms: must not be negative")
	}
	if p.WaitMS > api.MaxWaitMS {
		return 0, api.Errorf(api.CodeInvalidParams, "wait_ms: at most %d", api.MaxWaitMS)
	}
	limit := p.Limit
	if limit == 0 || limit > 4<<20 {
		limit = 4 << 20
	}
	return limit, nil
}

// readNow answers exec.output from what s keeps. Loop goroutine only.
func readNow(e *execution, s *stream, offset, limit int64) api.OutputResult {
	if s == nil { // never started
		return api.OutputResult{Data: []byte{}, EOF: e.state.Finished()}
	}
	data, start, gap := s.kept.read(offset, limit)
	res := api.OutputResult{
		Data: data, Offset: start, NextOffset: start + int64(len(data)),
		TotalBytes: s.kept.total, Gap: gap,
	}
	res.EOF = s.fd < 0 && res.NextOffset >= s.kept.total
	if res.Data == nil {
		res.Data = []byte{}
	}
	return res
}

// OutputWait implements ipc.OutputWaiter: exec.output that parks on the
// loop while nothing past offset is kept and the stream is open. reply is
// called exactly once: from this goroutine when the answer is ready now,
// otherwise from the loop goroutine.
func (r *Reactor) OutputWait(ctx context.Context, caller api.Owner, p api.OutputParams, reply func(api.OutputResult, error)) {
	var once sync.Once
	answer := func(res api.OutputResult, err error) { once.Do(func() { reply(res, err) }) }
	idx, err := streamIndex(p.Stream)
	if err != nil {
		answer(api.OutputResult{}, err)
		return
	}
	limit, err := outputLimit(p)
	if err != nil {
		answer(api.OutputResult{}, err)
		return
	}
	var (
		res    api.OutputResult
		parked bool
	)
	lerr := r.onLoop(ctx, func() {
		var e *execution
		if e, err = r.lookup(caller, p.ID); err != nil {
			return
		}
		s := e.streams[idx]
		if s == nil && !e.state.Finished() && p.WaitMS > 0 {
			// Still spawning: wait for the stream on the loop, bounded.
			r.parkStarting(ctx, e, idx, p, limit, answer)
			parked = true
			return
		}
		res = readNow(e, s, p.Offset, limit)
		if len(res.Data) > 0 || res.EOF || p.WaitMS <= 0 || s.kept.total > p.Offset {
			return
		}
		r.park(ctx, s, p, limit, answer)
		parked = true
	})
	switch {
	case lerr != nil:
		answer(api.OutputResult{}, lerr)
	case parked:
	case errors.Is(err, api.ErrNotFound):
		// Only the store knows it: finished, nothing to wait for.
		res, err = r.storedOutput(caller, p, limit)
		answer(res, err)
	default:
		answer(res, err)
	}
}

// park queues a read on s until data, EOF, wait_ms or ctx. Loop goroutine
// only.
func (r *Reactor) park(ctx context.Context, s *stream, p api.OutputParams, limit int64, reply func(api.OutputResult, error)) {
	pr := &parkedRead{s: s, offset: p.Offset, limit: min(limit, wakeChunk), reply: reply}
	s.parked = append(s.parked, pr)
	pr.timer = r.loop.AfterFunc(time.Duration(p.WaitMS)*time.Millisecond, func() {
		pr.timer = nil
		r.answerParked(pr, api.OutputResult{
			Data: []byte{}, Offset: min(pr.offset, s.kept.total), NextOffset: min(pr.offset, s.kept.total),
			TotalBytes: s.kept.total,
		}, nil)
	})
	// A closed connection drops the read. AfterFunc starts a goroutine
	// only when ctx ends; none waits meanwhile.
	pr.stop = context.AfterFunc(ctx, func() {
		if err := r.loop.Post(func() { r.answerParked(pr, api.OutputResult{}, ctx.Err()) }); err != nil {
			reply(api.OutputResult{}, ctx.Err()) // the loop has stopped: nothing else will answer
		}
	})
}

// parkStarting waits for a stream that does not exist yet (the execution is
// still spawning): it re-checks every few ms until the deadline. Rare, so
// a simple poll on the loop's timers.
func (r *Reactor) parkStarting(ctx context.Context, e *execution, idx int, p api.OutputParams, limit int64, reply func(api.OutputResult, error)) {
	deadline := time.Now().Add(time.Duration(p.WaitMS) * time.Millisecond)
	var check func()
	check = func() {
		if ctx.Err() != nil {
			reply(api.OutputResult{}, ctx.Err())
			return
		}
		s := e.streams[idx]
		if s == nil && !e.state.Finished() {
			if time.Now().After(deadline) {
				reply(api.OutputResult{Data: []byte{}, Offset: p.Offset, NextOffset: p.Offset}, nil)
				return
			}
			r.loop.AfterFunc(5*time.Millisecond, check)
			return
		}
		res := readNow(e, s, p.Offset, limit)
		if len(res.Data) > 0 || res.EOF || s == nil || s.kept.total > p.Offset {
			reply(res, nil)
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			reply(res, nil)
			return
		}
		q := p
		q.WaitMS = max(left.Milliseconds(), 1)
		r.park(ctx, s, q, limit, reply)
	}
	check()
}

// answerParked answers pr once and takes it off its stream's queue. Loop
// goroutine only.
func (r *Reactor) answerParked(pr *parkedRead, res api.OutputResult, err error) {
	if pr.done {
		return
	}
	pr.done = true
	r.stopTimer(&pr.timer)
	if pr.stop != nil {
		pr.stop()
	}
	q := pr.s.parked
	for i, x := range q {
		if x == pr {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			pr.s.parked = q[:len(q)-1]
			break
		}
	}
	pr.reply(res, err)
}

// wakeParked answers, in order, every read parked on s that can be
// answered now: data past its offset, or the stream ended. Loop goroutine
// only; called when s got data and when it closed.
func (r *Reactor) wakeParked(e *execution, s *stream) {
	if len(s.parked) == 0 {
		return
	}
	q := s.parked
	s.parked = nil
	var keep []*parkedRead
	for _, pr := range q {
		if s.fd >= 0 && s.kept.total <= pr.offset {
			keep = append(keep, pr)
			continue
		}
		pr.done = true
		r.stopTimer(&pr.timer)
		if pr.stop != nil {
			pr.stop()
		}
		pr.reply(readNow(e, s, pr.offset, pr.limit), nil)
	}
	s.parked = append(keep, s.parked...)
}
