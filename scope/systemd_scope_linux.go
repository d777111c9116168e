package scope

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// unitState is where a systemd scope is in its life. Transitions:
// prepared -> starting (Started called) | removed (Remove before Started);
// starting -> running (Started succeeded) | failed (Started failed);
// running -> removed; failed -> removed. removed is terminal.
type unitState int

const (
	unitPrepared unitState = iota // no unit yet
	unitStarting                  // Started is talking to systemd
	unitRunning                   // unit created around the child
	unitFailed                    // Started failed; the caller aborts the held child
	unitRemoved                   // unit gone (Remove succeeded)
)

func (st unitState) String() string {
	return [...]string{"prepared", "starting", "running", "failed", "removed"}[st]
}

// systemdScope is one execution's transient scope unit. Its methods may be
// called from different goroutines; mu guards the mutable fields.
type systemdScope struct {
	b      *systemdBackend
	id     string
	unit   string
	desc   string
	limits Limits

	mu     sync.Mutex
	state  unitState
	killed bool // Kill was called: Started must fail, so the child is never released
	paths  unitCgroups
	last   Stats        // the last Stats, merged; kept for when the cgroup is pruned
	oom    *v1OOM       // v1 OOM eventfd accounting (memory limit on v1 only)
	watch  *cgroupWatch // set by Started, stopped by Remove or a failed Started
	// runningAt is when Started finished: systemd moved the child in, and
	// the kernel announced "populated 1", before it (see selfStopped).
	runningAt time.Time
	// removed is closed when systemd announces the unit unloaded
	// (UnitRemoved); nil where the backend does not see the signal.
	removed <-chan struct{}
}

var (
	_ Scope         = (*systemdScope)(nil)
	_ LimitReporter = (*systemdScope)(nil)
)

func (s *systemdScope) Name() string { return s.unit }

// minTasksMax is the lowest TasksMax the backend sets: room for the held
// shim's runtime threads (measured: 4 to 5), which count until it execs.
const minTasksMax = 8

// Unenforced: systemd enforces MemoryMax and TasksMax itself where the
// memory and pids controllers exist (reported as the cgroup backend does
// where they do not; TasksMax not below minTasksMax, so a smaller one is
// reported too); CPUMS is enforced by the reactor and needs CPU time in
// Stats, which every layout provides (cgroup2 cpu.stat or v1 cpuacct).
func (s *systemdScope) Unenforced() Limits {
	var l Limits
	if s.limits.MemoryBytes > 0 && !s.b.controllers.memory {
		l.MemoryBytes = s.limits.MemoryBytes
	}
	if s.limits.TasksMax > 0 && (s.limits.TasksMax < minTasksMax || !s.b.controllers.pids) {
		l.TasksMax = s.limits.TasksMax
	}
	if s.limits.CPUMS > 0 && s.paths.Unified == "" && s.paths.CPUAcct == "" {
		l.CPUMS = s.limits.CPUMS
	}
	return l
}

// properties are the transient unit's settings.
func (s *systemdScope) properties(pid int) []sddbus.Property {
	props := []sddbus.Property{
		sddbus.PropDescription(s.desc),
		// One slice for everything corral runs, so an operator can watch
		// and cap all of it at once (systemctl status corral.slice).
		sddbus.PropSlice(s.b.opts.Slice),
		// The held shim: systemd moves it, with all its threads, into the
		// scope's cgroups before we release it, so every process the
		// command makes is born inside and cannot escape by forking early.
		sddbus.PropPids(uint32(pid)),
		// Unload the unit as soon as it stops, also when it failed (an OOM
		// kill can fail a scope): a failed unit would stay loaded, keep its
		// name taken and pile up.
		{Name: "CollectMode", Value: dbus.MakeVariant("inactive-or-failed")},
		// Accounting on: on a hybrid host this is what gives the scope its
		// own v1 cpuacct, memory and pids cgroups, which Stats reads and
		// MemoryMax/TasksMax need.
		{Name: "CPUAccounting", Value: dbus.MakeVariant(true)},
		{Name: "MemoryAccounting", Value: dbus.MakeVariant(true)},
		{Name: "TasksAccounting", Value: dbus.MakeVariant(true)},
		// The reactor decides what an OOM kill means (outcome
		// memory_limit, then its own kill); systemd must not stop the scope
		// behind its back as the default OOMPolicy=stop would.
		{Name: "OOMPolicy", Value: dbus.MakeVariant("continue")},
		// A stop that meets a process ignoring SIGTERM escalates to SIGKILL
		// after 10 s instead of 90 s (Remove and CleanLeftovers stop units).
		{Name: "TimeoutStopUSec", Value: dbus.MakeVariant(uint64(10 * time.Second / time.Microsecond))},
	}
	if s.limits.TasksMax > 0 {
		// Processes plus threads of the whole tree: stops fork bombs. Never
		// below minTasksMax: the held shim is a Go program whose runtime
		// threads are moved into the scope with it (and may still be
		// starting), and a runtime that cannot start a thread aborts.
		props = append(props, sddbus.Property{Name: "TasksMax", Value: dbus.MakeVariant(uint64(max(s.limits.TasksMax, minTasksMax)))})
	}
	if s.limits.MemoryBytes > 0 {
		// Hard memory cap of the tree (applied as memory.limit_in_bytes on
		// v1); past it the kernel OOM-kills inside the scope.
		props = append(props, sddbus.Property{Name: "MemoryMax", Value: dbus.MakeVariant(uint64(s.limits.MemoryBytes))})
		// No swap, or the cap would only slow the tree down (v2 only; on v1
		// systemd ignores it).
		props = append(props, sddbus.Property{Name: "MemorySwapMax", Value: dbus.MakeVariant(uint64(0))})
	}
	return props
}

