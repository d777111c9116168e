package scope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// wantedControllers are the controllers the backend enables for its children, when
// the host offers them: memory and pids for Limits, cpu for fair sharing.
// Their absence is tolerated; Unenforced then reports the limits.
var wantedControllers = []string{"memory", "pids", "cpu"}

// supervisorLeaf is the child of the daemon's own cgroup it moves itself
// into when its own cgroup must delegate controllers (see enableControllers).
const supervisorLeaf = "supervisor"

// NewCgroup returns the cgroup v2 backend: one cgroup <base>/<id> per
// execution, entered by the child atomically at clone(2) with
// CLONE_INTO_CGROUP, killed with cgroup.kill, watched with cgroup.events.
//
// It finds the cgroup2 mount in /proc/self/mountinfo (/sys/fs/cgroup on a
// pure v2 host, /sys/fs/cgroup/unified on a hybrid one) and the daemon's own
// cgroup in /proc/self/cgroup; see CgroupOptions.Base for the base directory.
// It then enables the memory, pids and cpu controllers the host offers for
// the base's children, touching only cgroups inside the daemon's own subtree.
// On a pure v2 host this may move the daemon itself into the leaf
// "<own cgroup>/supervisor" (see enableControllers).
//
// It returns an error wrapping ErrUnsupported when there is no cgroup2 mount
// or the base is not a writable cgroup2 directory.
//
// The backend also implements LeftoverCleaner.
func NewCgroup(opts CgroupOptions) (Backend, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup backend: %w: %w", ErrUnsupported, err)
	}
	mnt, ok := cgroupv2.FindUnified(cgroupv2.ParseMountinfo(mountinfo))
	if !ok {
		return nil, fmt.Errorf("cgroup backend: %w: no cgroup2 mount", ErrUnsupported)
	}
	// Read /proc/self/cgroup once and parse the copy: the file is generated
	// on each read.
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup backend: %w: %w", ErrUnsupported, err)
	}
	own, ok := cgroupv2.ParseOwn(self)
	if !ok {
		return nil, fmt.Errorf("cgroup backend: %w: no cgroup v2 entry in /proc/self/cgroup", ErrUnsupported)
	}
	ownDir, err := mnt.Dir(own)
	if err != nil {
		return nil, fmt.Errorf("cgroup backend: %w: %w", ErrUnsupported, err)
	}
	base := opts.Base
	if base == "" {
		base = filepath.Join(ownDir, "corral")
	}
	if !filepath.IsAbs(base) {
		return nil, fmt.Errorf("cgroup backend: base %q is not an absolute path", base)
	}
	base = filepath.Clean(base)
	// Check the nearest existing ancestor before creating anything, so a
	// wrong Base never makes plain directories elsewhere.
	anc := base
	for {
		if _, err := os.Stat(anc); err == nil || anc == "/" {
			break
		}
		anc = filepath.Dir(anc)
	}
	if !cgroupv2.IsCgroup2(anc) {
		return nil, fmt.Errorf("cgroup backend: %w: %s is not on a cgroup2 filesystem", ErrUnsupported, base)
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup backend: %w: create base: %w", ErrUnsupported, err)
	}
	// Scopes are made with mkdir in base; entering one at clone needs write
	// access to the scope's cgroup.procs, which base's own stands for.
	for _, p := range []string{base, filepath.Join(base, "cgroup.procs")} {
		if err := unix.Access(p, unix.W_OK); err != nil {
			return nil, fmt.Errorf("cgroup backend: %w: %s not writable: %w", ErrUnsupported, p, err)
		}
	}

	b := &cgroupBackend{
		mount:  mnt.Point,
		base:   base,
		ownDir: ownDir,
	}
	b.controllers = enableControllers(realControllerFS{}, ownDir, base, os.Getpid(), opts.Log)
	if b.baseFD, err = cgroupv2.OpenBase(cgroupv2.Dir(base)); err != nil {
		return nil, fmt.Errorf("cgroup backend: %w", err)
	}
	return b, nil
}

// cgroupBackend is immutable after NewCgroup, so it is safe for concurrent
// use.
type cgroupBackend struct {
	mount       string // cgroup2 mount point
	base        string // parent of the scopes
	ownDir      string // the daemon's cgroup when NewCgroup ran
	controllers map[string]bool
	// baseFD is base open: the scopes read their counters relative to it
	// (cgroupv2.At), the backend's one descriptor.
	baseFD *cgroupv2.Base
}

var (
	_ Backend         = (*cgroupBackend)(nil)
	_ LeftoverCleaner = (*cgroupBackend)(nil)
)

func (b *cgroupBackend) Name() string { return "cgroup" }

// Placement is PlaceAtClone: Prepare sets UseCgroupFD.
func (b *cgroupBackend) Placement() Placement { return PlaceAtClone }

// Close closes the base's descriptor (scopes read by path from then on);
// scopes and the base directory stay until removed.
func (b *cgroupBackend) Close() error { return b.baseFD.Close() }

// checkScopeName rejects names that would leave the base directory.
func checkScopeName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("bad scope name %q", name)
	}
	return nil
}

