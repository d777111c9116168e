package reactor

// This file is the execution state machine. Every state change goes through
// one of the transition functions below, in lifecycle order:
//
//	started --toRunning--> running --toCanceling--> canceling
//	   |                      |                        |
//	   +-------------------toExited--------------------+--> exited --toCleaned--> cleaned
//
// Which moves are legal is api.State.CanMoveTo, the one table the store's
// conditional update also uses. All of them run on the loop goroutine. A
// transition that does not apply to the current state is a no-op with a log
// line, never a regression: at Debug when it is stale (a late timer, a
// duplicate cancel), at Error when it is illegal (a bug). The side effects
// the transitions set in motion live in cleanup.go (signals, kill, cleanup),
// limits.go (the sampler), outcome.go (the outcome decision), durable.go
// (commit to the store) and hold.go (the exited record held for cleaned).

import (
	"maps"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
)

// execution is one supervised command. All fields are owned by the loop
// goroutine; the immutable ones (id, owner, params) may be read
// anywhere once the execution is published in Reactor.execs.
type execution struct {
	id     string
	owner  api.Owner
	params api.StartParams

	state api.State  // changed by transition only
	prev  api.State  // the state the last transition left, for catch-up writes
	rec   api.Record // the record as clients see it, kept current
	// cancel is corral's decision to end the execution, once made (the
	// first one wins). Made while started, it waits here until toRunning
	// applies it; it is also the outcome toExited reports. Set and read
	// in this file only.
	cancel *cancelRequest

	proc     *os.Process
	launched time.Time // when spawn let the command run: started_at (toRunning)
	pidfd    int       // dup'd pidfd in the loop's epoll set; -1 when none
	sc       scope.Scope
	streams  [2]*stream // stdout, stderr
	stdin    *stdinPipe
	tty      *terminal // tty: true: the terminal's master, owned here (tty_linux.go)
	work     string    // workspace to delete at cleanup, or ""
	parked   []string  // roles of its fds in the fd store (adopt_linux.go)
	// exitDurable: a record with its outcome (exited or cleaned) is
	// durable; until then its fds stay in the fd store (park_linux.go).
	exitDurable bool
	// exitHeld: the exited record is not written yet, held for the
	// cleaned one to carry (hold.go); holdWait bounds the hold.
	exitHeld bool
	holdWait *eventloop.Timer
	// exitDeferred: toExited waited once for the scope's OOM count
	// (deferExit, limits.go).
	exitDeferred bool

	timeout, grace, killWait, sampler, reap *eventloop.Timer
	idle                                    *eventloop.Timer // idle_timeout_ms (deadline.go)
	deadline                                time.Time        // wall-clock limit; exec.update moves it
	lastOutput                              time.Time        // last output byte, for the idle limit
	idleArms                                int              // times the idle timer was armed (a test checks it stays per period, not per chunk)
	scopeEmpty                              bool
	emptyWatch                              scope.EmptyWatch // cgroup.events in the epoll set during cleanup (cleanup.go), or nil
	cleaning                                bool             // remove/delete running off-loop
	releaseWork                             func()           // frees the removed workspace's inode, after cleaned is told (cleanup.go)

	// The tree kill and the scope's removal, retried while they fail
	// (cleanup.go): a kill in flight; the last kill's failure (nil once one
	// got through) and how many in a row, and when to retry; when a kill
	// first reached the tree (--kill-wait counts from it); failed removals
	// and when the first failed; survivors: cleanup gave up on a populated
	// scope, which cannot be removed.
	killing        bool
	killErr        error
	killFails      int
	killNext       time.Time
	killedAt       time.Time
	removeFails    int
	removeFailedAt time.Time
	survivors      bool

	waiters   map[chan waitAnswer]struct{} // exec.wait callers, answered at cleaned
	followers map[*follower]struct{}
	// persisting counts e's store writes not yet answered on the loop
	// (persist); a state notification is sent from the store's answer
	// only when none was in flight before it (commit).
	persisting int
	done       bool            // cleaned, and durable: waiters are answered at once
	startAck   chan waitAnswer // exec.start's answer, sent once its first transition is durable

	// committed is the furthest state whose record's write came back from
	// the store (durable, or failed and retried: markDirty); cancelAcks
	// are exec.cancel answers waiting for it (durable.go).
	committed  api.State
	cancelAcks []commitWait
	// endPending: canceling, its tree not signalled yet; endTree sends
	// the signal once the canceling record's write came back, or after
	// cancelCommitWait (endWait) when the store is slower than that.
	endPending bool
	endWait    *eventloop.Timer
}

