package reactor

// What the transitions set in motion to end a tree and clean up after it:
// signals, SIGKILL with a bounded wait, polling the scope empty, removing the
// scope and the workspace off the loop.

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/internal/transient"
	"github.com/corral-dev/corral/scope"
)

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
	r.killScope(e)
	if e.state.Finished() || e.killWait != nil {
		return
	}
	e.killWait = r.loop.AfterFunc(r.cfg.KillWait, func() {
		e.killWait = nil
		// The main process survived SIGKILL (uninterruptible sleep): report
		// it and move on. The pidfd stays watched so it is reaped later.
		r.toExited(e, exitResult{forced: fmt.Sprintf(
			"main process %d did not exit %v after SIGKILL (uninterruptible sleep?)", e.rec.PID, r.cfg.KillWait)})
	})
}

// Retrying a failed tree kill or scope removal during cleanup: after
// retryFirst, doubling up to retryMax. A kill or removal that fails for
// want of a resource (transient: out of fds, memory) is retried for as long
// as it fails, since the tree is not gone until it succeeds (tests/drill,
// emfile: at corrald's fd limit the cgroup.kill write failed, nothing
// retried it, and a "sleep 30" outlived its cleaned record in a cgroup no
// one removed); any other failure for --kill-wait, then the record says
// what is left.
const (
	retryFirst = 10 * time.Millisecond
	retryMax   = 500 * time.Millisecond
)

