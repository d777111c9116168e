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
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// cgWanted are the controllers the backend enables for its children, when
// the host offers them: memory and pids for Limits, cpu for fair sharing.
// Their absence is tolerated; Unenforced then reports the limits.
var cgWanted = []string{"memory", "pids", "cpu"}

// cgSupervisorLeaf is the child of the daemon's own cgroup it moves itself
// into when its own cgroup must delegate controllers (see enableControllers).
const cgSupervisorLeaf = "supervisor"

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
	mnt, ok := cgPickCgroup2(cgParseMountinfo(mountinfo))
	if !ok {
		return nil, fmt.Errorf("cgroup backend: %w: no cgroup2 mount", ErrUnsupported)
	}
	// Read /proc/self/cgroup once and parse the copy: the file is generated
	// on each read.
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup backend: %w: %w", ErrUnsupported, err)
	}
	own, ok := cgParseOwn(self)
	if !ok {
		return nil, fmt.Errorf("cgroup backend: %w: no cgroup v2 entry in /proc/self/cgroup", ErrUnsupported)
	}
	ownDir, err := cgOwnDir(mnt, own)
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
	if !cgIsCgroup2(anc) {
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
		log:    opts.Log,
	}
	b.controllers = cgEnableControllers(cgRealFS{}, ownDir, base, os.Getpid(), opts.Log)
	return b, nil
}

// cgroupBackend is immutable after NewCgroup, so it is safe for concurrent
// use.
type cgroupBackend struct {
	mount       string // cgroup2 mount point
	base        string // parent of the scopes
	ownDir      string // the daemon's cgroup when NewCgroup ran
	controllers map[string]bool
	log         zerolog.Logger
}

var (
	_ Backend         = (*cgroupBackend)(nil)
	_ LeftoverCleaner = (*cgroupBackend)(nil)
)

func (b *cgroupBackend) Name() string { return "cgroup" }

// Placement is PlaceAtClone: Prepare sets UseCgroupFD.
func (b *cgroupBackend) Placement() Placement { return PlaceAtClone }

// Close does nothing: the backend holds no resources; scopes and the base
// directory stay until removed.
func (b *cgroupBackend) Close() error { return nil }

