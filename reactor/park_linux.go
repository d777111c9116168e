package reactor

// What lets an execution outlive a crash of corrald: its fds parked in the
// service manager's fd store, named "<exec-id>.<role>", and its kept output
// spooled to disk as it is read (adopt_spool_linux.go). Re-adoption itself
// is adopt_linux.go.

import (
	"os"
	"strings"
	"time"

	"github.com/corral-dev/corral/api"
)

// FdStore parks fds with the service manager so that they outlive a crash
// of corrald (systemd's fd store). Names are "<exec-id>.<role>". Both
// methods are cheap (a datagram) and safe from any goroutine: spawn parks
// a new child's fds off the loop (parkSpawned), the loop removes them.
// For one name, a Store happens before its Remove: the loop sees a
// child's parked roles only in what spawn posts after parking them.
//
// A Store or Remove that returned nil may still wait in the process (the
// service manager slow to read its messages, under load): a crash would
// lose it. Sync waits up to d until everything stored or removed so far
// has reached the service manager, and reports whether it did; it returns
// at once when nothing waits. Spawn calls it (never the loop) before it
// lets a command run on the strength of what it parked, and before it
// kills a child whose parked fds it took back.
type FdStore interface {
	Store(name string, fd int) error
	Remove(name string) error
	Sync(d time.Duration) bool
}

// parkSyncWait bounds how long spawn waits for what it parked (or took
// back) to reach the service manager (FdStore.Sync).
const parkSyncWait = time.Second

// Fd roles of an execution. Others may be added; an adopted execution's
// fds are looked up by these names.
const (
	RolePidfd  = "pidfd"
	RoleStdout = "stdout"
	RoleStderr = "stderr"
	RoleStdin  = "stdin"
	// RolePTY is the master of a terminal execution (tty: true): its
	// stdout stream reads it and exec.write types into it; such an
	// execution has no stdout, stderr or stdin pipe.
	RolePTY = "pty"
	// RoleExec is the read end of a pooled shim's exec-error pipe, parked
	// with the pipes and before the pidfd while its dispatch is under way
	// (from before the dispatch is sent until the shim's answer): a
	// restart after a crash meanwhile reads there what the shim did: EOF
	// without a report, it exec'd the command (taken over as started); a
	// report, nothing ran (no command came, shim.OpParentGone, or its exec
	// failed): start_failed. Removed once the dispatch is answered.
	RoleExec = "exec"
)

// StartFailedRestart is the error of an execution whose record was still
// started when corrald died, with no fd parked and no process in its
// scope: the command was never let run (a held shim aborts when corrald
// dies), so it ends start_failed, not lost.
const StartFailedRestart = "corrald restarted before the command was started; nothing ran"

// FdName is the name under which role's fd of execution id is parked in
// the fd store and passed across a handover: "<id>.<role>".
func FdName(id, role string) string { return id + "." + role }

