package reactor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
)

// placed is a child started and placed in its scope.
type placed struct {
	proc  *os.Process
	pidfd int // dup'd pidfd, or -1 without pidfds
	sc    scope.Scope
	// launched is when the child was let run: just before the fork, or
	// before the release of a held one. A command's started_at.
	launched time.Time
}

// startPlaced is the sequence every child goes through, a command's (spawn)
// or a pooled shim's (pool.create): Prepare its scope, fork it through the
// reaper, take its pidfd, place it (Scope.Started), release its hold.
//
// sh is the shim cmd was wrapped with, or nil. The reactor owns the hold:
// when the backend places after start (scope.PlaceHeld) sh must hold the
// child, and it is released here only once Started returned nil; on an
// error it is aborted, so the child runs nothing. The caller still owns sh
// (Close) and waits for the exec itself (WaitExec or Dispatch).
//
// On an error nothing of the child is left: it is killed and reaped and its
// scope removed. The caller closes its own ends of the child's stdio either
// way. Blocking (D-Bus under systemd, fork): never on the loop goroutine.
//
// release, when set, hooks a held shim's release (see releaseHooks); it
// does nothing for a child that is not held.
func (r *Reactor) startPlaced(ctx context.Context, spec scope.Spec, sh *shim.Handle, release *releaseHooks) (placed, error) {
	pl := placed{pidfd: -1}
	cmd := spec.Cmd
	if r.cfg.Backend.Placement() == scope.PlaceHeld && (sh == nil || !sh.Held()) {
		// A bug, not a runtime condition: the child would run before its
		// scope holds it.
		return pl, fmt.Errorf("start %s: backend %s places after start, but the child is not held", spec.ID, r.cfg.Backend.Name())
	}
	sc, err := r.cfg.Backend.Prepare(ctx, spec)
	if err != nil {
		if sh != nil {
			sh.Abort()
		}
		return pl, fmt.Errorf("create scope for %s: %w", spec.ID, err)
	}
	held := sh != nil && sh.Held()
	err = r.reaper.fork(func() (int, error) {
		if !held {
			pl.launched = time.Now()
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if sh != nil {
		// cmd.Start has run: the parent's copies of the shim's ends must
		// go, or the exec-error pipe never reaches EOF.
		sh.CloseChildEnds()
	}
	if err != nil {
		if rerr := sc.Remove(); rerr != nil {
			r.log.Warn().Err(rerr).Str("exec_id", spec.ID).Msg("remove scope after failed start")
		}
		return pl, fmt.Errorf("exec %q: %w", spec.Argv[0], err)
	}
	pl.proc, pl.sc = cmd.Process, sc
	hooked := false // release.before ran
	if !r.cfg.NoPidfd {
		pl.pidfd = dupPidfd(cmd.Process)
	}
	err = sc.Started(ctx, cmd.Process.Pid)
	if err != nil {
		err = fmt.Errorf("place in scope: %w", err)
	} else if sh != nil {
		// Placed: the child may go on. A no-op for a shim that was not
		// held, and for a pooled one (it waits for Dispatch).
		if held && release != nil {
			hooked = true
			err = release.before(&pl)
		}
		if err == nil {
			if held {
				pl.launched = time.Now()
			}
			if rerr := sh.Release(); rerr != nil {
				err = fmt.Errorf("release shim: %w", rerr)
			}
		}
	}
	if err != nil {
		// The child never left the hold (or never reached its scope).
		if hooked {
			release.undo() // before the child is aborted and killed
		}
		if sh != nil {
			sh.Abort()
		}
		r.unstart(&pl, spec.ID)
		return pl, err
	}
	return pl, nil
}

// releaseHooks hook a held shim's release (startPlaced). before runs once
// the shim is in its scope, right before its release, with the placed
// child (its process and pidfd); an error from it aborts the start: the
// shim is not released. undo runs when the start fails after before ran
// (before refused, or the release failed), before the child is aborted
// and killed.
type releaseHooks struct {
	before func(*placed) error
	undo   func()
}

// unstart ends a child that was started but will not run its command (it
// could not be placed, failed to exec, or a pooled shim is discarded): it
// kills and reaps the child, closes its pidfd and removes its scope.
func (r *Reactor) unstart(pl *placed, id string) {
	if pl.proc != nil {
		if err := pl.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			r.log.Debug().Err(err).Str("exec_id", id).Msg("kill unstarted child")
		}
		_, _ = pl.proc.Wait()
		r.reaper.reaped(pl.proc.Pid)
		pl.proc = nil
	}
	if pl.pidfd >= 0 {
		unix.Close(pl.pidfd)
		pl.pidfd = -1
	}
	if pl.sc != nil {
		// The child is reaped, so its scope empties at once; bound the wait
		// all the same rather than fail Remove on a busy cgroup.
		for i := 0; i < 100; i++ {
			if empty, _ := pl.sc.Empty(); empty {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := pl.sc.Remove(); err != nil {
			r.log.Warn().Err(err).Str("exec_id", id).Str("scope", pl.sc.Name()).Msg("remove scope after a failed start")
		}
		pl.sc = nil
	}
}

// dupPidfd returns a CLOEXEC duplicate of p's pidfd, or -1 when the process
// has none (os.ErrNoHandle: old kernel, seccomp): the caller then falls back
// to a waiter goroutine.
func dupPidfd(p *os.Process) int {
	fd := -1
	err := p.WithHandle(func(h uintptr) {
		// Dup inside the callback: the handle is only valid here.
		if d, err := unix.FcntlInt(h, unix.F_DUPFD_CLOEXEC, 0); err == nil {
			fd = d
		}
	})
	if err != nil {
		return -1
	}
	return fd
}