// cancelRequest is why corral ends an execution.
type cancelRequest struct {
	why    api.Outcome // the outcome it will have: timeout, cancelled, cpu_limit, memory_limit
	hard   bool        // SIGKILL at once, no grace
	reason string      // the client's words (exec.cancel reason), or ""
}

// ending reports whether corral has decided to end e, or it has ended: a
// sampler or a limit need not act on it any more.
func (e *execution) ending() bool { return e.cancel != nil || e.state.Finished() }

// cancelWhy is the outcome corral decided to end e with, or "".
func (e *execution) cancelWhy() api.Outcome {
	if e.cancel == nil {
		return ""
	}
	return e.cancel.why
}

// transition moves e to next when the lifecycle allows it (api.State
// CanMoveTo, the one table). A move to a state e has already reached or
// passed is stale (a late timer, a duplicate event): a no-op, logged at
// Debug. Any other move is a bug: a no-op, logged at Error with both states.
func (r *Reactor) transition(e *execution, next api.State) bool {
	cur := e.state
	switch {
	case cur.CanMoveTo(next):
		e.prev, e.state, e.rec.State = cur, next, next
		return true
	case next <= cur: // states are declared in lifecycle order
		r.log.Debug().Str("exec_id", e.id).Stringer("state", cur).Stringer("to", next).
			Msg("transition already passed; ignored")
	default:
		r.log.Error().Str("exec_id", e.id).Stringer("state", cur).Stringer("to", next).
			Msg("illegal transition; ignored")
	}
	return false
}

// toRunning: started -> running. The child runs; its pidfd (or waiter) and
// pipes are watched by the loop. Timers for the wall limit and sampling start
// here. A cancel that arrived while it was spawning is applied at once.
func (r *Reactor) toRunning(e *execution) {
	if !r.transition(e, api.StateRunning) {
		return
	}
	// started_at is when the command was let run (spawn stamps it), not
	// now: under load the loop takes this up later, and the wall limit
	// counts from the start the child saw.
	now := e.launched
	if now.IsZero() {
		now = time.Now()
	}
	e.rec.StartedAt = &now
	e.rec.PID = e.proc.Pid
	if e.sc != nil {
		e.rec.Scope = e.sc.Name()
	}
	if e.deadline.IsZero() { // else exec.update set it while spawning
		e.deadline = now.Add(time.Duration(e.params.TimeoutMS) * time.Millisecond)
	}
	r.armDeadline(e)
	r.armIdle(e)
	if needsSampler(e) {
		r.armSampler(e, 0)
	}
	r.audit(e, "running").Int("pid", e.proc.Pid).Time("deadline", e.deadline).Msg("execution running")
	r.commit(e)
	if e.cancel != nil {
		r.enterCanceling(e, *e.cancel)
	}
}

// toRunningAdopted: started -> running for an execution re-adopted after
// a crash of corrald that came after its command was let run but before
// its running record (readopt). Its pid and scope were recovered from the
// pidfd and the backend (StartedScope); when the command was let run is
// lost with the crash, so started_at is the record's created_at, which
// comes before it: the wall limit counts from no later than the child's
// start, and the record says it was adopted (adopted > 0). The caller
// watches the pidfd and writes the record.
func (r *Reactor) toRunningAdopted(e *execution) {
	if !r.transition(e, api.StateRunning) {
		return
	}
	at := e.rec.CreatedAt
	e.rec.StartedAt = &at
	if e.proc != nil {
		e.rec.PID = e.proc.Pid
	}
	if e.sc != nil {
		e.rec.Scope = e.sc.Name()
	}
	r.audit(e, "running").Int("pid", e.rec.PID).Bool("adopted_started", true).Msg("execution running (adopted before its running record)")
}