// SplitFdName splits a passed fd's name into execution id and role (the
// text after the last dot); ok is false for a name without both. A name
// that is not an execution's ("corrald.socket") splits too: callers check
// the role.
func SplitFdName(name string) (id, role string, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 || i == len(name)-1 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

// spooling reports whether output is spooled as it is read: when a crash
// can be survived at all (an fd store) and there is a state directory.
func (r *Reactor) spooling() bool { return r.cfg.FdStore != nil && r.cfg.StateDir != "" }

// openSpool starts the spool of s. Loop goroutine only.
func (r *Reactor) openSpool(e *execution, s *stream) *spool {
	var err error
	if s.kept.total > 0 || s.kept.lost {
		// What is kept already (an adopted execution's) goes in whole, in
		// place of the file there may be: never a moment with less.
		if err = r.spoolKept(e, s); err == nil {
			return s.spool
		}
	} else {
		var sp *spool
		if sp, err = newSpool(spoolPath(r.cfg.StateDir, e.id, s.name), int64(s.kept.half)); err == nil {
			return sp
		}
	}
	r.log.Warn().Err(err).Str("exec_id", e.id).Msg("spool output; a crash of corrald would lose what was read")
	s.respoolAt = time.Now().Add(respoolEvery) // keep tries again (respool)
	return nil
}

// parkSpawned hands a just-started child's fds to the fd store, on
// spawn's goroutine, the moment the command was let run: a crash of
// corrald between that and the loop's adopt (under load, most of a
// second) then still finds the execution, its record still started, and
// re-adoption takes it over (readopt). The roles parked go in sp.parked
// for the loop, which owns them from adopt on.
//
// execFd is a pooled shim's exec-error pipe (RoleExec), parked before the
// dispatch, or -1. It reports whether the pidfd, and so everything before
// it, was parked.
func (r *Reactor) parkSpawned(e *execution, sp *spawned, execFd int) bool {
	if r.cfg.FdStore == nil || sp.pidfd < 0 {
		// Without a pidfd nothing can be re-adopted: do not park the rest.
		return false
	}
	park := func(role string, fd int) bool {
		if fd < 0 {
			return true
		}
		if err := r.cfg.FdStore.Store(FdName(e.id, role), fd); err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("role", role).Msg("fd store: park; the execution would not survive a crash of corrald")
			return false
		}
		sp.parked = append(sp.parked, role)
		return true
	}
	// The pidfd goes last, and only after every pipe: a restart adopts an
	// execution whose pidfd came back (survival.plan), and the fd store
	// takes the messages in the order they were sent, so a crash between
	// two of them must not leave the pidfd stored without a pipe. An
	// execution re-adopted without its stdout read end would lose its
	// output, and its command die of SIGPIPE (ending "signaled").
	var ok bool
	if sp.tty >= 0 {
		ok = park(RolePTY, sp.tty)
	} else {
		ok = park(RoleStdout, sp.stdout) && park(RoleStderr, sp.stderr)
	}
	return ok && park(RoleStdin, sp.stdin) && park(RoleExec, execFd) && park(RolePidfd, sp.pidfd)
}

// parkBeforeLaunch parks a child's fds (parkSpawned) before the command is
// let run (a held shim's release, a pooled one's dispatch), and reports
// whether they reached the service manager: parked, pidfd last, and not
// left waiting in the process's queue, where a crash would lose them. When
// it reports false the command must not be let run (the caller takes back
// what was parked, unparkBeforeKill). Spawn's goroutine.
func (r *Reactor) parkBeforeLaunch(e *execution, sp *spawned, execFd int) bool {
	if !r.parkSpawned(e, sp, execFd) {
		return false
	}
	if !r.cfg.FdStore.Sync(parkSyncWait) {
		r.log.Warn().Str("exec_id", e.id).Dur("waited", parkSyncWait).Msg("fd store: the parked fds did not reach the service manager; not letting the command run from here")
		return false
	}
	return true
}

// unparkBeforeKill takes back what spawn parked for a child that will be
// killed without running the command (a held shim not released, a pooled
// one discarded, a failed exec), and waits (bounded) for the removes to
// reach the service manager. It must come before the kill: a crash between
// the kill and the removes would leave a restart reading EOF on the
// exec-error pipe of a shim that died without a report, taking the command
// for run. Spawn's goroutine.
func (r *Reactor) unparkBeforeKill(e *execution, sp *spawned) {
	if len(sp.parked) == 0 {
		return
	}
	r.unparkSpawned(e, sp)
	if !r.cfg.FdStore.Sync(parkSyncWait) {
		r.log.Warn().Str("exec_id", e.id).Dur("waited", parkSyncWait).Msg("fd store: removes did not reach the service manager; killing the unstarted child anyway")
	}
}

// unparkRole takes role out of the fd store and of what spawn parked. A
// role whose Remove failed stays in sp.parked, so that the loop's cleanup
// (unparkFds) tries again. Spawn's goroutine, or the loop before it
// adopts sp (awaitExec).
func (r *Reactor) unparkRole(e *execution, sp *spawned, role string) {
	keep := sp.parked[:0]
	for _, ro := range sp.parked {
		if ro != role {
			keep = append(keep, ro)
			continue
		}
		if err := r.cfg.FdStore.Remove(FdName(e.id, ro)); err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("role", ro).Msg("fd store: remove; cleanup tries again")
			keep = append(keep, ro)
		}
	}
	sp.parked = keep
}

