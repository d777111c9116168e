package scope

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// Adopter is implemented by backends that can take over a scope an earlier
// image of corrald created (after a handover or a crash): name is the
// scope's Name() as the execution's record holds it. The scope it returns
// is Started already (a running tree in it, or an empty one); Signal,
// Kill, Empty, Stats and Remove work as for a scope of this run. Blocking.
type Adopter interface {
	Adopt(ctx context.Context, name string, limits Limits) (Scope, error)
}

var (
	_ Adopter = (*cgroupBackend)(nil)
	_ Adopter = (*systemdBackend)(nil)
	_ Adopter = pgroupBackend{}
)

// Adopt takes over the cgroup named by its path relative to the cgroup2
// root; it must lie directly in the backend's base.
func (b *cgroupBackend) Adopt(_ context.Context, name string, limits Limits) (Scope, error) {
	dir := filepath.Join(b.mount, name)
	if filepath.Dir(dir) != b.base {
		return nil, fmt.Errorf("adopt cgroup %s: not in the cgroup base %s", name, b.base)
	}
	if err := checkScopeName(filepath.Base(dir)); err != nil {
		return nil, fmt.Errorf("adopt cgroup %s: %w", name, err)
	}
	if !cgroupv2.IsCgroup2(dir) {
		return nil, fmt.Errorf("adopt cgroup %s: gone", name)
	}
	s := &cgroupScope{cg: cgroupv2.Dir(dir), at: b.baseFD.At(filepath.Base(dir)), fd: -1, name: b.cgroupPath(dir),
		memory: b.controllers["memory"], pids: b.controllers["pids"]}
	for _, c := range []struct {
		ctrl string
		v    int64
		ptr  *int64
	}{{"memory", limits.MemoryBytes, &s.unenforced.MemoryBytes}, {"pids", limits.TasksMax, &s.unenforced.TasksMax}} {
		if c.v > 0 && !b.controllers[c.ctrl] {
			*c.ptr = c.v
		}
	}
	return s, nil
}

// Adopt takes over the running unit corral-<id>.scope.
func (b *systemdBackend) Adopt(ctx context.Context, name string, limits Limits) (Scope, error) {
	id, hasPrefix := strings.CutPrefix(name, ScopePrefix)
	id, hasSuffix := strings.CutSuffix(id, ScopeSuffix)
	if !hasPrefix || !hasSuffix {
		return nil, fmt.Errorf("adopt %s: not a corral scope unit", name)
	}
	if _, err := unitName(id); err != nil {
		return nil, fmt.Errorf("adopt %s: %w", name, err)
	}
	s := &systemdScope{
		b: b, id: id, unit: name, limits: limits, state: unitRunning,
		paths: b.hier.cgroupsOf(slicePath(b.opts.Slice) + "/" + name),
		last:  unknownStats(),
	}
	// Where Prepare places a unit: no D-Bus round trip per adopted
	// execution when it is there (a restart may adopt a thousand).
	if d := firstNonEmpty(s.paths.Unified, s.paths.Systemd); d != "" {
		if _, err := os.Stat(d); err == nil {
			s.watch = s.startWatch(s.paths)
			return s, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var cg string
	err := b.bus.call(ctx, func(c *sddbus.Conn) error {
		p, err := c.GetUnitTypePropertyContext(ctx, name, "Scope", "ControlGroup")
		if err != nil {
			return err
		}
		cg, _ = p.Value.Value().(string)
		return nil
	})
	if err != nil && !noSuchUnit(err) {
		return nil, fmt.Errorf("adopt %s: %w", name, err)
	}
	if cg != "" {
		s.paths = b.hier.cgroupsOf(cg)
	}
	s.watch = s.startWatch(s.paths)
	return s, nil
}

// Adopt takes over the process group "pgid:<n>".
func (pgroupBackend) Adopt(_ context.Context, name string, limits Limits) (Scope, error) {
	n, err := strconv.ParseInt(strings.TrimPrefix(name, "pgid:"), 10, 64)
	if err != nil || !strings.HasPrefix(name, "pgid:") || n <= 1 {
		return nil, fmt.Errorf("adopt %s: not a process group scope", name)
	}
	s := &pgroupScope{asked: limits}
	s.pgid.Store(n)
	return s, nil
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// ScopeOf is implemented by backends that can name the scope of an
// execution whose record does not (corrald died before the record that
// names it).
//
// ScopeOf names it as Adopt takes it: the scope holding process pid when
// pid > 0 and alive (a pooled command runs in its pool entry's scope),
// else the one Prepare makes for execution id, else "" (unknown). It reads
// /proc; no D-Bus round trip.
//
// Populated reports whether the scope name (as ScopeOf gives it) holds a
// process now; false only when the backend can tell it holds none (gone,
// or empty). It reads the cgroup; no D-Bus round trip.
type ScopeOf interface {
	ScopeOf(id string, pid int) string
	Populated(name string) bool
}

// cgroupPopulated reports whether the cgroup directory dir holds a process
// (in it or below): false when dir is gone or says it is not populated.
func cgroupPopulated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "populated "); ok {
				return strings.TrimSpace(v) != "0"
			}
		}
		return true
	}
	if os.IsNotExist(err) {
		if _, serr := os.Stat(dir); os.IsNotExist(serr) {
			return false
		}
	}
	// No cgroup.events (a v1 hierarchy): its own processes.
	b, err = os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return err != nil || strings.TrimSpace(string(b)) != ""
}

var (
	_ ScopeOf = (*cgroupBackend)(nil)
	_ ScopeOf = (*systemdBackend)(nil)
	_ ScopeOf = pgroupBackend{}
)

// procCgroup is pid's cgroup v2 path ("0::<path>" in /proc/<pid>/cgroup),
// or "".
func procCgroup(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	return ""
}

func (b *cgroupBackend) ScopeOf(id string, pid int) string {
	if cg := procCgroup(pid); cg != "" {
		if dir := filepath.Join(b.mount, cg); filepath.Dir(dir) == b.base {
			return b.cgroupPath(dir)
		}
	}
	if checkScopeName(id) != nil {
		return ""
	}
	return b.cgroupPath(filepath.Join(b.base, id))
}

func (b *systemdBackend) ScopeOf(id string, pid int) string {
	if cg := procCgroup(pid); cg != "" {
		if u := filepath.Base(cg); strings.HasPrefix(u, ScopePrefix) && strings.HasSuffix(u, ScopeSuffix) {
			return u
		}
	}
	u, err := unitName(id)
	if err != nil {
		return ""
	}
	return u
}

// ScopeOf: the pgroup backend's group is the main process's own session.
func (pgroupBackend) ScopeOf(_ string, pid int) string {
	if pid <= 0 {
		return ""
	}
	return "pgid:" + strconv.Itoa(pid)
}

func (b *cgroupBackend) Populated(name string) bool {
	dir := filepath.Join(b.mount, name)
	if filepath.Dir(dir) != b.base {
		return true // not ours to say
	}
	return cgroupPopulated(dir)
}

func (b *systemdBackend) Populated(name string) bool {
	paths := b.hier.cgroupsOf(slicePath(b.opts.Slice) + "/" + name)
	d := firstNonEmpty(paths.Unified, paths.Systemd)
	if d == "" {
		return true
	}
	return cgroupPopulated(d)
}

// Populated: a process group cannot be told empty from here (its leader
// may be gone while others of the group run).
func (pgroupBackend) Populated(string) bool { return true }