// Prepare makes the cgroup <base>/<id>, writes the limits the host's
// controllers allow, and sets spec.Cmd.SysProcAttr so the child is cloned
// straight into it (UseCgroupFD) as a session leader (Setsid: no terminal
// signal aimed at its group reaches the daemon). The directory fd it opens is
// closed by Started, or by Remove if the child never starts. Blocking (a
// few file system calls).
func (b *cgroupBackend) Prepare(_ context.Context, spec Spec) (Scope, error) {
	if err := checkScopeName(spec.ID); err != nil {
		return nil, fmt.Errorf("prepare cgroup scope: %w", err)
	}
	if spec.Cmd == nil {
		return nil, fmt.Errorf("prepare cgroup scope %s: no command", spec.ID)
	}
	dir := filepath.Join(b.base, spec.ID)
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("prepare cgroup scope %s: %w", dir, os.NewSyscallError("mkdir", err))
	}
	s := &cgroupScope{cg: cgroupv2.Dir(dir), at: b.baseFD.At(spec.ID), fd: -1, name: b.cgroupPath(dir),
		memory: b.controllers["memory"], pids: b.controllers["pids"]}
	fail := func(err error) (Scope, error) {
		// Nothing has run in the new cgroup: a plain rmdir removes it and
		// needs no fd, where Remove lists the directory first, which fails
		// too when the cause was EMFILE and left the cgroup behind for
		// good (found by tests/drill, emfile).
		_ = s.closeFD()
		if rerr := unix.Rmdir(dir); rerr != nil {
			if rerr := s.Remove(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return nil, fmt.Errorf("prepare cgroup scope %s: %w", dir, err)
	}

	lim := spec.Limits
	if lim.MemoryBytes > 0 {
		if b.controllers["memory"] {
			if err := s.cg.Write("memory.max", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
				return fail(fmt.Errorf("set memory.max: %w", err))
			}
			// No swap, so the limit means resident memory. memory.swap.max
			// is missing when swap accounting is off; then there is nothing
			// to disable.
			if err := s.cg.Write("memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fail(fmt.Errorf("set memory.swap.max: %w", err))
			}
			// An OOM kill takes the whole tree, not one process of it: the
			// execution ends as memory_limit instead of limping on.
			if err := s.cg.Write("memory.oom.group", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fail(fmt.Errorf("set memory.oom.group: %w", err))
			}
		} else {
			s.unenforced.MemoryBytes = lim.MemoryBytes
		}
	}
	if lim.TasksMax > 0 {
		if b.controllers["pids"] {
			if err := s.cg.Write("pids.max", strconv.FormatInt(lim.TasksMax, 10)); err != nil {
				return fail(fmt.Errorf("set pids.max: %w", err))
			}
		} else {
			s.unenforced.TasksMax = lim.TasksMax
		}
	}
	// CPUMS is enforced by the reactor from Stats; cpu.stat exists in every
	// non-root cgroup, with or without the cpu controller.

	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(os.NewSyscallError("open", err))
	}
	s.fd = fd
	pgSetsid(spec.Cmd.SysProcAttr, spec)
	spec.Cmd.SysProcAttr.UseCgroupFD = true
	spec.Cmd.SysProcAttr.CgroupFD = fd
	return s, nil
}

// cgroupPath names dir as the kernel does in /proc/<pid>/cgroup: relative to
// the cgroup2 root.
func (b *cgroupBackend) cgroupPath(dir string) string {
	if rel, ok := strings.CutPrefix(dir, b.mount); ok && strings.HasPrefix(rel, "/") {
		return rel
	}
	return dir
}

// Leftovers lists the scopes (child cgroups of the base) that exist now. At
// start-up, before any Prepare, they are what a previous run left behind.
func (b *cgroupBackend) Leftovers() ([]string, error) {
	subs, err := cgroupv2.Dir(b.base).Children()
	if err != nil {
		return nil, fmt.Errorf("list cgroup scopes in %s: %w", b.base, err)
	}
	if b.base == b.ownDir {
		// Never offer the daemon's own leaf for removal.
		subs = slices.DeleteFunc(subs, func(s string) bool { return s == supervisorLeaf })
	}
	return subs, nil
}

// RemoveLeftover kills every process in the scope name, waits (up to 5s) for
// it to empty, and deletes it.
func (b *cgroupBackend) RemoveLeftover(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return b.removeLeftover(ctx, name)
}

func (b *cgroupBackend) removeLeftover(ctx context.Context, name string) error {
	if err := checkScopeName(name); err != nil {
		return fmt.Errorf("remove leftover scope: %w", err)
	}
	if b.base == b.ownDir && name == supervisorLeaf {
		return fmt.Errorf("remove leftover scope: %q holds the daemon", name)
	}
	if err := cgroupv2.Dir(b.base).Child(name).Destroy(ctx); err != nil {
		return fmt.Errorf("remove leftover scope: %w", err)
	}
	return nil
}

// CleanLeftovers removes every leftover scope (see LeftoverCleaner).
func (b *cgroupBackend) CleanLeftovers(ctx context.Context) ([]string, error) {
	return b.CleanLeftoversExcept(ctx, nil)
}

// CleanLeftoversExcept removes every leftover scope but those keep accepts
// (by name: the cgroup's directory name, the execution's id), which hold
// executions the daemon adopts (see LeftoverCleaner).
func (b *cgroupBackend) CleanLeftoversExcept(ctx context.Context, keep func(name string) bool) ([]string, error) {
	names, err := b.Leftovers()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, n := range names {
		if keep != nil && keep(n) {
			continue
		}
		if err := b.removeLeftover(ctx, n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}

// waitEmpty polls until s is empty or ctx ends.
func waitEmpty(ctx context.Context, s Scope) error {
	return cgroupv2.PollEmpty(ctx, s.Empty)
}