// Started creates the unit around the held child pid and waits for systemd
// to finish the start job. It does not release the child: the caller does,
// once Started returned nil, and aborts its hold on an error. The scope's
// lock is not held while waiting for systemd, so Kill, Empty and Stats stay
// responsive.
func (s *systemdScope) Started(ctx context.Context, pid int) error {
	s.mu.Lock()
	if s.state != unitPrepared {
		st := s.state
		s.mu.Unlock()
		return fmt.Errorf("start scope %s: scope is %s", s.unit, st)
	}
	if s.killed {
		s.state = unitFailed
		s.mu.Unlock()
		return fmt.Errorf("start scope %s: killed before it started", s.unit)
	}
	s.state = unitStarting
	// Before the start job: the unit may empty and go as soon as it runs.
	s.removed = s.b.bus.removals.watch(s.unit)
	s.mu.Unlock()

	fail := func(err error) error {
		s.b.bus.removals.forget(s.unit)
		s.dropWatch(unitFailed)
		return fmt.Errorf("start scope %s: %w", s.unit, err)
	}
	ctx, cancel := s.b.bus.bound(ctx)
	defer cancel()

	props := s.properties(pid)
	res, err := s.b.bus.runJob(ctx, s.unit, jobStart, func(c *sddbus.Conn, ch chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, s.unit, "fail", props, ch)
	})
	if err == nil && res != "done" {
		err = fmt.Errorf("start job %s", res)
	}
	if err != nil {
		s.stopBestEffort()
		return fail(err)
	}
	// The unit's real cgroup. Where systemd placed it (slicePath) no D-Bus
	// round trip is needed: a directory named after this unit is its
	// cgroup. Otherwise systemd is asked; the guess from Prepare stays if
	// it cannot tell.
	s.mu.Lock()
	guess := s.paths
	s.mu.Unlock()
	if d := firstNonEmpty(guess.Unified, guess.Systemd); d == "" || !cgroupv2.Dir(d).Exists() {
		var cg string
		err = s.b.bus.call(ctx, func(c *sddbus.Conn) error {
			p, err := c.GetUnitTypePropertyContext(ctx, s.unit, "Scope", "ControlGroup")
			if err != nil {
				return err
			}
			cg, _ = p.Value.Value().(string)
			return nil
		})
		s.mu.Lock()
		if err == nil && cg != "" {
			s.paths = s.b.hier.cgroupsOf(cg)
		} else {
			s.b.opts.Log.Warn().Err(err).Str("unit", s.unit).Msg("cannot read the scope's ControlGroup; using the default path")
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	killed := s.killed
	paths := s.paths
	s.mu.Unlock()
	// Watch before the caller releases the child: from then on the tree may
	// die at any time, and systemd removes its cgroup right after.
	w := s.startWatch(paths)
	s.mu.Lock()
	s.watch = w
	s.mu.Unlock()
	if killed {
		s.stopBestEffort()
		return fail(errors.New("killed while starting"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = unitRunning
	s.runningAt = time.Now()
	if s.killed {
		// Kill ran between the check above and now and, seeing the scope
		// starting, left the child alone: finish its job.
		s.paths.kill()
	}
	return nil
}

// stopBestEffort asks systemd to stop the unit without waiting.
func (s *systemdScope) stopBestEffort() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.stopUnit(ctx, zerolog.WarnLevel, "stop scope")
}

// stopUnit queues a stop job for the unit ("replace", no job wait) and logs
// a failure other than the unit being gone already at level with msg.
func (s *systemdScope) stopUnit(ctx context.Context, level zerolog.Level, msg string) {
	err := s.b.bus.call(ctx, func(c *sddbus.Conn) error {
		_, err := c.StopUnitContext(ctx, s.unit, "replace", nil)
		return err
	})
	if err != nil && !noSuchUnit(err) {
		s.b.opts.Log.WithLevel(level).Err(err).Str("unit", s.unit).Msg(msg)
	}
}

func (s *systemdScope) snapshot() (unitState, unitCgroups) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.paths
}

// Signal sends sig to every process of the scope through systemd
// (KillUnit, who=all), or through the cgroup when D-Bus is unusable.
func (s *systemdScope) Signal(sig unix.Signal) error {
	state, paths := s.snapshot()
	if state != unitRunning {
		return fmt.Errorf("signal scope %s: scope is %s", s.unit, state)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.b.bus.call(ctx, func(c *sddbus.Conn) error {
		return c.KillUnitWithTarget(ctx, s.unit, sddbus.All, int32(sig))
	})
	if err == nil || noSuchUnit(err) {
		return nil // NoSuchUnit: the scope emptied and was unloaded
	}
	s.b.opts.Log.Warn().Err(err).Str("unit", s.unit).Msg("KillUnit failed; signalling through the cgroup")
	if err2 := paths.signal(sig); err2 != nil {
		return fmt.Errorf("signal scope %s: %w", s.unit, errors.Join(err, err2))
	}
	return nil
}

// Kill SIGKILLs every process of the scope through its cgroup (cgroup.kill
// where the kernel has it), which needs no D-Bus. Only where that did not
// reach the scope's cgroup (no cgroup.kill, no unified hierarchy, the
// cgroup not where Started was told) does it ask systemd too (KillUnit),
// best effort: a D-Bus round trip that systemd would answer while it stops
// the emptied scope, on the way to cleaned. Before or during Started it
// aborts the held child instead.
func (s *systemdScope) Kill() error {
	s.mu.Lock()
	s.killed = true
	state, paths := s.state, s.paths
	s.mu.Unlock()
	switch state {
	case unitPrepared, unitStarting, unitFailed:
		// No unit holds the child yet: Started sees killed and fails, or
		// already failed, and the caller aborts its hold; the child runs
		// nothing.
		return nil
	case unitRemoved:
		return nil
	}
	if paths.Unified != "" && cgroupv2.Dir(paths.Unified).Write("cgroup.kill", "1") == nil {
		// The kernel killed every process of the subtree and keeps it
		// from forking: nothing is left for systemd to signal.
		return nil
	}
	handled, err := paths.kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	dbusErr := s.b.bus.call(ctx, func(c *sddbus.Conn) error {
		return c.KillUnitWithTarget(ctx, s.unit, sddbus.All, int32(unix.SIGKILL))
	})
	if dbusErr != nil && !noSuchUnit(dbusErr) {
		s.b.opts.Log.Debug().Err(dbusErr).Str("unit", s.unit).Msg("KillUnit (best effort) failed")
	} else {
		dbusErr = nil
	}
	switch {
	case handled && err == nil:
		return nil
	case !handled && dbusErr == nil:
		return nil
	default:
		return fmt.Errorf("kill scope %s: %w", s.unit, errors.Join(err, dbusErr))
	}
}

// Empty reads cgroup.events (cgroup2) or cgroup.procs (legacy). A pruned
// cgroup is empty. When it first sees the scope empty it keeps a last Stats
// reading, since systemd removes the cgroup right after.
func (s *systemdScope) Empty() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case unitPrepared, unitStarting, unitFailed, unitRemoved:
		// Nothing is in the unit (yet, or any longer); a held child is
		// not the command.
		return true, nil
	}
	empty, err := s.paths.empty()
	if err != nil {
		return false, fmt.Errorf("scope %s: %w", s.unit, err)
	}
	if empty {
		s.readStatsOfLocked(true)
	}
	return empty, nil
}

var _ ExitStatser = (*systemdScope)(nil)

// ExitStats is Empty and Stats in one reading of the counters, emptiness
// first (an empty scope's counters are final, and are kept for when
// systemd prunes the cgroup): at the main process's exit the reactor needs
// both, and Empty of a scope first seen empty would read every counter
// again, on the loop (on a hybrid host about nine files). Where the
// emptiness cannot be read, empty is false (the caller asks Empty again,
// which says why).
func (s *systemdScope) ExitStats() (Stats, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	empty := true // as Empty: nothing is in a unit not running
	if s.state == unitRunning {
		var err error
		if empty, err = s.paths.empty(); err != nil {
			empty = false
		}
	}
	s.readStatsOfLocked(empty)
	return s.last, empty, nil
}

// Stats reads the scope's cgroup files. Once systemd has pruned the cgroup
// (the unit stops when it empties), the last reading is returned, with
// Tasks 0.
func (s *systemdScope) Stats() (Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked(), nil
}

func (s *systemdScope) statsLocked() Stats {
	s.readStatsLocked()
	return s.last
}

// Remove ends with the unit unloaded and its cgroups gone. Idempotent; call
// it once the scope is empty. It does not hold the scope's lock while
// waiting for systemd.
//
// systemd stops a scope by itself once its cgroup empties: it removes the
// cgroup, then unloads the unit (CollectMode). So for an empty scope Remove
// waits for that (selfStopped) and only checks that the unit is unloaded;
// it asks for a stop job when the scope is not empty, when systemd has not
// stopped it within selfStopWait, or when the unit is still loaded.
// (Measured in the harness systemd: the cgroup is gone 0-7 ms after the
// scope empties, while a StopUnit of the unloaded unit took 10-25 ms.)
func (s *systemdScope) Remove() error {
	s.mu.Lock()
	switch s.state {
	case unitRemoved:
		s.mu.Unlock()
		return nil
	case unitPrepared:
		s.state = unitRemoved
		s.mu.Unlock()
		return nil
	case unitStarting:
		s.mu.Unlock()
		return fmt.Errorf("remove scope %s: Started is still running", s.unit)
	}
	s.mu.Unlock()

	// Running or failed (a failed start may have left the unit loaded).
	ctx, cancel := context.WithTimeout(context.Background(), s.b.bus.jobTimeout)
	defer cancel()
	if !s.selfStopped(ctx) {
		if err := s.b.bus.stopAndWait(ctx, s.unit); err != nil {
			return fmt.Errorf("remove scope %s: %w", s.unit, err)
		}
	}
	s.b.bus.removals.forget(s.unit)
	s.mu.Lock()
	s.statsLocked() // final reading: from the cache, the cgroup is gone now
	s.mu.Unlock()
	s.dropWatch(unitRemoved)
	return nil
}

// dropWatch moves s to st (failed or removed) and stops its watcher, in the
// same critical section: a registration still under way (SetLimits' OOM
// eventfd) sees the state and closes its fd itself (watchOOM); one that
// got in before is closed by the watcher's stop.
func (s *systemdScope) dropWatch(st unitState) {
	s.mu.Lock()
	s.state = st
	w := s.watch
	s.watch, s.oom = nil, nil // s.oom's fd closes with the watcher
	s.mu.Unlock()
	w.stop() // not under mu: its goroutines take it
}

// selfStopWait bounds how long Remove waits for systemd to stop an empty
// scope by itself before it asks for a stop job.
const selfStopWait = 500 * time.Millisecond

// removalWait bounds how long Remove waits for the UnitRemoved signal of an
// empty scope before it looks for itself (the signal may be lost: systemd
// re-executing, the connection re-dialled). systemd stops an empty scope
// within a few milliseconds on a quiet host; under load it may take
// longer, which only costs the look (the wait for the cgroup to go and one
// ListUnitsByPatterns).
const removalWait = 100 * time.Millisecond

// notifyHold covers the kernel's rate limit on cgroup file notifications
// (cgroup_file_notify: 10 ms at HZ=1000, 12 ms at HZ=250), with a margin.
const notifyHold = 15 * time.Millisecond

// selfStopped reports whether systemd stopped and unloaded the running,
// empty scope by itself: the unit is no longer loaded and its cgroup is
// gone. Where the backend sees systemd's UnitRemoved signal, that signal
// says the unit is unloaded (systemd removes the cgroup as the unit stops,
// before it frees the unit) and one stat confirms the cgroup went. Without
// the signal, or when it does not come within removalWait, it waits for the
// cgroup to go within selfStopWait (the kernel signals no inotify event
// when a cgroup directory is removed, so this polls a stat of it, starting
// at 100 µs) and asks systemd whether the unit is still loaded
// (ListUnitsByPatterns). False means Remove must stop the unit itself.
func (s *systemdScope) selfStopped(ctx context.Context) bool {
	s.mu.Lock()
	state, paths, runningAt, removed := s.state, s.paths, s.runningAt, s.removed
	s.mu.Unlock()
	if state != unitRunning || paths.Unified == "" {
		return false
	}
	if empty, err := paths.empty(); err != nil || !empty {
		return false
	}
	if time.Since(runningAt) < notifyHold {
		// systemd learns of the emptiness from cgroup.events, and the
		// kernel holds that notification until notifyHold after the
		// previous one ("populated 1", when systemd moved the child in):
		// ask for the stop rather than wait for it (measured without:
		// 10-14 ms from empty to cgroup gone for an inline scope, 0-5 ms
		// for a pooled one). No job wait: the unit going is waited for
		// below, as for a scope systemd stopped itself.
		s.stopUnit(ctx, zerolog.DebugLevel, "stop empty scope")
	}
	if removed == nil {
		s.b.opts.Log.Debug().Str("unit", s.unit).Msg("UnitRemoved not seen on this connection; looking for the unit")
	} else {
		t := time.NewTimer(removalWait)
		select {
		case <-removed:
			t.Stop()
			if !paths.exists() {
				return true
			}
			s.b.opts.Log.Debug().Str("unit", s.unit).Msg("unit removed but its cgroup is still there; looking for the unit")
		case <-t.C:
			s.b.opts.Log.Debug().Str("unit", s.unit).Msg("no UnitRemoved signal for the empty scope; looking for the unit")
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
	deadline := time.Now().Add(selfStopWait)
	for wait := 100 * time.Microsecond; paths.exists(); wait = min(2*wait, time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(wait)
	}
	loaded, err := s.b.bus.unitLoaded(ctx, s.unit)
	if err != nil {
		s.b.opts.Log.Debug().Err(err).Str("unit", s.unit).Msg("cannot tell whether the stopped scope is unloaded; stopping it")
		return false
	}
	return !loaded
}

var _ Limiter = (*systemdScope)(nil)

// SetLimits changes the running unit's TasksMax and MemoryMax (the pool's
// scopes are created before the request is known). Zero fields lift the
// limit.
func (s *systemdScope) SetLimits(ctx context.Context, l Limits) error {
	tasks, mem, swap := uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64)
	if l.TasksMax > 0 {
		tasks = uint64(max(l.TasksMax, minTasksMax))
	}
	if l.MemoryBytes > 0 {
		mem, swap = uint64(l.MemoryBytes), 0
	}
	props := []sddbus.Property{
		{Name: "TasksMax", Value: dbus.MakeVariant(tasks)},
		{Name: "MemoryMax", Value: dbus.MakeVariant(mem)},
		{Name: "MemorySwapMax", Value: dbus.MakeVariant(swap)},
	}
	ctx, cancel := s.b.bus.bound(ctx)
	defer cancel()
	err := s.b.bus.call(ctx, func(c *sddbus.Conn) error {
		return c.SetUnitPropertiesContext(ctx, s.unit, true, props...)
	})
	if err != nil {
		return fmt.Errorf("set limits of %s: %w", s.unit, err)
	}
	if w, paths, needOOM := s.limitsSet(l); needOOM {
		// Remove may run meanwhile: watchOOM then closes the eventfd.
		s.watchOOM(w, paths)
	}
	return nil
}

// limitsSet records the limits systemd applied and says whether the scope
// now needs the v1 OOM notification that Started only registers for scopes
// created with a memory limit (the pool's are not), and for which watcher.
func (s *systemdScope) limitsSet(l Limits) (w *cgroupWatch, paths unitCgroups, needOOM bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits.TasksMax, s.limits.MemoryBytes = l.TasksMax, l.MemoryBytes
	needOOM = l.MemoryBytes > 0 && s.oom == nil && s.watch != nil && s.paths.Memory != ""
	return s.watch, s.paths, needOOM
}
