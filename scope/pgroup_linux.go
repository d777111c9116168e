package scope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// NewPgroup returns the last-resort backend: each child starts a new session
// (setsid), so it leads a new process group whose id is its pid, and the
// group is signalled with kill(-pgid, sig).
//
// Limits: it enforces none of Limits and measures nothing (every Stats field
// is Unknown), so the reactor cannot enforce CPUMS either; Unenforced reports
// all asked limits.
//
// Escapes: a descendant that calls setsid(2) or setpgid(2) leaves the group
// and is then neither signalled nor waited for; a daemonizing tool (double
// fork + setsid) escapes this backend. Use the cgroup or systemd backend
// where that matters.
//
// Reaping: the group stays non-Empty while any member is a zombie. Orphaned
// descendants are reparented to PID 1 (or the nearest child subreaper), which
// must reap them before Empty reports true.
func NewPgroup() Backend { return pgroupBackend{} }

// pgroupBackend is stateless, so it is safe for concurrent use.
type pgroupBackend struct{}

var _ Backend = pgroupBackend{}

func (pgroupBackend) Name() string { return "pgroup" }

// Placement is PlaceByGroup: Prepare sets Setsid.
func (pgroupBackend) Placement() Placement { return PlaceByGroup }

func (pgroupBackend) Close() error { return nil }

// Prepare sets spec.Cmd.SysProcAttr.Setsid. It does not block.
func (pgroupBackend) Prepare(_ context.Context, spec Spec) (Scope, error) {
	if spec.Cmd == nil {
		return nil, fmt.Errorf("prepare pgroup scope %s: no command", spec.ID)
	}
	pgSetsid(spec.Cmd.SysProcAttr, spec)
	return &pgroupScope{asked: spec.Limits}, nil
}

// pgSetsid makes the child a session (and so process group) leader, keeping
// the other SysProcAttr fields. Setpgid is cleared: after setsid the child
// already leads its own group, and setpgid would then fail with EPERM.
func pgSetsid(attr *syscall.SysProcAttr, spec Spec) {
	if attr == nil {
		attr = &syscall.SysProcAttr{}
		spec.Cmd.SysProcAttr = attr
	}
	attr.Setsid = true
	attr.Setpgid = false
	attr.Pgid = 0
}

// pgroupScope is one child's process group. Before Started there is no
// process: Signal and Kill do nothing and Empty reports true. Its methods may
// be called from any goroutine.
type pgroupScope struct {
	pgid  atomic.Int64 // 0 until Started
	asked Limits
}

var _ Scope = (*pgroupScope)(nil)

func (s *pgroupScope) Name() string {
	pgid := s.pgid.Load()
	if pgid == 0 {
		return "pgid:?"
	}
	return "pgid:" + strconv.FormatInt(pgid, 10)
}

// Started records pid as the group id (the child called setsid, so its pgid
// is its pid).
func (s *pgroupScope) Started(_ context.Context, pid int) error {
	if pid <= 0 {
		return fmt.Errorf("start pgroup scope: bad pid %d", pid)
	}
	if !s.pgid.CompareAndSwap(0, int64(pid)) {
		return fmt.Errorf("start pgroup scope pgid:%d: already started", s.pgid.Load())
	}
	return nil
}

// Signal sends sig to every process still in the group. A group with no
// process left is not an error.
func (s *pgroupScope) Signal(sig unix.Signal) error {
	pgid := s.pgid.Load()
	if pgid == 0 {
		return nil
	}
	// pgid > 0 always here: kill(0, sig) would signal the daemon's own group.
	if err := unix.Kill(-int(pgid), sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %s to pgid:%d: %w", unix.SignalName(sig), pgid, os.NewSyscallError("kill", err))
	}
	return nil
}

func (s *pgroupScope) Kill() error { return s.Signal(unix.SIGKILL) }

// Empty reports whether no process (zombies included) is left in the group.
func (s *pgroupScope) Empty() (bool, error) {
	pgid := s.pgid.Load()
	if pgid == 0 {
		return true, nil
	}
	err := unix.Kill(-int(pgid), 0)
	switch {
	case err == nil, errors.Is(err, unix.EPERM):
		// EPERM: a member exists that we may not signal.
		return false, nil
	case errors.Is(err, unix.ESRCH):
		return true, nil
	}
	return false, fmt.Errorf("probe pgid:%d: %w", pgid, os.NewSyscallError("kill", err))
}

// Stats measures nothing: counting a group's members or CPU would need a scan
// of all of /proc.
func (s *pgroupScope) Stats() (Stats, error) {
	return unknownStats(), nil
}

// Remove has nothing to delete.
func (s *pgroupScope) Remove() error { return nil }

// Unenforced reports every asked limit: this backend enforces none and
// cannot measure CPU.
func (s *pgroupScope) Unenforced() Limits { return s.asked }
