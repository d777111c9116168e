package scope

import (
	"context"

	"github.com/rs/zerolog"
)

// CgroupOptions configure the cgroup v2 backend. NewCgroup reads them once;
// the caller keeps ownership.
type CgroupOptions struct {
	// Base is the cgroup directory, an absolute path on a cgroup2 mount,
	// under which the backend makes one child cgroup per execution. It is
	// created if missing. Empty means "<mount><own cgroup>/corral", where
	// <own cgroup> is the daemon's cgroup from the "0::" line of
	// /proc/self/cgroup (for a systemd service, its delegated unit cgroup).
	Base string
	// Log receives the backend's rare notices (the daemon moved into a leaf
	// cgroup, a controller that could not be enabled). The zero Logger
	// discards them.
	Log zerolog.Logger
}

// LimitReporter is implemented by scopes that can tell which of the asked
// Limits they do not enforce (the cgroup and pgroup scopes).
type LimitReporter interface {
	// Unenforced returns the subset of the asked Limits that will not be
	// honoured: MemoryBytes and TasksMax when no kernel limit was set (the
	// controller is missing), CPUMS when Stats cannot measure CPU time so
	// the reactor cannot enforce it. Zero fields are enforced or were not
	// asked.
	Unenforced() Limits
}

// Unenforced returns the asked limits that s does not enforce, and false when
// s cannot tell (it does not implement LimitReporter).
func Unenforced(s Scope) (Limits, bool) {
	if r, ok := s.(LimitReporter); ok {
		return r.Unenforced(), true
	}
	return Limits{}, false
}

// LeftoverCleaner is implemented by backends whose scopes can outlive the
// daemon (the cgroup backend). The daemon calls CleanLeftovers once at
// start-up, before preparing any scope: it kills whatever still runs in a
// scope left by a previous run and deletes the scope. It returns the names of
// the scopes it removed; an error says which ones it could not remove.
type LeftoverCleaner interface {
	CleanLeftovers(ctx context.Context) ([]string, error)
	// CleanLeftoversExcept is CleanLeftovers but leaves the scopes keep
	// accepts (by the name Leftovers would report: a cgroup's directory
	// name, a systemd unit's name): those of executions being adopted.
	CleanLeftoversExcept(ctx context.Context, keep func(name string) bool) ([]string, error)
}