// retryDelay is the wait before the next attempt after fails failures in a
// row.
func retryDelay(fails int) time.Duration {
	d := retryFirst
	for i := 1; i < fails && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// killScope sends SIGKILL to every process of e's scope, off the loop (the
// backend may need to open files or talk D-Bus), and records on the loop
// whether it got through (scopeKilled). One at a time per execution.
func (r *Reactor) killScope(e *execution) {
	sc := e.sc
	if sc == nil || e.killing {
		return
	}
	e.killing = true
	go func() {
		err := sc.Kill()
		// ENODEV/ENOENT: the scope is already gone, nothing to kill.
		if errors.Is(err, unix.ENODEV) || errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		r.post(func() { r.scopeKilled(e, err) })
	}()
}

// scopeKilled records the end of a killScope: a kill that got through
// starts --kill-wait's count (killedAt); a failed one is logged with why
// and is retried by the cleanup poll (retryKill) while the scope is
// populated. Loop goroutine only.
func (r *Reactor) scopeKilled(e *execution, err error) {
	e.killing = false
	now := time.Now()
	if err == nil {
		e.killErr, e.killFails = nil, 0
		if e.killedAt.IsZero() {
			e.killedAt = now
		}
		return
	}
	e.killErr = err
	e.killFails++
	delay := retryDelay(e.killFails)
	e.killNext = now.Add(delay)
	if !transient.Is(err) && e.killedAt.IsZero() {
		// Retrying may not cure it: --kill-wait bounds the wait from here.
		e.killedAt = now
	}
	r.log.Warn().Err(err).Str("exec_id", e.id).Int("attempt", e.killFails).Bool("transient", transient.Is(err)).
		Dur("retry_in", delay).Msg("kill tree failed; retrying while its scope is populated")
}

// retryKill resends a tree kill that failed, once its backoff has passed,
// while cleanup waits for a populated scope. Loop goroutine only.
func (r *Reactor) retryKill(e *execution) {
	if e.killErr != nil && !e.killing && !time.Now().Before(e.killNext) {
		r.killScope(e)
	}
}

// startCleanup kills what is left of the tree and waits, bounded, until the
// scope is empty and the pipes are closed; then removes the scope and the
// workspace off the loop and moves to cleaned.
//
// The scope is looked at once right away, then polled after 1, 2, 4 ...
// 50 ms and, while it is populated and where the kernel announces its
// emptiness (scope.EmptyNotifier: cgroup.events), also watched in the
// loop's epoll set, as the pidfds are; the first to see it empty wins.
// Both, because the kernel delays a cgroup.events notification to 10 ms
// after the previous one (cgroup_file_notify's rate limit): a short-lived
// scope, whose "populated 1" was just announced, is seen empty sooner by
// the poll (measured: a background child killed at cleanup, exited ->
// cleaned 7.5 ms p50 polled from 2 ms, 14.9 ms watched alone), while a tree
// that takes long to die is seen at once by the watch instead of at the
// next, up to 50 ms, tick.
//
// While the scope is populated, each tick also resends a tree kill that
// failed (retryKill, with its own backoff), and --kill-wait counts from the
// kill that got through (cleanupOverdue): a tree that was never killed is
// not given up on as "survived SIGKILL".
//
// empty says the scope was read empty already, at the exit (exitStats): it
// is not read again.
func (r *Reactor) startCleanup(e *execution, empty bool) {
	if e.sc == nil {
		r.finishCleanup(e, "")
		return
	}
	// Most trees are gone with their main process: look once right away,
	// and kill and watch only a scope that is still populated. An empty
	// scope has nothing to kill (no process of it is left to fork), so it
	// is spared the kill's goroutine and cgroup.kill write.
	if !empty {
		var err error
		if empty, err = e.sc.Empty(); err != nil {
			empty = false
		}
	}
	if empty {
		r.scopeEmptied(e)
		if e.cleaning {
			return
		}
	} else {
		r.killTree(e)
		r.watchEmpty(e)
	}
	began := time.Now()
	interval := time.Millisecond
	emptyErrs := 0
	var poll func()
	poll = func() {
		e.reap = nil
		empty := e.scopeEmpty
		var err error
		if !empty {
			if empty, err = e.sc.Empty(); err != nil {
				// Once per cleanup at Warn: at the fd limit every tick
				// fails alike.
				ev := r.log.Debug()
				if emptyErrs++; emptyErrs == 1 {
					ev = r.log.Warn()
				}
				ev.Err(err).Str("exec_id", e.id).Int("failures", emptyErrs).Msg("check scope empty")
			}
		}
		if empty {
			r.scopeEmptied(e)
			if e.state == api.StateCleaned || e.cleaning {
				return
			}
			// Scope empty but a pipe is still open: a process outside the
			// scope holds it. Give the pipes the rest of the deadline.
		} else {
			r.retryKill(e)
		}
		if r.cleanupOverdue(e, began, empty, err) {
			r.forceCleanup(e, empty)
			return
		}
		e.reap = r.loop.AfterFunc(interval, poll)
		interval = min(interval*2, 50*time.Millisecond)
	}
	e.reap = r.loop.AfterFunc(interval, poll)
	interval *= 2
}

// cleanupOverdue reports whether cleanup has waited --kill-wait and gives
// up: counted from began (the start of cleanup) for an empty scope whose
// pipe is held open, and for a populated one from the later of began and
// the kill that reached the tree (or failed in a way retrying does not
// cure). It never gives up on a tree no kill has reached yet, nor while
// the scope cannot be read for want of a resource (emptyErr transient):
// the tree may well be alive, and cleaned would then be a lie.
func (r *Reactor) cleanupOverdue(e *execution, began time.Time, empty bool, emptyErr error) bool {
	if empty {
		return time.Since(began) > r.cfg.KillWait
	}
	if e.killedAt.IsZero() || transient.Is(emptyErr) {
		return false
	}
	from := began
	if e.killedAt.After(from) {
		from = e.killedAt
	}
	return time.Since(from) > r.cfg.KillWait
}

// scopeEmptied records that e's scope was seen empty and finishes the
// cleanup if the pipes are closed too.
func (r *Reactor) scopeEmptied(e *execution) {
	r.unwatchEmpty(e)
	e.scopeEmpty = true
	r.maybeFinishCleanup(e)
}

// watchEmpty puts e's scope's cgroup.events in the epoll set, where the
// scope can tell its emptiness (see startCleanup). Without it the poll
// alone decides.
func (r *Reactor) watchEmpty(e *execution) {
	n, ok := e.sc.(scope.EmptyNotifier)
	if !ok {
		return
	}
	w, err := n.WatchEmpty()
	if err != nil {
		r.log.Debug().Err(err).Str("exec_id", e.id).Msg("watch scope empty; polling only")
		return
	}
	if err := r.loop.Add(w.FD(), eventloop.Priority|eventloop.Error, func(eventloop.Events) {
		empty, err := w.Empty()
		if err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Msg("check scope empty")
		}
		if empty && e.state == api.StateExited && !e.cleaning {
			r.scopeEmptied(e)
		}
	}); err != nil {
		w.Close()
		r.log.Debug().Err(err).Str("exec_id", e.id).Msg("watch scope empty; polling only")
		return
	}
	e.emptyWatch = w
}