// cgCheckName rejects names that would leave the base directory.
func cgCheckName(name string) error {
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
	if err := cgCheckName(spec.ID); err != nil {
		return nil, fmt.Errorf("prepare cgroup scope: %w", err)
	}
	if spec.Cmd == nil {
		return nil, fmt.Errorf("prepare cgroup scope %s: no command", spec.ID)
	}
	dir := filepath.Join(b.base, spec.ID)
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("prepare cgroup scope %s: %w", dir, os.NewSyscallError("mkdir", err))
	}
	s := &cgroupScope{dir: dir, fd: -1, name: b.cgroupPath(dir), log: b.log}
	fail := func(err error) (Scope, error) {
		if rerr := s.Remove(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("prepare cgroup scope %s: %w", dir, err)
	}

	lim := spec.Limits
	if lim.MemoryBytes > 0 {
		if b.controllers["memory"] {
			if err := cgWrite(dir, "memory.max", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
				return fail(fmt.Errorf("set memory.max: %w", err))
			}
			// No swap, so the limit means resident memory. memory.swap.max
			// is missing when swap accounting is off; then there is nothing
			// to disable.
			if err := cgWrite(dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fail(fmt.Errorf("set memory.swap.max: %w", err))
			}
			// An OOM kill takes the whole tree, not one process of it: the
			// execution ends as memory_limit instead of limping on.
			if err := cgWrite(dir, "memory.oom.group", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fail(fmt.Errorf("set memory.oom.group: %w", err))
			}
		} else {
			s.unenforced.MemoryBytes = lim.MemoryBytes
		}
	}
	if lim.TasksMax > 0 {
		if b.controllers["pids"] {
			if err := cgWrite(dir, "pids.max", strconv.FormatInt(lim.TasksMax, 10)); err != nil {
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
	subs, err := cgSubdirs(b.base)
	if err != nil {
		return nil, fmt.Errorf("list cgroup scopes in %s: %w", b.base, err)
	}
	if b.base == b.ownDir {
		// Never offer the daemon's own leaf for removal.
		subs = slices.DeleteFunc(subs, func(s string) bool { return s == cgSupervisorLeaf })
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
	if err := cgCheckName(name); err != nil {
		return fmt.Errorf("remove leftover scope: %w", err)
	}
	if b.base == b.ownDir && name == cgSupervisorLeaf {
		return fmt.Errorf("remove leftover scope: %q holds the daemon", name)
	}
	s := &cgroupScope{dir: filepath.Join(b.base, name), fd: -1, log: b.log}
	if err := s.Kill(); err != nil {
		return fmt.Errorf("remove leftover scope: %w", err)
	}
	if err := cgWaitEmpty(ctx, s); err != nil {
		return fmt.Errorf("remove leftover scope %s: %w", s.dir, err)
	}
	return s.Remove()
}

// CleanLeftovers removes every leftover scope (see LeftoverCleaner).
func (b *cgroupBackend) CleanLeftovers(ctx context.Context) ([]string, error) {
	names, err := b.Leftovers()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, n := range names {
		if err := b.removeLeftover(ctx, n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}

// cgWaitEmpty polls until s is empty or ctx ends.
func cgWaitEmpty(ctx context.Context, s Scope) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		empty, err := s.Empty()
		if err != nil {
			return err
		}
		if empty {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for empty scope: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// cgroupScope is one execution's cgroup. Its methods may be called from any
// goroutine; mu guards fd and the last Stats, the rest is kernel state.
type cgroupScope struct {
	dir        string // absolute path
	name       string // cgroup path relative to the cgroup2 root
	unenforced Limits
	log        zerolog.Logger

	mu       sync.Mutex
	fd       int   // directory fd for CLONE_INTO_CGROUP, -1 once closed
	last     Stats // last successful Stats, returned once the cgroup is gone
	haveLast bool
}

var (
	_ Scope         = (*cgroupScope)(nil)
	_ LimitReporter = (*cgroupScope)(nil)
)

func (s *cgroupScope) Name() string { return s.name }

// Unenforced reports the asked MemoryBytes and TasksMax whose controller is
// not available. CPUMS is never reported: Stats always measures CPU.
func (s *cgroupScope) Unenforced() Limits { return s.unenforced }

func (s *cgroupScope) closeFD() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("close cgroup fd of %s: %w", s.dir, os.NewSyscallError("close", err))
	}
	return nil
}

// Started closes the directory fd: the kernel placed the child at clone.
func (s *cgroupScope) Started(_ context.Context, _ int) error { return s.closeFD() }

// Signal sends sig to every process in the scope, including child cgroups a
// process made. SIGKILL goes through cgroup.kill. Any other signal is sent
// with the cgroup frozen, so that no process forks a child the signal would
// miss: freeze, list cgroup.procs, kill(2) each, thaw. Blocking: up to
// ~100ms waiting for the freeze.
func (s *cgroupScope) Signal(sig unix.Signal) error {
	if sig == unix.SIGKILL {
		return s.Kill()
	}
	return s.signalEach(sig)
}

func (s *cgroupScope) signalEach(sig unix.Signal) error {
	if _, err := os.Stat(s.dir); errors.Is(err, os.ErrNotExist) {
		return nil // removed: nothing left to signal
	}
	frozen := cgWrite(s.dir, "cgroup.freeze", "1") == nil
	if frozen {
		// Thaw even on errors: a frozen scope never exits. A frozen process
		// gets the signal when thawed.
		defer func() {
			if err := cgWrite(s.dir, "cgroup.freeze", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.log.Error().Err(err).Str("cgroup", s.dir).Msg("thaw scope")
			}
		}()
		s.waitFrozen(100 * time.Millisecond)
	}
	var errs []error
	err := cgWalk(s.dir, func(dir string) error {
		data, err := cgRead(dir, "cgroup.procs")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				continue
			}
			if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("pid %d: %w", pid, os.NewSyscallError("kill", err)))
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("signal %s to cgroup %s: %w", unix.SignalName(sig), s.dir, err)
	}
	return nil
}

// waitFrozen waits until cgroup.events says "frozen 1", at most d. A task in
// uninterruptible sleep can delay freezing; then the signal is sent anyway.
func (s *cgroupScope) waitFrozen(d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		data, err := cgRead(s.dir, "cgroup.events")
		if err != nil {
			return
		}
		if v, ok := cgKeyed(data, "frozen"); ok && v == 1 {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// cgWalk calls fn for dir and every cgroup below it, parents first.
func cgWalk(dir string, fn func(dir string) error) error {
	if err := fn(dir); err != nil {
		return err
	}
	subs, err := cgSubdirs(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, sub := range subs {
		if err := cgWalk(filepath.Join(dir, sub), fn); err != nil {
			return err
		}
	}
	return nil
}

// Kill writes "1" to cgroup.kill, which SIGKILLs every process in the scope
// and its child cgroups, including ones forking at that moment. A removed
// scope has nothing to kill. On a kernel without cgroup.kill (before 5.14)
// it falls back to freeze-and-signal.
func (s *cgroupScope) Kill() error {
	err := cgWrite(s.dir, "cgroup.kill", "1")
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(s.dir); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		return s.signalEach(unix.SIGKILL)
	}
	return fmt.Errorf("kill cgroup %s: %w", s.dir, err)
}

// Empty reads "populated" from cgroup.events, which counts child cgroups
// too. Exited but unreaped processes (zombies) no longer count. A removed
// scope is empty.
func (s *cgroupScope) Empty() (bool, error) {
	data, err := cgRead(s.dir, "cgroup.events")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return true, nil
		}
		return false, fmt.Errorf("read cgroup.events of %s: %w", s.dir, err)
	}
	v, ok := cgKeyed(data, "populated")
	if !ok {
		return false, fmt.Errorf("read cgroup.events of %s: no populated key", s.dir)
	}
	return v == 0, nil
}

// Stats reads cpu.stat (always present), memory.peak and memory.events (with
// the memory controller), pids.peak and pids.current (with the pids
// controller); without pids it counts cgroup.threads, in the scope and any
// child cgroups. What it cannot read is Unknown. Once the scope is removed it
// returns the last reading it made, so read Stats before Remove for the final
// usage.
func (s *cgroupScope) Stats() (Stats, error) {
	st := unknownStats()
	data, err := cgRead(s.dir, "cpu.stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Removed: the last reading is the final one.
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.haveLast {
				return s.last, nil
			}
		}
		return st, fmt.Errorf("stats of cgroup %s: %w", s.dir, err)
	}
	for key, dst := range map[string]*int64{
		"usage_usec":  &st.CPUUsageNS,
		"user_usec":   &st.CPUUserNS,
		"system_usec": &st.CPUSystemNS,
	} {
		if v, ok := cgKeyed(data, key); ok {
			*dst = v * 1000
		}
	}
	if v, err := cgReadInt(s.dir, "memory.peak"); err == nil && v >= 0 {
		st.MemoryPeak = v
	}
	if data, err := cgRead(s.dir, "memory.events"); err == nil {
		if v, ok := cgKeyed(data, "oom_kill"); ok {
			st.OOMKills = v
		}
	}
	if v, err := cgReadInt(s.dir, "pids.current"); err == nil && v >= 0 {
		st.Tasks = v
	} else {
		var n int64
		err := cgWalk(s.dir, func(dir string) error {
			data, err := cgRead(dir, "cgroup.threads")
			if err != nil {
				return err
			}
			n += int64(strings.Count(string(data), "\n"))
			return nil
		})
		if err == nil {
			st.Tasks = n
		}
	}
	if v, err := cgReadInt(s.dir, "pids.peak"); err == nil && v >= 0 {
		st.TasksPeak = v
	} else {
		st.TasksPeak = st.Tasks
	}
	s.mu.Lock()
	s.last, s.haveLast = st, true
	s.mu.Unlock()
	return st, nil
}

// Remove closes the directory fd if Started did not, and deletes the scope
// and any child cgroups its processes made. It fails (EBUSY) while a process
// is left; a scope already gone is not an error. Idempotent.
func (s *cgroupScope) Remove() error {
	ferr := s.closeFD()
	if err := cgRemoveTree(s.dir); err != nil {
		return errors.Join(fmt.Errorf("remove cgroup scope: %w", err), ferr)
	}
	return ferr
}

// cgFS is the slice of the cgroup filesystem cgEnableControllers needs, so
// tests can play a pure v2 host with controllers.
type cgFS interface {
	Read(dir, name string) ([]byte, error)
	Write(dir, name, value string) error
	Mkdir(dir string) error // EEXIST is not an error
}

type cgRealFS struct{}

func (cgRealFS) Read(dir, name string) ([]byte, error) { return cgRead(dir, name) }
func (cgRealFS) Write(dir, name, value string) error   { return cgWrite(dir, name, value) }
func (cgRealFS) Mkdir(dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return os.NewSyscallError("mkdir", err)
	}
	return nil
}

// cgEnableControllers enables the wanted controllers the host offers in
// cgroup.subtree_control of every cgroup from the daemon's own (ownDir) down
// to base, so that base's children get them. When base is not inside ownDir
// it touches base only. It returns the controllers the children of base get.
//
// The "no internal processes" rule of cgroup v2: a non-root cgroup that holds
// processes cannot enable controllers for its children (the write fails with
// EBUSY). The daemon's own cgroup holds the daemon, so on EBUSY there the
// daemon moves itself into the leaf <own>/supervisor and tries again. That
// only moves the daemon's process; if other processes share its cgroup, the
// controllers stay off and the failure is logged.
func cgEnableControllers(fs cgFS, ownDir, base string, pid int, log zerolog.Logger) map[string]bool {
	chain := []string{base}
	if rel, err := filepath.Rel(ownDir, base); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		chain = []string{ownDir}
		if rel != "." {
			d := ownDir
			for _, part := range strings.Split(rel, "/") {
				d = filepath.Join(d, part)
				chain = append(chain, d)
			}
		}
	}
	moved := false
	want := slices.Clone(cgWanted)
	for _, dir := range chain {
		avail := cgFieldSet(fs.Read(dir, "cgroup.controllers"))
		on := cgFieldSet(fs.Read(dir, "cgroup.subtree_control"))
		var next []string
		for _, c := range want {
			if !avail[c] {
				continue
			}
			if on[c] {
				next = append(next, c)
				continue
			}
			err := fs.Write(dir, "cgroup.subtree_control", "+"+c)
			if errors.Is(err, unix.EBUSY) && dir == ownDir && !moved {
				moved = true
				leaf := filepath.Join(ownDir, cgSupervisorLeaf)
				if merr := cgMoveInto(fs, leaf, pid); merr != nil {
					log.Warn().Err(merr).Str("cgroup", leaf).Msg("cannot move the daemon into a leaf cgroup; controllers stay off")
				} else {
					log.Info().Str("cgroup", leaf).Msg("moved the daemon into a leaf cgroup so its own cgroup can delegate controllers")
					err = fs.Write(dir, "cgroup.subtree_control", "+"+c)
				}
			}
			if err != nil {
				log.Warn().Err(err).Str("cgroup", dir).Str("controller", c).Msg("cannot enable controller for scopes")
				continue
			}
			next = append(next, c)
		}
		want = next
	}
	// The truth is what base now delegates.
	on := cgFieldSet(fs.Read(base, "cgroup.subtree_control"))
	got := map[string]bool{}
	for _, c := range cgWanted {
		if on[c] {
			got[c] = true
		}
	}
	return got
}

func cgMoveInto(fs cgFS, leaf string, pid int) error {
	if err := fs.Mkdir(leaf); err != nil {
		return err
	}
	return fs.Write(leaf, "cgroup.procs", strconv.Itoa(pid))
}

// cgFieldSet splits a space-separated controller list into a set; a read
// error gives the empty set.
func cgFieldSet(data []byte, err error) map[string]bool {
	set := map[string]bool{}
	if err != nil {
		return set
	}
	for _, f := range strings.Fields(string(data)) {
		set[f] = true
	}
	return set
}

var _ Limiter = (*cgroupScope)(nil)

// SetLimits rewrites memory.max (with memory.swap.max 0) and pids.max where
// those controllers exist; zero fields lift the limit. What cannot be set
// is reported by Unenforced.
func (s *cgroupScope) SetLimits(_ context.Context, l Limits) error {
	write := func(file string, v int64, zeroMeans string) error {
		val := zeroMeans
		if v > 0 {
			val = strconv.FormatInt(v, 10)
		}
		if err := cgWrite(s.dir, file, val); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("set %s of %s: %w", file, s.name, err)
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unenforced = Limits{}
	if _, err := os.Stat(filepath.Join(s.dir, "memory.max")); err == nil {
		if err := write("memory.max", l.MemoryBytes, "max"); err != nil {
			return err
		}
		swap := int64(0)
		if l.MemoryBytes == 0 {
			swap = -1
		}
		if swap == 0 {
			if err := cgWrite(s.dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("set memory.swap.max of %s: %w", s.name, err)
			}
			// As in Prepare: an OOM kill takes the whole tree.
			if err := cgWrite(s.dir, "memory.oom.group", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("set memory.oom.group of %s: %w", s.name, err)
			}
		} else if err := write("memory.swap.max", 0, "max"); err != nil {
			return err
		}
	} else {
		s.unenforced.MemoryBytes = l.MemoryBytes
	}
	if _, err := os.Stat(filepath.Join(s.dir, "pids.max")); err == nil {
		if err := write("pids.max", l.TasksMax, "max"); err != nil {
			return err
		}
	} else {
		s.unenforced.TasksMax = l.TasksMax
	}
	return nil
}
