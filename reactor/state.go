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
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/rs/zerolog"
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
	work    string // workspace to delete at cleanup, or ""

	timeout, grace, killWait, sampler, reap *eventloop.Timer
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
	e.timeout = r.loop.AfterFunc(time.Duration(e.params.TimeoutMS)*time.Millisecond, func() {
		e.timeout = nil
		r.toCanceling(e, api.OutcomeTimeout, false)
	})
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
	if outcome == api.OutcomeTimeout && errText == "" {
		errText = fmt.Sprintf("timed out after %d ms", e.params.TimeoutMS)
	}
	if outcome == api.OutcomeCPULimit && errText == "" {
		errText = fmt.Sprintf("CPU time of the tree passed cpu_ms %d", e.params.CPUMS)
	}
	if outcome == api.OutcomeMemoryLimit && errText == "" {
		errText = fmt.Sprintf("the tree was OOM-killed (memory_bytes %d)", e.params.MemoryBytes)
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
// followers once it is durable. Loop goroutine only.
func (r *Reactor) commit(e *execution, from api.State) {
	r.runningAt.Store(int64(r.running))
	rec := r.snapshot(e)
	r.persist(e, from, rec, func(bool) {
		r.tell(e, rec)
		if e.startAck != nil {
			e.startAck <- rec
			e.startAck = nil
		}
	})
}

// tell sends a state notification to e's followers.
func (r *Reactor) tell(e *execution, rec api.Record) {
	if len(e.followers) == 0 {
		return
	}
	n := api.StateNotification{Record: rec}
	for f := range e.followers {
		f.notify(api.NotifyState, n)
	}
}

// --- what the transitions set in motion ---

// signalTree sends sig to every process of e's tree, off the loop (the
// systemd backend talks D-Bus).
func (r *Reactor) signalTree(e *execution, sig unix.Signal) {
	sc, id := e.sc, e.id
	if sc == nil {
		return
	}
	go func() {
		if err := sc.Signal(sig); err != nil {
			r.log.Warn().Err(err).Str("exec_id", id).Str("signal", signalName(sig)).Msg("signal tree")
		}
	}()
}

// killTree sends SIGKILL to the tree and to the main process through its
// pidfd, then bounds how long the main process may take to die.
func (r *Reactor) killTree(e *execution) {
	if e.proc != nil && !e.state.Finished() {
		if err := e.proc.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			r.log.Warn().Err(err).Str("exec_id", e.id).Msg("kill main process")
		}
	}
	if sc, id := e.sc, e.id; sc != nil {
		go func() {
			// ENODEV/ENOENT: the scope is already gone, nothing to kill.
			if err := sc.Kill(); err != nil && !errors.Is(err, unix.ENODEV) && !errors.Is(err, os.ErrNotExist) {
				r.log.Warn().Err(err).Str("exec_id", id).Msg("kill tree")
			}
		}()
	}
	if e.state.Finished() || e.killWait != nil {
		return
	}
	e.killWait = r.loop.AfterFunc(r.cfg.KillWait, func() {
		e.killWait = nil
		// The main process survived SIGKILL (uninterruptible sleep): report
		// it and move on. The pidfd stays watched so it is reaped later.
		r.toExited(e, exitResult{forced: fmt.Sprintf(
			"main process %d did not exit %v after SIGKILL (uninterruptible sleep?)", e.proc.Pid, r.cfg.KillWait)})
	})
}

// startCleanup kills what is left of the tree and waits, bounded, until the
// scope is empty and the pipes are closed; then removes the scope and the
// workspace off the loop and moves to cleaned.
func (r *Reactor) startCleanup(e *execution) {
	if e.sc == nil {
		r.finishCleanup(e, "")
		return
	}
	r.killTree(e)
	deadline := time.Now().Add(r.cfg.KillWait)
	interval := 2 * time.Millisecond
	var poll func()
	poll = func() {
		e.reap = nil
		empty, err := e.sc.Empty()
		if err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Msg("check scope empty")
		}
		if empty {
			e.scopeEmpty = true
			r.maybeFinishCleanup(e)
			if e.state == api.StateCleaned || e.cleaning {
				return
			}
			// Scope empty but a pipe is still open: a process outside the
			// scope holds it. Give the pipes the rest of the deadline.
		}
		if time.Now().After(deadline) {
			r.forceCleanup(e, empty)
			return
		}
		interval = min(interval*2, 50*time.Millisecond)
		e.reap = r.loop.AfterFunc(interval, poll)
	}
	e.reap = r.loop.AfterFunc(0, poll)
}

// maybeFinishCleanup finishes once the scope is empty and both output pipes
// reached EOF.
func (r *Reactor) maybeFinishCleanup(e *execution) {
	if e.state != api.StateExited || e.cleaning || !e.scopeEmpty && e.sc != nil {
		return
	}
	for _, s := range e.streams {
		if s != nil && s.fd >= 0 {
			return
		}
	}
	r.stopTimer(&e.reap)
	r.finishCleanup(e, "")
}

