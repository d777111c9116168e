package reactor

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
)

// follower is one exec.follow call. Created and used on the loop goroutine;
// done is read by the calling goroutine, and notify is also called from
// the store's answer to a commit (commit: send is safe from any
// goroutine).
type follower struct {
	send      func(method string, params any) bool
	done      chan api.Record // buffered 1: the final record
	heartbeat *eventloop.Timer
	dropped   atomic.Int64
	finished  bool
}

func (f *follower) notify(method string, params any) {
	if !f.send(method, params) {
		f.dropped.Add(1)
	}
}

func (f *follower) finish(rec api.Record) {
	if f.finished {
		return
	}
	f.finished = true
	f.done <- rec
}

// followChunk bounds one backlog notification (before base64).
const followChunk = 256 << 10

// Follow implements exec.follow: the kept output from the given offsets,
// then live output and state changes, heartbeats if asked, and the final
// record once cleaned. A slow reader loses notifications, never the daemon's
// memory: notify drops what its connection cannot take, and the client
// resumes with exec.output.
func (r *Reactor) Follow(ctx context.Context, caller api.Owner, p api.FollowParams, notify func(method string, params any) bool) (api.Record, error) {
	if p.ID == "" {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	if err := checkFollowParams(p); err != nil {
		return api.Record{}, err
	}
	f := &follower{send: notify, done: make(chan api.Record, 1)}
	var (
		e   *execution
		err error
	)
	if lerr := r.onLoop(ctx, func() {
		if e, err = r.lookup(caller, p.ID); err != nil {
			return
		}
		// Backlog first, then the current state; live output follows in
		// order because it is sent from the loop goroutine (a state
		// change may be sent from the store's answer, after this: commit).
		for i, off := range []int64{p.StdoutOffset, p.StderrOffset} {
			s := e.streams[i]
			if s == nil {
				continue
			}
			for off < s.kept.total {
				data, start, _ := s.kept.read(off, followChunk)
				if len(data) == 0 {
					break
				}
				f.notify(api.NotifyOutput, api.OutputNotification{ID: e.id, Stream: s.name, Offset: start, Data: data})
				off = start + int64(len(data))
			}
		}
		// A held exit is written now: this follower is told of it once
		// it is durable (hold.go).
		r.flushExit(e)
		rec := r.snapshot(e)
		if e.state <= e.committed || e.persisting == 0 {
			f.notify(api.NotifyState, api.StateNotification{Record: rec})
		}
		// Else the current state's write is in flight: its follow-up
		// tells this follower (commit, toCleaned) once the store has it,
		// and nothing older is shown meanwhile (the record the store had
		// before is not kept: a copy per execution costs about 0.6 KiB
		// of the daemon's memory per running child).
		if e.done {
			f.finish(rec)
			return
		}
		e.followers[f] = struct{}{}
		if p.HeartbeatMS > 0 {
			r.armHeartbeat(e, f, time.Duration(p.HeartbeatMS)*time.Millisecond)
		}
	}); lerr != nil {
		return api.Record{}, lerr
	}
	if errors.Is(err, api.ErrNotFound) {
		return r.followStored(caller, p, f)
	}
	if err != nil {
		return api.Record{}, err
	}
	select {
	case rec := <-f.done:
		return rec, nil
	case <-ctx.Done():
		_ = r.onLoop(context.Background(), func() {
			delete(e.followers, f)
			r.stopFollower(f)
		})
		return api.Record{}, ctx.Err()
	}
}

func (r *Reactor) armHeartbeat(e *execution, f *follower, every time.Duration) {
	f.heartbeat = r.loop.AfterFunc(every, func() {
		f.heartbeat = nil
		if f.finished || e.state == api.StateCleaned {
			return
		}
		if _, ok := e.followers[f]; !ok {
			return
		}
		u := e.rec.Usage
		if !e.state.Finished() {
			mergeStats(&u, r.stats(e))
		}
		f.notify(api.NotifyHeartbeat, api.HeartbeatNotification{ID: e.id, Usage: u})
		r.armHeartbeat(e, f, every)
	})
}

// stopFollower stops f's heartbeat. Loop goroutine only.
func (r *Reactor) stopFollower(f *follower) {
	if f.heartbeat != nil {
		r.loop.StopTimer(f.heartbeat)
		f.heartbeat = nil
	}
}

// followStored answers exec.follow for an execution only the store knows:
// its kept output from the offsets, its state, and the record at once.
func (r *Reactor) followStored(caller api.Owner, p api.FollowParams, f *follower) (api.Record, error) {
	rec, err := r.stored(caller, p.ID)
	if err != nil {
		return api.Record{}, err
	}
	for i, off := range []int64{p.StdoutOffset, p.StderrOffset} {
		stream := [2]string{"stdout", "stderr"}[i]
		k, ok, err := r.store.Output(p.ID, stream)
		if err != nil || !ok {
			continue
		}
		for off < k.Total {
			data, start, _ := k.Read(off, followChunk)
			if len(data) == 0 {
				break
			}
			f.notify(api.NotifyOutput, api.OutputNotification{ID: p.ID, Stream: stream, Offset: start, Data: data})
			off = start + int64(len(data))
		}
	}
	f.notify(api.NotifyState, api.StateNotification{Record: rec})
	return rec, nil
}

// checkFollowParams refuses a negative offset or heartbeat, naming the first
// such field so that the -32602 carries it in error.data.field.
func checkFollowParams(p api.FollowParams) error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"stdout_offset", p.StdoutOffset}, {"stderr_offset", p.StderrOffset}, {"heartbeat_ms", p.HeartbeatMS}} {
		if f.v < 0 {
			return api.Errorf(api.CodeInvalidParams, "%s: must not be negative", f.name)
		}
	}
	return nil
}
