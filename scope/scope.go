// Package scope puts each child's whole process tree into its own kill-able
// group, so that a signal, a limit and a "wait until empty" reach every
// descendant, including ones that double-fork or call setsid.
//
// Backends, best first:
//   - systemd: a transient unit corral-<id>.scope per child, created over D-Bus
//     while the caller holds the child in the shim (PlaceHeld; scope/systemd.go).
//   - cgroup: one cgroup v2 directory per child under the daemon's own
//     subtree, entered atomically at clone time with CLONE_INTO_CGROUP.
//   - pgroup: a new session (and so process group) per child; descendants
//     that call setsid escape it. Last resort.
//
// Ownership: a Backend is safe for concurrent use. A Scope belongs to one
// execution; the reactor calls its methods from one goroutine at a time, but
// never from the loop goroutine for methods documented as blocking.
package scope

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// Limits are the per-execution resource limits a backend enforces where it
// can. Zero means no limit.
type Limits struct {
	MemoryBytes int64 // memory of the tree; swap is disabled with it
	TasksMax    int64 // processes+threads of the tree
	CPUMS       int64 // CPU time of the tree; enforced by the reactor by sampling Stats
}

// Spec describes the scope to create for one execution.
type Spec struct {
	ID     string   // execution id; names the scope
	Argv   []string // for descriptions and audit
	Limits Limits
	// Cmd is the command the reactor will start. Prepare may change its
	// SysProcAttr (Setsid, UseCgroupFD/CgroupFD). The reactor starts it
	// after Prepare returns, as the backend's Placement asks.
	Cmd *exec.Cmd
}

// Placement is how a backend puts a child into its scope, and so how the
// caller must start the child. The backend only places (Prepare, Started);
// whatever holds the child before it is placed belongs to the caller.
type Placement int

const (
	// PlaceAtClone: Prepare sets Cmd.SysProcAttr so that the kernel clones
	// the child straight into its scope (CLONE_INTO_CGROUP). Nothing needs
	// to hold the child.
	PlaceAtClone Placement = iota + 1
	// PlaceHeld: the child is placed only by Started, after it exists. It
	// must run nothing until then: the caller starts it held (shim.Config
	// Hold), calls Started, and releases it only when Started returned nil;
	// on an error it aborts the hold. (systemd: the unit is created around
	// the pid.)
	PlaceHeld
	// PlaceByGroup: Prepare makes the child a session leader; its scope is
	// its process group. Nothing needs to hold it; descendants that call
	// setsid escape.
	PlaceByGroup
)

func (p Placement) String() string {
	switch p {
	case PlaceAtClone:
		return "at clone"
	case PlaceHeld:
		return "held until started"
	case PlaceByGroup:
		return "by process group"
	}
	return fmt.Sprintf("Placement(%d)", int(p))
}

// Stats is what a backend can observe of a tree. A field a backend cannot
// measure is -1.
type Stats struct {
	CPUUsageNS  int64 // user+system CPU time of the whole tree
	CPUUserNS   int64
	CPUSystemNS int64
	MemoryPeak  int64 // bytes
	TasksPeak   int64 // highest number of tasks seen (or current where no peak is kept)
	Tasks       int64 // tasks now
	OOMKills    int64 // processes killed by the OOM killer in this scope
}

// Unknown is the value of a Stats field a backend cannot measure.
const Unknown = -1

// unknownStats is a reading with every field Unknown, the start of any
// backend's reading.
func unknownStats() Stats {
	return Stats{Unknown, Unknown, Unknown, Unknown, Unknown, Unknown, Unknown}
}

// Backend creates scopes.
type Backend interface {
	// Name is "systemd", "cgroup" or "pgroup", for records and logs. Code
	// that must act on what a backend can do asks Placement, never Name.
	Name() string
	// Placement says how the backend places a child, and so whether the
	// caller must hold it until Started.
	Placement() Placement
	// Prepare readies a scope for spec.ID before its child starts and
	// adjusts spec.Cmd so the child lands in it. Blocking: never call it on
	// the loop goroutine.
	Prepare(ctx context.Context, spec Spec) (Scope, error)
	// Close releases the backend's resources (D-Bus connection, ...).
	Close() error
}

// Scope is one execution's kill-able group.
type Scope interface {
	// Name is the unit name, cgroup path or "pgid:<n>" shown in records.
	Name() string
	// Started is called once the child was started with pid; the backend
	// finishes placing it (the systemd backend creates the unit holding pid)
	// and nothing else: releasing a held child is the caller's. Blocking.
	Started(ctx context.Context, pid int) error
	// Signal sends sig to every process in the scope. Blocking.
	Signal(sig unix.Signal) error
	// Kill sends SIGKILL to every process in the scope. It must work even
	// when the backend's control channel (D-Bus) is down. Blocking.
	Kill() error
	// Empty reports whether no process is left in the scope. Cheap: reads
	// kernel state only, so the loop goroutine may call it.
	Empty() (bool, error)
	// Stats reads the tree's resource usage. Cheap, like Empty.
	Stats() (Stats, error)
	// Remove deletes the scope once it is empty. Blocking. Idempotent.
	Remove() error
}

// Limiter is implemented by scopes whose limits can change after Started
// (systemd: SetUnitProperties; cgroup: memory.max, pids.max). The warm pool
// creates scopes before it knows the request, then applies its limits this
// way before the command runs. Blocking.
type Limiter interface {
	SetLimits(ctx context.Context, l Limits) error
}

// OOMSettler is implemented by scopes whose count of OOM kills can be
// undecided for a moment once the tree's cgroup is gone (systemd on a v1
// memory hierarchy: a lone OOM notification read after the cgroup's
// removal is the OOM's or the removal's until the next one comes or a
// short wait passes). Stats and Empty never wait for it; a caller that
// decides on the count (the reactor's outcome at the exit) waits for the
// channel off the loop goroutine and then reads Stats.
type OOMSettler interface {
	// OOMUndecided returns nil when Stats' OOMKills is decided (the
	// common case), else a channel that is closed once it is, within a
	// short wait. Cheap: no blocking call.
	OOMUndecided() <-chan struct{}
}

// ExitStatser is implemented by scopes that read their counters at the main
// process's exit more cheaply together with their emptiness: an empty
// scope has no task left to count. ExitStats returns what Stats would
// (Tasks 0 when empty) and whether the scope was empty when read; on an
// error reading emptiness, empty is false. Cheap, like Stats.
type ExitStatser interface {
	ExitStats() (st Stats, empty bool, err error)
}

// EmptyNotifier is implemented by scopes whose emptiness the kernel
// announces (a cgroup2 cgroup.events), so the caller can wait for it in its
// epoll set instead of polling Empty.
type EmptyNotifier interface {
	// WatchEmpty returns a descriptor that polls with EPOLLPRI once right
	// away and whenever the scope may have become empty; its Empty
	// re-arms it and answers as Scope.Empty does. The caller closes it.
	// Cheap: no blocking call, so the loop goroutine may use it.
	WatchEmpty() (EmptyWatch, error)
}

// EmptyWatch is the descriptor of EmptyNotifier.WatchEmpty.
type EmptyWatch interface {
	FD() int
	Empty() (bool, error)
	Close() error
}

// ErrUnsupported is returned by a backend that cannot run on this host.
var ErrUnsupported = errors.New("scope backend not supported on this host")