// toCanceling: running -> canceling. corral is ending the execution: SIGTERM
// to the whole tree once the canceling record is durable, then SIGKILL after
// grace_ms (at once when c.hard).
// c.why is the outcome the execution will have, whatever the child does
// next. The first decision wins; later ones are no-ops. On started the
// decision is kept and toRunning applies it (or the start fails, and that
// is the outcome).
func (r *Reactor) toCanceling(e *execution, c cancelRequest) {
	if e.cancel != nil {
		r.log.Debug().Str("exec_id", e.id).Stringer("state", e.state).Str("reason", string(c.why)).
			Str("already", string(e.cancel.why)).Msg("already being ended; ignored")
		return
	}
	if e.state == api.StateStarted {
		e.cancel = &c
		if c.reason != "" {
			e.rec.CancelReason = c.reason
		}
		return
	}
	r.enterCanceling(e, c)
}

// resumeCanceling takes over an execution an earlier image of corrald was
// already ending (adopt_linux.go): c as decided then; SIGKILL at once, its
// grace ran while corrald was down.
func (r *Reactor) resumeCanceling(e *execution, c cancelRequest) {
	e.cancel = &c
	r.killAdopted(e)
}

// enterCanceling makes the move of toCanceling, with c decided. The tree
// is signalled once the canceling record is durable (endTree, from the
// commit's follow-up): a crash before that leaves the store saying running,
// and the restarted corrald would carry on as if nothing had been decided,
// while the child, signalled or not, ends in a way decided without the
// cancel (exited 0 of a cancelled execution, found by tests/drill
// sd-kill-9). A store slower than cancelCommitWait does not hold a limit
// back: the signal goes then.
func (r *Reactor) enterCanceling(e *execution, c cancelRequest) {
	if !r.transition(e, api.StateCanceling) {
		return
	}
	e.cancel = &c
	if c.reason != "" {
		e.rec.CancelReason = c.reason
	}
	e.rec.CancelOutcome = c.why
	r.stopTimer(&e.timeout)
	r.stopTimer(&e.idle)
	e.rec.Deadline = nil // the grace period applies now
	r.audit(e, "canceling").Str("reason", string(c.why)).Msg("execution canceling")
	e.endPending = true
	e.endWait = r.loop.AfterFunc(cancelCommitWait, func() {
		e.endWait = nil
		r.log.Warn().Str("exec_id", e.id).Dur("waited", cancelCommitWait).
			Msg("store: canceling record not durable yet; signalling the tree anyway")
		r.endTree(e)
	})
	r.commit(e)
}

// cancelCommitWait bounds how long enterCanceling waits for the canceling
// record to be durable before it signals the tree anyway.
const cancelCommitWait = time.Second

// endTree signals the tree of a canceling execution, once: SIGTERM, then
// SIGKILL after grace_ms (at once when the cancel is hard).
func (r *Reactor) endTree(e *execution) {
	if !e.endPending {
		return
	}
	e.endPending = false
	r.stopTimer(&e.endWait)
	if e.state != api.StateCanceling {
		return // exited meanwhile: its cleanup kills what is left
	}
	if e.cancel.hard || e.params.GraceMS <= 0 {
		r.killTree(e)
		return
	}
	r.signalTree(e, unix.SIGTERM)
	e.grace = r.loop.AfterFunc(time.Duration(e.params.GraceMS)*time.Millisecond, func() {
		e.grace = nil
		r.killTree(e)
	})
}