// forceCleanup gives up waiting: processes survived SIGKILL or an escaped
// process holds a pipe. The record says so; the daemon does not wait forever.
func (r *Reactor) forceCleanup(e *execution, empty bool) {
	var why string
	if !empty {
		n := 0
		if st, err := e.sc.Stats(); err == nil && st.Tasks > 0 {
			n = int(st.Tasks)
		}
		e.rec.LeftoverTasks = n
		why = fmt.Sprintf("processes of the tree still alive %v after SIGKILL (uninterruptible sleep?)", r.cfg.KillWait)
	} else {
		why = "an output pipe was still held open by a process outside the scope; closed it"
	}
	r.log.Warn().Str("exec_id", e.id).Str("reason", why).Msg("cleanup forced")
	r.finishCleanup(e, why)
}

// finishCleanup closes e's fds on the loop, then removes the scope and the
// workspace off the loop, then posts toCleaned.
func (r *Reactor) finishCleanup(e *execution, leftover string) {
	if e.cleaning {
		return
	}
	e.cleaning = true
	for _, s := range e.streams {
		if s != nil {
			r.closeStream(e, s)
		}
	}
	if e.stdin != nil {
		r.closeStdin(e)
	}
	sc, work, id := e.sc, e.work, e.id
	go func() {
		// The scope reads empty once its processes have exited, which is
		// before they are reaped: the killed descendants that were
		// reparented to corrald (the subreaper) are zombies until their
		// SIGCHLD is handled. Reap them now, so that none outlives
		// cleaned.
		r.reaper.reapOrphans()
		var errs []error
		if sc != nil {
			if err := sc.Remove(); err != nil {
				errs = append(errs, fmt.Errorf("remove scope %s: %w", sc.Name(), err))
			}
		}
		if work != "" {
			if err := removeWorkspace(work); err != nil {
				errs = append(errs, fmt.Errorf("remove workspace: %w", err))
			}
		}
		err := errors.Join(errs...)
		r.post(func() {
			if err != nil {
				r.log.Warn().Err(err).Str("exec_id", id).Msg("cleanup")
				if leftover == "" {
					leftover = err.Error()
				}
			}
			r.toCleaned(e, leftover)
		})
	}()
}

// armSampler samples the tree's cgroup every SampleInterval to enforce
// cpu_ms and notice OOM kills while the main process still runs.
func (r *Reactor) armSampler(e *execution) {
	e.sampler = r.loop.AfterFunc(r.cfg.SampleInterval, func() {
		e.sampler = nil
		if e.state != api.StateRunning && e.state != api.StateCanceling {
			return
		}
		st := r.stats(e)
		mergeStats(&e.rec.Usage, st)
		switch {
		case st.OOMKills > 0 && e.params.MemoryBytes > 0:
			r.toCanceling(e, api.OutcomeMemoryLimit, true)
		case e.params.CPUMS > 0 && st.CPUUsageNS >= e.params.CPUMS*1e6:
			r.toCanceling(e, api.OutcomeCPULimit, true)
		}
		if !e.state.Finished() && e.pending == "" {
			r.armSampler(e)
		}
	})
}

// stats reads the scope's counters, falling back to /proc for the main
// process when the backend cannot measure CPU.
func (r *Reactor) stats(e *execution) scope.Stats {
	st := scope.Stats{CPUUsageNS: scope.Unknown, CPUUserNS: scope.Unknown, CPUSystemNS: scope.Unknown,
		MemoryPeak: scope.Unknown, TasksPeak: scope.Unknown, Tasks: scope.Unknown, OOMKills: scope.Unknown}
	if e.sc != nil {
		if s, err := e.sc.Stats(); err == nil {
			st = s
		}
	}
	if st.CPUUsageNS < 0 && e.proc != nil && !e.state.Finished() {
		if ns, ok := procCPUTime(e.proc.Pid); ok {
			st.CPUUsageNS = ns
		}
	}
	return st
}

func mergeStats(u *api.Usage, st scope.Stats) {
	if st.CPUUserNS >= 0 {
		u.CPUUserMS = max(u.CPUUserMS, st.CPUUserNS/1e6)
	}
	if st.CPUSystemNS >= 0 {
		u.CPUSystemMS = max(u.CPUSystemMS, st.CPUSystemNS/1e6)
	}
	if st.MemoryPeak >= 0 {
		u.PeakMemoryBytes = max(u.PeakMemoryBytes, st.MemoryPeak)
	}
	if st.TasksPeak >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.TasksPeak)
	}
	if st.Tasks >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.Tasks)
	}
}

func (r *Reactor) stopTimer(t **eventloop.Timer) {
	if *t != nil {
		r.loop.StopTimer(*t)
		*t = nil
	}
}

// audit starts the structured log line of a state change. Field names map
// to journal fields by upper-casing (EXEC_ID, EVENT, OWNER_UID, ...).
func (r *Reactor) audit(e *execution, event string) *zerolog.Event {
	ev := r.log.Info().Str("exec_id", e.id).Str("event", event).
		Uint32("owner_uid", e.owner.UID).Int32("owner_pid", e.owner.PID)
	if e.rec.Scope != "" {
		ev = ev.Str("scope", e.rec.Scope)
	}
	for k, v := range e.params.Labels {
		ev = ev.Str("label_"+k, v)
	}
	return ev
}

// rusageCPU is the CPU time in ms that the main process used, with the
// children it waited for.
func rusageCPU(ps *os.ProcessState) int64 {
	return (ps.UserTime() + ps.SystemTime()).Milliseconds()
}