// unparkSpawned takes out of the fd store what parkSpawned put there, for
// a start that is undone (the command did not exec), in the reverse order,
// the pidfd first: a crash part-way then leaves what a crash part-way
// through the parking would (no pidfd: not adopted; the exec-error pipe,
// if still there, tells whether anything ran), never a pidfd without the
// exec-error pipe, which a restart would take over as a command let run.
// Spawn's goroutine.
func (r *Reactor) unparkSpawned(e *execution, sp *spawned) {
	for i := len(sp.parked) - 1; i >= 0; i-- {
		role := sp.parked[i]
		if err := r.cfg.FdStore.Remove(FdName(e.id, role)); err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("role", role).Msg("fd store: remove")
		}
	}
	sp.parked = nil
}

// keepParked, once adopt took a child up (e.parked is what spawn parked),
// removes the roles whose fd the loop could not keep (a pipe or the pidfd
// it failed to watch, and closed): a stored copy would hold the pipe open,
// and without a watched pidfd nothing can be re-adopted. Loop goroutine.
func (r *Reactor) keepParked(e *execution) {
	if len(e.parked) == 0 {
		return
	}
	if e.pidfd < 0 {
		r.unparkFds(e, "")
		return
	}
	for _, s := range e.streams {
		if s != nil && !s.tty && s.fd < 0 {
			r.unparkFds(e, s.name)
		}
	}
}

// unparkFds removes role's fd of e from the fd store (all of e's parked
// roles when role is ""). Only what is parked is removed, each once: every
// removal is a message to systemd, on the loop. Loop goroutine.
func (r *Reactor) unparkFds(e *execution, role string) {
	if r.cfg.FdStore == nil {
		return
	}
	keep := e.parked[:0]
	for _, ro := range e.parked {
		if role != "" && ro != role {
			keep = append(keep, ro)
			continue
		}
		if err := r.cfg.FdStore.Remove(FdName(e.id, ro)); err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("role", ro).Msg("fd store: remove")
		}
	}
	e.parked = keep
}

// durableAs is told that e's record in state st is durable. Once one with
// the outcome is (exited or cleaned), a crash of corrald no longer needs
// e's fds: the restarted corrald finishes e from its record. Before, it
// needs them: with the record still running and the fds gone from the
// store, e would be lost ("its fds were not in the fd store") though its
// pidfd could tell its exit. So a cleanup that closed them before
// (finishCleanup) leaves them parked until then. Once the cleaned record
// is durable, the store holds the kept output: the spools go, whichever
// write (toCleaned's, or retryDirty's after it failed) got it there.
// Loop goroutine.
func (r *Reactor) durableAs(e *execution, st api.State) {
	if !e.exitDurable && (st == api.StateExited || st == api.StateCleaned) {
		e.exitDurable = true
		if e.cleaning {
			r.unparkFds(e, "")
		}
	}
	if st == api.StateCleaned {
		r.dropSpools(e)
	}
}

// startSpools opens the spools of a new execution's streams. Loop.
func (r *Reactor) startSpools(e *execution) {
	if !r.spooling() {
		return
	}
	for _, s := range e.streams {
		if s != nil && s.fd >= 0 {
			s.spool = r.openSpool(e, s)
		}
	}
}

// dropSpools closes and deletes e's spool files once its final record
// (with the kept output) is durable. Loop goroutine.
func (r *Reactor) dropSpools(e *execution) {
	if r.cfg.StateDir == "" {
		return
	}
	for _, s := range e.streams {
		if s != nil {
			s.spool.close()
		}
	}
	for _, name := range []string{RoleStdout, RoleStderr} {
		_ = os.Remove(spoolPath(r.cfg.StateDir, e.id, name))
	}
}
