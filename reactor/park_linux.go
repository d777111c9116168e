package reactor

// What lets an execution outlive a crash of corrald: its fds parked in the
// service manager's fd store, named "<exec-id>.<role>", and its kept output
// spooled to disk as it is read (adopt_spool_linux.go). Re-adoption itself
// is adopt_linux.go.

import (
	"os"
	"strings"

	"github.com/corral-dev/corral/api"
)

// FdStore parks fds with the service manager so that they outlive a crash
// of corrald (systemd's fd store). Names are "<exec-id>.<role>". Both
// methods are cheap (a datagram) and are called on the loop goroutine.
type FdStore interface {
	Store(name string, fd int) error
	Remove(name string) error
}

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
)

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
	sp, err := newSpool(spoolPath(r.cfg.StateDir, e.id, s.name), int64(s.kept.half))
	if err != nil {
		r.log.Warn().Err(err).Str("exec_id", e.id).Msg("spool output; a crash of corrald would lose what was read")
		return nil
	}
	if s.kept.total > 0 {
		sp.compact(s.kept)
	}
	return sp
}

// parkFds hands e's fds to the fd store as they exist now. Loop goroutine.
func (r *Reactor) parkFds(e *execution) {
	if r.cfg.FdStore == nil {
		return
	}
	if e.pidfd < 0 {
		// Without a pidfd nothing can be re-adopted: do not park the rest.
		return
	}
	park := func(role string, fd int) {
		if fd < 0 {
			return
		}
		if err := r.cfg.FdStore.Store(FdName(e.id, role), fd); err != nil {
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("role", role).Msg("fd store: park; the execution would not survive a crash of corrald")
			return
		}
		e.parked = append(e.parked, role)
	}
	park(RolePidfd, e.pidfd)
	for _, s := range e.streams {
		if s != nil && !s.tty {
			park(s.name, s.fd)
		}
	}
	if e.tty != nil {
		park(RolePTY, e.tty.fd)
	}
	if e.stdin != nil {
		park(RoleStdin, e.stdin.fd)
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
// (finishCleanup) leaves them parked until then. Loop goroutine.
func (r *Reactor) durableAs(e *execution, st api.State) {
	if e.exitDurable || (st != api.StateExited && st != api.StateCleaned) {
		return
	}
	e.exitDurable = true
	if e.cleaning {
		r.unparkFds(e, "")
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
