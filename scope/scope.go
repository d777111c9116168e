// Package scope puts each child's whole process tree into its own kill-able
// group, so that a signal, a limit and a "wait until empty" reach every
// descendant, including ones that double-fork or call setsid.
//
// Backends, best first:
//   - systemd: a transient unit corral-<id>.scope per child, created over D-Bus
//     while the child is held in the shim (scope/systemd.go).
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
	"os/exec"

	"github.com/corral-dev/corral/shim"
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
	// SysProcAttr (Setsid, UseCgroupFD/CgroupFD) or wrap it in the shim. The
	// reactor starts it after Prepare returns.
	Cmd *exec.Cmd
	// Shim, when not nil, is the shim the reactor already wrapped Cmd with
	// (shim.Wrap with Hold: true), so that it could pass user, network and
	// rlimit settings. A backend that must hold the child until it is placed
	// (systemd) uses it and releases it in Started; when Shim is nil such a
	// backend wraps Cmd itself. Backends that need no hold ignore it, so the
	// reactor calls Shim.Release (idempotent) after Started returns nil. The
	// reactor keeps ownership: it closes the Handle.
	Shim *shim.Handle
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
	// Name is "systemd", "cgroup" or "pgroup".
	Name() string
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
	// finishes placing it (the systemd backend creates the unit holding pid,
	// then releases the shim). Blocking.
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

// ErrUnsupported is returned by a backend that cannot run on this host.
var ErrUnsupported = errors.New("scope backend not supported on this host")