// unwatchEmpty takes e's cgroup.events out of the epoll set and closes it.
func (r *Reactor) unwatchEmpty(e *execution) {
	if e.emptyWatch == nil {
		return
	}
	if err := r.loop.Remove(e.emptyWatch.FD()); err != nil {
		r.log.Warn().Err(err).Str("exec_id", e.id).Msg("unwatch scope empty")
	}
	e.emptyWatch.Close()
	e.emptyWatch = nil
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
		e.survivors = true
		if e.killErr != nil {
			why = fmt.Sprintf("processes of the tree still alive %v after killing it failed: %v", r.cfg.KillWait, e.killErr)
		} else {
			why = fmt.Sprintf("processes of the tree still alive %v after SIGKILL (uninterruptible sleep?)", r.cfg.KillWait)
		}
	} else {
		why = "an output pipe was still held open by a process outside the scope; closed it"
	}
	r.log.Warn().Str("exec_id", e.id).Str("reason", why).Msg("cleanup forced")
	r.finishCleanup(e, why)
}

// finishCleanup closes e's fds on the loop, then removes the scope and the
// workspace off the loop (removeScope), then moves to cleaned.
func (r *Reactor) finishCleanup(e *execution, leftover string) {
	if e.cleaning {
		return
	}
	e.cleaning = true
	r.unwatchEmpty(e)
	for _, s := range e.streams {
		if s != nil {
			r.closeStream(e, s)
		}
	}
	if e.stdin != nil {
		r.closeStdin(e)
	}
	if e.exitDurable {
		r.unparkFds(e, "")
	} // else once it is (durableAs)
	r.removeScope(e, leftover)
}

// removeScope removes e's scope and workspace off the loop and posts the
// result to scopeRemoved. Idempotent, so a failed removal can run again.
func (r *Reactor) removeScope(e *execution, leftover string) {
	sc, work := e.sc, e.work
	go func() {
		// The scope reads empty once its processes have exited, which is
		// before they are reaped: the killed descendants that were
		// reparented to corrald (the subreaper) are zombies until their
		// SIGCHLD is handled. Reap them now, so that none outlives
		// cleaned.
		r.reaper.reapOrphans()
		var serr, werr error
		if sc != nil {
			if err := sc.Remove(); err != nil {
				serr = fmt.Errorf("remove scope %s: %w", sc.Name(), err)
			}
		}
		release := func() {}
		if work != "" {
			var err error
			if release, err = removeWorkspaceHeld(work); err != nil {
				werr = fmt.Errorf("remove workspace: %w", err)
			}
		}
		r.post(func() { r.scopeRemoved(e, leftover, serr, werr, release) })
	}()
}

// scopeRemoved moves e to cleaned once its scope and workspace are
// removed. A failed removal is logged with why and retried after a backoff
// on the loop's timer (a scope found busy is killed again first): for as
// long as it fails for want of a resource, else for --kill-wait; then the
// record says what is left. A scope whose processes survived SIGKILL
// (forceCleanup) cannot be removed and is not retried. Loop goroutine only.
//
// release frees the removed workspace's inode (removeWorkspaceHeld): once
// cleaned is durable and told (toCleaned), or at once before a retry.
func (r *Reactor) scopeRemoved(e *execution, leftover string, serr, werr error, release func()) {
	err := errors.Join(serr, werr)
	if err == nil {
		// The workspace is gone; the file system frees its inode once
		// the cleaned record is durable and told (toCleaned), off the
		// answer's path (see removeWorkspaceHeld).
		e.releaseWork = release
		r.toCleaned(e, leftover)
		return
	}
	now := time.Now()
	if e.removeFails++; e.removeFails == 1 {
		e.removeFailedAt = now
	}
	r.flushExit(e) // a cleanup that retries is no quick one (hold.go)
	if !e.survivors && (transient.Is(err) || now.Sub(e.removeFailedAt) < r.cfg.KillWait) {
		delay := retryDelay(e.removeFails)
		r.log.Warn().Err(err).Str("exec_id", e.id).Int("attempt", e.removeFails).Bool("transient", transient.Is(err)).
			Dur("retry_in", delay).Msg("cleanup: removal failed; retrying")
		if errors.Is(serr, unix.EBUSY) {
			r.killScope(e) // still populated after all
		}
		go release()
		r.stopTimer(&e.reap)
		e.reap = r.loop.AfterFunc(delay, func() {
			e.reap = nil
			r.removeScope(e, leftover)
		})
		return
	}
	r.log.Warn().Err(err).Str("exec_id", e.id).Int("attempts", e.removeFails).Msg("cleanup")
	if leftover == "" {
		leftover = err.Error()
	}
	e.releaseWork = release
	r.toCleaned(e, leftover)
}