// exitResult is what the one Wait returned, or why there was none.
type exitResult struct {
	ps       *os.ProcessState
	err      error  // Wait failed
	startErr error  // the command never ran
	errno    string // errno name of startErr
	forced   string // reached exited without a Wait: why
	// An adopted child someone else reaped: its status from the pidfd
	// (PIDFD_INFO_EXIT), or why it cannot be known (outcome lost).
	status *syscall.WaitStatus
	lost   string
}

// toExited: started|running|canceling -> exited. The main process was reaped
// (or never ran, or would not die). The outcome is decided here, once
// (decideOutcome). The rest of the tree is killed and cleanup starts.
func (r *Reactor) toExited(e *execution, res exitResult) {
	if r.deferExit(e, res) {
		return // back here once the scope knows whether it saw an OOM kill
	}
	r.drainBeforeExit(e)
	if !r.transition(e, api.StateExited) {
		return
	}
	now := time.Now()
	e.rec.ExitedAt = &now
	if e.rec.StartedAt != nil {
		e.rec.DurationMS = now.Sub(*e.rec.StartedAt).Milliseconds()
	}
	r.stopTimer(&e.timeout)
	r.stopTimer(&e.idle)
	e.rec.Deadline = nil
	r.stopTimer(&e.grace)
	r.stopTimer(&e.sampler)
	r.stopTimer(&e.killWait)
	r.stopTimer(&e.endWait)
	e.endPending = false
	e.rec.CancelOutcome = "" // outcome says it from here on

	stats, empty := r.exitStats(e)
	f := exitFacts{startErr: res.startErr, waitErr: res.err, forced: res.forced,
		oomKills: stats.OOMKills, limits: e.params, timeoutMS: e.rec.TimeoutMS}
	if e.cancel != nil {
		f.cancel = e.cancel.why
	}
	if res.startErr != nil {
		e.rec.StartErrno = res.errno
	}
	if res.ps != nil {
		f.status = waitStatus(res.ps)
		if ru, ok := res.ps.SysUsage().(*syscall.Rusage); ok {
			e.rec.Usage.CPUUserMS = ru.Utime.Nano() / 1e6
			e.rec.Usage.CPUSystemMS = ru.Stime.Nano() / 1e6
			e.rec.Usage.PeakMemoryBytes = ru.Maxrss * 1024
		}
	} else if res.status != nil {
		// Reaped by another process (adopt_linux.go): no rusage; the
		// scope's counters stand in for it.
		f.status = decodeStatus(*res.status, max(stats.CPUUsageNS, 0)/1e6)
	}
	if f.status.exited {
		code := f.status.code
		e.rec.ExitCode = &code
	}
	if f.status.signaled {
		name := signalName(f.status.signal)
		e.rec.Signal = &name
	}
	mergeStats(&e.rec.Usage, stats)
	outcome, errText := decideOutcome(f)
	if res.lost != "" && f.cancel == "" {
		outcome, errText = api.OutcomeLost, res.lost
	}
	e.rec.Outcome = &outcome
	if errText != "" {
		e.rec.Error = &errText
	}
	ev := r.audit(e, "exited").Str("outcome", string(outcome)).Int64("duration_ms", e.rec.DurationMS)
	if e.rec.ExitCode != nil {
		ev = ev.Int("exit_code", *e.rec.ExitCode)
	}
	if e.rec.Signal != nil {
		ev = ev.Str("signal", *e.rec.Signal)
	}
	if errText != "" {
		ev = ev.Str("error", errText)
	}
	ev.Msg("execution exited")
	if r.mayHoldExit(e) {
		r.holdExit(e, empty)
		return
	}
	r.commitExit(e)
	r.startCleanup(e, empty)
}

// commitExit queues e's exited record (commit). Loop goroutine only.
func (r *Reactor) commitExit(e *execution) {
	r.writeExit(e, true)
}

