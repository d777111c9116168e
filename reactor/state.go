package reactor

// This file is the execution state machine. Every state change goes through
// one of the transition functions below, in lifecycle order:
//
//	started --toRunning--> running --toCanceling--> canceling
//	   |                      |                        |
//	   +-------------------toExited--------------------+--> exited --toCleaned--> cleaned
//
// All of them run on the loop goroutine. A transition that does not apply to
// the current state (a late timer, a duplicate cancel) is a no-op with a log
// line, never a regression.

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/scope"
)

// legal lists, for each state, the states it may move to.
var legal = map[api.State][]api.State{
	api.StateStarted:   {api.StateRunning, api.StateExited},
	api.StateRunning:   {api.StateCanceling, api.StateExited},
	api.StateCanceling: {api.StateExited},
	api.StateExited:    {api.StateCleaned},
	api.StateCleaned:   nil,
}

// execution is one supervised command. All fields are owned by the loop
// goroutine; the immutable ones (id, owner, params) may be read
// anywhere once the execution is published in Reactor.execs.
type execution struct {
	id     string
	owner  api.Owner
	params api.StartParams

	state    api.State
	rec      api.Record  // the record as clients see it, kept current
	pending  api.Outcome // why corral is ending it (timeout, cancelled, cpu_limit, memory_limit), or ""
	hardKill bool        // the pending outcome asked for SIGKILL at once

	proc    *os.Process
	pidfd   int // dup'd pidfd in the loop's epoll set; -1 when none
	sc      scope.Scope
	streams [2]*stream // stdout, stderr
	stdin   *stdinPipe
	tty     *terminal // tty: true: the terminal's master, owned here (tty_linux.go)
	work    string    // workspace to delete at cleanup, or ""

	timeout, grace, killWait, sampler, reap *eventloop.Timer
	idle                                    *eventloop.Timer // idle_timeout_ms (deadline.go)
	deadline                                time.Time        // wall-clock limit; exec.update moves it
	lastOutput                              time.Time        // last output byte, for the idle limit
	scopeEmpty                              bool
	cleaning                                bool // remove/delete running off-loop

	waiters   map[chan api.Record]struct{} // exec.wait callers, answered at cleaned
	followers map[*follower]struct{}
	done      bool            // cleaned, and durable: waiters are answered at once
	startAck  chan api.Record // exec.start's answer, sent once its first transition is durable
}

// transition moves e to next if the state machine allows it.
func (r *Reactor) transition(e *execution, next api.State) bool {
	for _, s := range legal[e.state] {
		if s == next {
			e.state = next
			e.rec.State = next
			return true
		}
	}
	r.log.Debug().Str("exec_id", e.id).Stringer("state", e.state).Stringer("to", next).
		Msg("transition does not apply; ignored")
	return false
}

// toRunning: started -> running. The child runs; its pidfd (or waiter) and
// pipes are watched by the loop. Timers for the wall limit and sampling start
// here. A cancel that arrived while it was spawning is applied at once.
func (r *Reactor) toRunning(e *execution) {
	from := e.state
	if !r.transition(e, api.StateRunning) {
		return
	}
	now := time.Now()
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
	if e.params.CPUMS > 0 || e.params.MemoryBytes > 0 {
		r.armSampler(e)
	}
	r.audit(e, "running").Int("pid", e.proc.Pid).Msg("execution running")
	r.commit(e, from)
	if e.pending != "" {
		r.toCanceling(e, e.pending, e.hardKill)
	}
}

// toCanceling: running -> canceling. corral is ending the execution: SIGTERM
// to the whole tree, then SIGKILL after grace_ms (at once when hard). why is
// the outcome the execution will have, whatever the child does next.
func (r *Reactor) toCanceling(e *execution, why api.Outcome, hard bool) {
	if e.state == api.StateStarted {
		// Still spawning: toRunning applies it.
		if e.pending == "" {
			e.pending, e.hardKill = why, hard
		}
		return
	}
	from := e.state
	if !r.transition(e, api.StateCanceling) {
		return
	}
	e.pending = why
	r.stopTimer(&e.timeout)
	r.stopTimer(&e.idle)
	e.rec.Deadline = nil // the grace period applies now
	r.audit(e, "canceling").Str("reason", string(why)).Msg("execution canceling")
	r.commit(e, from)
	if hard || e.params.GraceMS <= 0 {
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
}

// toExited: started|running|canceling -> exited. The main process was reaped
// (or never ran, or would not die). The outcome is decided here, once. The
// rest of the tree is killed and cleanup starts.
func (r *Reactor) toExited(e *execution, res exitResult) {
	from := e.state
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

	var outcome api.Outcome
	var errText string
	stats := r.stats(e)
	switch {
	case res.startErr != nil:
		outcome, errText = api.OutcomeStartFailed, res.startErr.Error()
		e.rec.StartErrno = res.errno
	case e.pending != "":
		outcome = e.pending
	case stats.OOMKills > 0:
		outcome = api.OutcomeMemoryLimit
	}
	if res.ps != nil {
		ws, _ := res.ps.Sys().(syscall.WaitStatus)
		switch {
		case ws.Exited():
			code := ws.ExitStatus()
			e.rec.ExitCode = &code
			if outcome == "" {
				outcome = api.OutcomeExited
			}
		case ws.Signaled():
			sig := unix.Signal(ws.Signal())
			name := signalName(sig)
			e.rec.Signal = &name
			if outcome == "" && e.params.CPUMS > 0 && (sig == unix.SIGXCPU || sig == unix.SIGKILL && rusageCPU(res.ps) >= e.params.CPUMS) {
				// The RLIMIT_CPU backstop fired (SIGXCPU at the soft limit,
				// SIGKILL at the hard one).
				outcome = api.OutcomeCPULimit
			}
			if outcome == "" {
				outcome = api.OutcomeSignaled
			}
		}
		if ru, ok := res.ps.SysUsage().(*syscall.Rusage); ok {
			e.rec.Usage.CPUUserMS = ru.Utime.Nano() / 1e6
			e.rec.Usage.CPUSystemMS = ru.Stime.Nano() / 1e6
			e.rec.Usage.PeakMemoryBytes = ru.Maxrss * 1024
		}
	}
	if res.err != nil {
		errText = fmt.Sprintf("wait: %v", res.err)
	}
	if res.forced != "" {
		errText = res.forced
	}
	if outcome == "" {
		outcome = api.OutcomeSignaled
	}
	mergeStats(&e.rec.Usage, stats)
	if errText == "" {
		errText = limitError(e, outcome)
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
	r.commit(e, from)
	r.startCleanup(e)
}

// toCleaned: exited -> cleaned. The tree is gone (or reported as not), the
// scope removed, fds closed, the workspace deleted. Waiters get the record.
func (r *Reactor) toCleaned(e *execution, leftover string) {
	if !r.transition(e, api.StateCleaned) {
		return
	}
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
	r.observe(e, api.StateExited, &rec)
	// The final record, with the kept output, is durable before any client
	// hears of it; from then on the store answers for it.
	r.persist(e, api.StateExited, rec, func(ok bool) {
		r.tell(e, rec)
		e.done = true
		for ch := range e.waiters {
			ch <- rec
		}
		e.waiters = nil
		for f := range e.followers {
			r.stopFollower(f)
			f.finish(rec)
		}
		e.followers = nil
		if ok {
			delete(r.execs, e.id)
		}
		// Not durable: it stays in memory, answering clients, until a
		// retry writes it (markDirty).
	}, keptForStore(e)...)
}

// commit persists the transition e just made from state from and tells
