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
			"main process %d did not exit %v after SIGKILL (uninterruptible sleep?)", e.rec.PID, r.cfg.KillWait)})
	})
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
func (r *Reactor) startCleanup(e *execution) {
	if e.sc == nil {
		r.finishCleanup(e, "")
		return
	}
	r.killTree(e)
	// Most trees are gone with their main process: look once right away,
	// and watch only a scope that is still populated.
	if empty, err := e.sc.Empty(); err == nil && empty {
		r.scopeEmptied(e)
		if e.cleaning {
			return
		}
	} else {
		r.watchEmpty(e)
	}
	deadline := time.Now().Add(r.cfg.KillWait)
	interval := time.Millisecond
	var poll func()
	poll = func() {
		e.reap = nil
		empty := e.scopeEmpty
		if !empty {
			var err error
			if empty, err = e.sc.Empty(); err != nil {
				r.log.Warn().Err(err).Str("exec_id", e.id).Msg("check scope empty")
			}
		}
		if empty {
			r.scopeEmptied(e)
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
		e.reap = r.loop.AfterFunc(interval, poll)
		interval = min(interval*2, 50*time.Millisecond)
	}
	e.reap = r.loop.AfterFunc(interval, poll)
	interval *= 2
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
	r.unwatchEmpty(e)
	for _, s := range e.streams {
		if s != nil {
			r.closeStream(e, s)
		}
	}
	if e.stdin != nil {
		r.closeStdin(e)
	}
	r.unparkFds(e, "")
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
		release := func() {}
		if work != "" {
			var err error
			if release, err = removeWorkspaceHeld(work); err != nil {
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
			// The workspace is gone; the file system frees its inode
			// once the cleaned record is durable and told (toCleaned),
			// off the answer's path (see removeWorkspaceHeld).
			e.releaseWork = release
			r.toCleaned(e, leftover)
		})
	}()
}