// writeExit queues e's exited record; observe: tell the observer of the
// transition (not when holdExit did already). Loop goroutine only.
func (r *Reactor) writeExit(e *execution, observe bool) {
	outs := r.recordOutputs(e)
	rec := r.snapshot(e)
	if observe {
		r.observe(e, e.prev, &rec)
	}
	if r.commitRecord(e, rec, outs...) {
		// The store's writer, just woken for the exited record, waits in
		// this thread's run queue: let it run here now instead of after a
		// wake-up of another thread; the loop goes on where a thread is
		// free. Not when the store already answered (--store memory, a
		// failed write): nothing would run in its place.
		runtime.Gosched()
	}
}

// toCleaned: exited -> cleaned. The tree is gone (or reported as not), the
// scope removed, fds closed, the workspace deleted. Waiters get the record.
func (r *Reactor) toCleaned(e *execution, leftover string) {
	if !r.transition(e, api.StateCleaned) {
		r.releaseWorkspace(e)
		return
	}
	// A held exited record (holdExit) is written by this commit: from
	// exited, over the running record the store holds (the store's
	// catch-up rule, as markDirty's rewrites).
	r.releaseExit(e)
	now := time.Now()
	e.rec.CleanedAt = &now
	if leftover != "" {
		if e.rec.Error != nil {
			leftover = *e.rec.Error + "; " + leftover
		}
		e.rec.Error = &leftover
	}
	r.running--
	r.perUID[e.owner.UID]--
	if r.perUID[e.owner.UID] <= 0 {
		delete(r.perUID, e.owner.UID)
	}
	r.audit(e, "cleaned").Msg("execution cleaned")
	r.runningAt.Store(int64(r.running))
	rec := r.snapshot(e)
	r.observe(e, e.prev, &rec)
	// The final record, with the kept output, is durable before any client
	// hears of it; from then on the store answers for it. The exec.wait
	// callers waiting now are answered from the store's answer itself (the
	// writer goroutine), as soon as it is durable, as commit tells
	// followers: the post back to the loop and its wake-up are off the
	// answer's path. From that moment the record is also kept for the
	// exec.wait calls still to come (remember): they are answered on their
	// own goroutine, without a round trip through the loop (WaitEncoded).
	// A caller that came since, or every caller when the write failed, is
	// answered from the loop.
	var (
		early map[chan waitAnswer]struct{}
		told  bool // set by answered, read on the loop after the post
	)
	if len(e.waiters) > 0 {
		early = maps.Clone(e.waiters)
	}
	answered := func(res store.Result) {
		if res.Err != nil || res.JSON == nil {
			return
		}
		r.remember(rec, res.JSON)
		for ch := range early {
			ch <- waitAnswer{rec: rec, js: res.JSON} // buffered: one answer each
		}
		told = true
	}
	queued := r.persistAnswered(e, e.prev, rec, answered, func(ok bool, js []byte) {
		if ok {
			r.durableAs(e, rec.State) // drops the spools: the store holds the kept output now
		}
		r.committedAs(e, rec)
		r.tell(e, rec, js)
		e.done = true
		for ch := range e.waiters {
			if _, was := early[ch]; told && was {
				continue
			}
			ch <- waitAnswer{rec: rec, js: js}
		}
		e.waiters = nil
		for f := range e.followers {
			r.stopFollower(f)
			f.finish(rec)
		}
		e.followers = nil
		r.releaseWorkspace(e)
		if ok {
			delete(r.execs, e.id) // answered is remembered by now
		}
		// Not durable: it stays in memory, answering clients, until a
		// retry writes it (markDirty).
	}, r.recordOutputs(e)...)
	if queued {
		runtime.Gosched() // the writer runs here now, as after exited
	}
}

// releaseWorkspace lets the file system free e's removed workspace (see
// removeWorkspaceHeld), off the loop: on ext4 that is a journaled inode
// free, most of what an rmdir costs. Loop goroutine only.
func (r *Reactor) releaseWorkspace(e *execution) {
	if e.releaseWork != nil {
		go e.releaseWork()
		e.releaseWork = nil
	}
}
