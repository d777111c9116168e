package scope

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// NewSystemd connects to systemd and returns the systemd backend: one
// transient unit corral-<id>.scope per execution, in SystemdOptions.Slice,
// created over D-Bus while the child is held in the shim. It returns an
// error wrapping ErrUnsupported when systemd is not the running service
// manager. ctx bounds the first connection only.
//
// The backend implements LeftoverCleaner (CleanLeftovers). Its scopes
// implement LimitReporter.
func NewSystemd(ctx context.Context, opts SystemdOptions) (Backend, error) {
	// sd_booted(3): systemd creates this directory when it runs as the
	// service manager.
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return nil, fmt.Errorf("systemd backend: systemd is not the service manager: %w", ErrUnsupported)
	}
	layout, err := sdReadLayout()
	if err != nil {
		return nil, fmt.Errorf("systemd backend: %w: %w", err, ErrUnsupported)
	}
	if opts.Slice == "" {
		opts.Slice = DefaultSlice
	}
	if !strings.HasSuffix(opts.Slice, ".slice") {
		return nil, fmt.Errorf("systemd backend: slice %q does not end in .slice", opts.Slice)
	}
	if opts.JobTimeout <= 0 {
		opts.JobTimeout = 30 * time.Second
	}
	if opts.Dial == nil {
		opts.Dial = sdDefaultDial
	}
	life, cancel := context.WithCancel(context.Background())
	b := &systemdBackend{opts: opts, layout: layout, life: life, cancel: cancel}
	if _, err := b.getConn(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("systemd backend: connect: %w", err)
	}
	return b, nil
}

// sdDefaultDial: the private socket needs no dbus-daemon but only root may
// use it; everyone else goes through the system bus.
func sdDefaultDial(ctx context.Context) (*sddbus.Conn, error) {
	if os.Geteuid() != 0 {
		return sddbus.NewSystemConnectionContext(ctx)
	}
	c, err := sddbus.NewSystemdConnectionContext(ctx)
	if err == nil {
		return c, nil
	}
	c, err2 := sddbus.NewSystemConnectionContext(ctx)
	if err2 == nil {
		return c, nil
	}
	return nil, errors.Join(err, err2)
}

// systemdBackend is safe for concurrent use; mu guards conn only.
type systemdBackend struct {
	opts   SystemdOptions
	layout sdLayout
	// life outlives every call: godbus closes a connection when the context
	// it was dialled with ends, so the connection is dialled with life, and
	// callers' contexts only bound the wait for it.
	life   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conn   *sddbus.Conn // nil until dialled, and after it broke
	closed bool
}

var (
	_ Backend         = (*systemdBackend)(nil)
	_ LeftoverCleaner = (*systemdBackend)(nil)
)

var errBackendClosed = errors.New("systemd backend closed")

func (b *systemdBackend) Name() string { return "systemd" }

// Placement is PlaceHeld: the unit is created around the pid in Started,
// so the caller holds the child until then.
func (b *systemdBackend) Placement() Placement { return PlaceHeld }

// Close closes the D-Bus connection. Scopes already created keep running
// (their processes are killed through the cgroup still); later D-Bus calls
// fail.
func (b *systemdBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.cancel()
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
	return nil
}

// getConn returns the live connection, dialling a new one if there is none
// or the old one broke. This is the one place that reconnects.
func (b *systemdBackend) getConn(ctx context.Context) (*sddbus.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errBackendClosed
	}
	if b.conn != nil {
		if b.conn.Connected() {
			return b.conn, nil
		}
		b.conn.Close()
		b.conn = nil
		b.opts.Log.Warn().Msg("systemd D-Bus connection lost; reconnecting")
	}
	c, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	b.conn = c
	return c, nil
}

// dial runs opts.Dial with the backend's lifetime context, waiting at most
// until ctx ends; a connection that arrives later is closed.
func (b *systemdBackend) dial(ctx context.Context) (*sddbus.Conn, error) {
	type result struct {
		c   *sddbus.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := b.opts.Dial(b.life)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("dial systemd: %w", r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("dial systemd: %w", ctx.Err())
	}
}

// call runs fn on the connection. When fn fails because the connection is
// closed or broke, it reconnects and runs fn once more (the idea of
// opencontainers/cgroups' retryOnDisconnect).
func (b *systemdBackend) call(ctx context.Context, fn func(*sddbus.Conn) error) error {
	for attempt := 0; ; attempt++ {
		c, err := b.getConn(ctx)
		if err != nil {
			return err
		}
		err = fn(c)
		if err == nil || attempt > 0 || !sdDisconnected(c, err) {
			return err
		}
		b.mu.Lock()
		if b.conn == c {
			c.Close()
			b.conn = nil
		}
		b.mu.Unlock()
		b.opts.Log.Warn().Err(err).Msg("systemd D-Bus call failed on a closed connection; reconnecting")
	}
}

// sdDisconnected reports whether err means the connection is gone, rather
// than systemd answering with an error.
func sdDisconnected(c *sddbus.Conn, err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return false
	}
	return errors.Is(err, dbus.ErrClosed) || !c.Connected()
}

// sdNoSuchUnit reports whether systemd answered that the unit is not loaded.
func sdNoSuchUnit(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.systemd1.NoSuchUnit"
	}
	var dp *dbus.Error
	return errors.As(err, &dp) && dp.Name == "org.freedesktop.systemd1.NoSuchUnit"
}

// bound limits ctx to JobTimeout.
func (b *systemdBackend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.opts.JobTimeout)
}

// runJob starts a job with start and waits for its result. go-systemd
// delivers the result on ch once; the channel is buffered because an unread
// one would wedge the connection's signal dispatch.
func (b *systemdBackend) runJob(ctx context.Context, start func(c *sddbus.Conn, ch chan<- string) error) (string, error) {
	ch := make(chan string, 1)
	if err := b.call(ctx, func(c *sddbus.Conn) error { return start(c, ch) }); err != nil {
		return "", err
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return "", fmt.Errorf("wait for job: %w", ctx.Err())
	}
}

// sdUnitName returns the scope unit name for an execution id, refusing ids
// that systemd would not accept in a unit name.
func sdUnitName(id string) (string, error) {
	if id == "" {
		return "", errors.New("empty execution id")
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			r == '-' || r == '_' || r == '.' || r == ':'
		if !ok {
			return "", fmt.Errorf("execution id %q: %q is not allowed in a unit name", id, r)
		}
	}
	name := ScopePrefix + id + ScopeSuffix
	if len(name) > 255 {
		return "", fmt.Errorf("execution id %q: unit name longer than 255 bytes", id)
	}
	return name, nil
}

// sdDescription is the unit's Description: "corral <id>: <argv>", cut to
// keep `systemctl status` readable.
func sdDescription(id string, argv []string) string {
	const max = 200
	d := "corral " + id + ": " + strings.Join(argv, " ")
	if len(d) <= max {
		return d
	}
	cut := max
	for cut > 0 && d[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return d[:cut] + "..."
}

// Prepare readies the scope. It starts nothing and talks to no one: the
// unit is created in Started, around the pid of a child its caller holds
// (PlaceHeld).
func (b *systemdBackend) Prepare(_ context.Context, spec Spec) (Scope, error) {
	unit, err := sdUnitName(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("prepare systemd scope: %w", err)
	}
	return &systemdScope{
		b:      b,
		id:     spec.ID,
		unit:   unit,
		desc:   sdDescription(spec.ID, spec.Argv),
		limits: spec.Limits,
		// Until Started learns the unit's ControlGroup, assume systemd's
		// usual place for it.
		paths: b.layout.paths("/" + b.opts.Slice + "/" + unit),
		last:  unknownStats(),
	}, nil
}

// sdState is where a systemd scope is in its life. Transitions:
// prepared -> starting (Started called) | removed (Remove before Started);
// starting -> running (Started succeeded) | failed (Started failed);
// running -> removed; failed -> removed. removed is terminal.
type sdState int

const (
	sdPrepared sdState = iota // no unit yet
	sdStarting                // Started is talking to systemd
	sdRunning                 // unit created around the child
	sdFailed                  // Started failed; the caller aborts the held child
	sdRemoved                 // unit gone (Remove succeeded)
)

func (st sdState) String() string {
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
	state  sdState
	killed bool // Kill was called: Started must fail, so the child is never released
	paths  sdPaths
	last   Stats    // the last Stats, merged; kept for when the cgroup is pruned
	oom    *sdOOM   // v1 OOM eventfd accounting (memory limit on v1 only)
	watch  *sdWatch // set by Started, stopped by Remove or a failed Started
}

var (
	_ Scope         = (*systemdScope)(nil)
	_ LimitReporter = (*systemdScope)(nil)
)

func (s *systemdScope) Name() string { return s.unit }

// sdMinTasks is the lowest TasksMax the backend sets: room for the held
// shim's runtime threads (measured: 4 to 5), which count until it execs.
const sdMinTasks = 8

// Unenforced: systemd enforces MemoryMax and TasksMax itself (TasksMax not
// below sdMinTasks, so a smaller one is reported); CPUMS is enforced by the
// reactor and needs CPU time in Stats, which every layout provides (cgroup2
// cpu.stat or v1 cpuacct).
func (s *systemdScope) Unenforced() Limits {
	var l Limits
	if s.limits.TasksMax > 0 && s.limits.TasksMax < sdMinTasks {
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
		// below sdMinTasks: the held shim is a Go program whose runtime
		// threads are moved into the scope with it (and may still be
		// starting), and a runtime that cannot start a thread aborts.
		props = append(props, sddbus.Property{Name: "TasksMax", Value: dbus.MakeVariant(uint64(max(s.limits.TasksMax, sdMinTasks)))})
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
	if s.state != sdPrepared {
		st := s.state
		s.mu.Unlock()
		return fmt.Errorf("start scope %s: scope is %s", s.unit, st)
	}
	if s.killed {
		s.state = sdFailed
		s.mu.Unlock()
		return fmt.Errorf("start scope %s: killed before it started", s.unit)
	}
	s.state = sdStarting
	s.mu.Unlock()

	fail := func(err error) error {
		s.mu.Lock()
		s.state = sdFailed
		w := s.watch
		s.watch, s.oom = nil, nil // s.oom's fd closes with the watcher
		s.mu.Unlock()
		w.stop() // not under mu: its goroutines take it
		return fmt.Errorf("start scope %s: %w", s.unit, err)
	}
	ctx, cancel := s.b.bound(ctx)
	defer cancel()

	props := s.properties(pid)
	res, err := s.b.runJob(ctx, func(c *sddbus.Conn, ch chan<- string) error {
		_, err := c.StartTransientUnitContext(ctx, s.unit, "fail", props, ch)
		return err
	})
	if err == nil && res != "done" {
		err = fmt.Errorf("start job %s", res)
	}
	if err != nil {
		s.stopBestEffort()
		return fail(err)
	}
	// The unit's real cgroup; the guess from Prepare stays if systemd
	// cannot tell.
	var cg string
	err = s.b.call(ctx, func(c *sddbus.Conn) error {
		p, err := c.GetUnitTypePropertyContext(ctx, s.unit, "Scope", "ControlGroup")
		if err != nil {
			return err
		}
		cg, _ = p.Value.Value().(string)
		return nil
	})
	s.mu.Lock()
	if err == nil && cg != "" {
		s.paths = s.b.layout.paths(cg)
	} else {
		s.b.opts.Log.Warn().Err(err).Str("unit", s.unit).Msg("cannot read the scope's ControlGroup; using the default path")
	}
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
	s.state = sdRunning
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
	err := s.b.call(ctx, func(c *sddbus.Conn) error {
		_, err := c.StopUnitContext(ctx, s.unit, "replace", nil)
		return err
	})
	if err != nil && !sdNoSuchUnit(err) {
		s.b.opts.Log.Warn().Err(err).Str("unit", s.unit).Msg("stop scope")
	}
}

func (s *systemdScope) snapshot() (sdState, sdPaths) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.paths
}

// Signal sends sig to every process of the scope through systemd
// (KillUnit, who=all), or through the cgroup when D-Bus is unusable.
func (s *systemdScope) Signal(sig unix.Signal) error {
	state, paths := s.snapshot()
	if state != sdRunning {
		return fmt.Errorf("signal scope %s: scope is %s", s.unit, state)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.b.call(ctx, func(c *sddbus.Conn) error {
		return c.KillUnitWithTarget(ctx, s.unit, sddbus.All, int32(sig))
	})
	if err == nil || sdNoSuchUnit(err) {
		return nil // NoSuchUnit: the scope emptied and was unloaded
	}
	s.b.opts.Log.Warn().Err(err).Str("unit", s.unit).Msg("KillUnit failed; signalling through the cgroup")
	if dir := paths.procsDir(); dir != "" && sdExists(dir) {
		if err2 := sdSignalTree(dir, sig); err2 != nil {
			return fmt.Errorf("signal scope %s: %w", s.unit, errors.Join(err, err2))
		}
	}
	return nil
}

// Kill SIGKILLs every process of the scope through its cgroup (cgroup.kill
// where the kernel has it), which needs no D-Bus; then it asks systemd too,
// best effort. Before or during Started it aborts the held child instead.
func (s *systemdScope) Kill() error {
	s.mu.Lock()
	s.killed = true
	state, paths := s.state, s.paths
	s.mu.Unlock()
	switch state {
	case sdPrepared, sdStarting, sdFailed:
		// No unit holds the child yet: Started sees killed and fails, or
		// already failed, and the caller aborts its hold; the child runs
		// nothing.
		return nil
	case sdRemoved:
		return nil
	}
	handled, err := paths.kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	dbusErr := s.b.call(ctx, func(c *sddbus.Conn) error {
		return c.KillUnitWithTarget(ctx, s.unit, sddbus.All, int32(unix.SIGKILL))
	})
	if dbusErr != nil && !sdNoSuchUnit(dbusErr) {
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
	case sdPrepared, sdStarting, sdFailed, sdRemoved:
		// Nothing is in the unit (yet, or any longer); a held child is
		// not the command.
		return true, nil
	}
	empty, err := s.paths.empty()
	if err != nil {
		return false, fmt.Errorf("scope %s: %w", s.unit, err)
	}
	if empty {
		s.statsLocked()
	}
	return empty, nil
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

// Remove stops the unit if it is still loaded and waits until systemd has
// unloaded it (or it is inactive), which is when its cgroups are gone.
// Idempotent; call it once the scope is empty. It does not hold the scope's
// lock while waiting for systemd.
func (s *systemdScope) Remove() error {
	s.mu.Lock()
	switch s.state {
	case sdRemoved:
		s.mu.Unlock()
		return nil
	case sdPrepared:
		s.state = sdRemoved
		s.mu.Unlock()
		return nil
	case sdStarting:
		s.mu.Unlock()
		return fmt.Errorf("remove scope %s: Started is still running", s.unit)
	}
	s.mu.Unlock()

	// Running or failed (a failed start may have left the unit loaded).
	ctx, cancel := context.WithTimeout(context.Background(), s.b.opts.JobTimeout)
	defer cancel()
	if err := s.b.stopAndWait(ctx, s.unit); err != nil {
		return fmt.Errorf("remove scope %s: %w", s.unit, err)
	}
	s.mu.Lock()
	s.statsLocked() // final reading: from the cache, the cgroup is gone now
	s.state = sdRemoved
	w := s.watch
	s.watch, s.oom = nil, nil // s.oom's fd closes with the watcher
	s.mu.Unlock()
	w.stop()
	return nil
}

// stopAndWait stops unit (if loaded) and waits until it is unloaded or
// inactive. Every unit corral makes has CollectMode inactive-or-failed, so
// a stop job that ends "done" is the end; other results (canceled by a
// newer job, timeout) are followed by polling the unit's state.
func (b *systemdBackend) stopAndWait(ctx context.Context, unit string) error {
	res, err := b.runJob(ctx, func(c *sddbus.Conn, ch chan<- string) error {
		_, err := c.StopUnitContext(ctx, unit, "replace", ch)
		return err
	})
	switch {
	case sdNoSuchUnit(err):
		return nil // not loaded: already gone
	case err != nil:
		return fmt.Errorf("stop: %w", err)
	case res == "done":
		// The unit reached inactive or failed, and CollectMode
		// inactive-or-failed unloads it in either: its cgroups are gone.
		// Asking for its state would cost two more round trips.
		return nil
	}
	b.opts.Log.Debug().Str("unit", unit).Str("result", res).Msg("stop job did not finish as done")
	for {
		gone, err := b.unitGone(ctx, unit)
		if err != nil {
			return err
		}
		if gone {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for unit to go: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unitGone reports whether unit is unloaded or inactive. A failed unit is
// reset so that it is unloaded.
func (b *systemdBackend) unitGone(ctx context.Context, unit string) (bool, error) {
	var load, active string
	err := b.call(ctx, func(c *sddbus.Conn) error {
		p, err := c.GetUnitPropertyContext(ctx, unit, "LoadState")
		if err != nil {
			return err
		}
		load, _ = p.Value.Value().(string)
		p, err = c.GetUnitPropertyContext(ctx, unit, "ActiveState")
		if err != nil {
			return err
		}
		active, _ = p.Value.Value().(string)
		return nil
	})
	if sdNoSuchUnit(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read state: %w", err)
	}
	switch {
	case load == "not-found" || active == "inactive":
		return true, nil
	case active == "failed":
		err := b.call(ctx, func(c *sddbus.Conn) error { return c.ResetFailedUnitContext(ctx, unit) })
		if err != nil && !sdNoSuchUnit(err) {
			return false, fmt.Errorf("reset failed: %w", err)
		}
	}
	return false, nil
}

// CleanLeftovers kills and stops every corral-*.scope unit still loaded,
// left by a previous run of the daemon, and returns their names. Call it at
// start-up, before any Prepare.
func (b *systemdBackend) CleanLeftovers(ctx context.Context) ([]string, error) {
	var units []sddbus.UnitStatus
	err := b.call(ctx, func(c *sddbus.Conn) error {
		var err error
		units, err = c.ListUnitsByPatternsContext(ctx, nil, []string{ScopePrefix + "*" + ScopeSuffix})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list leftover scopes: %w", err)
	}
	var names []string
	var errs []error
	for _, u := range units {
		err := b.call(ctx, func(c *sddbus.Conn) error {
			return c.KillUnitWithTarget(ctx, u.Name, sddbus.All, int32(unix.SIGKILL))
		})
		if err != nil && !sdNoSuchUnit(err) {
			errs = append(errs, fmt.Errorf("kill %s: %w", u.Name, err))
		}
		if err := b.stopAndWait(ctx, u.Name); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", u.Name, err))
			continue
		}
		names = append(names, u.Name)
	}
	return names, errors.Join(errs...)
}

var _ Limiter = (*systemdScope)(nil)

// SetLimits changes the running unit's TasksMax and MemoryMax (the pool's
// scopes are created before the request is known). Zero fields lift the
// limit.
func (s *systemdScope) SetLimits(ctx context.Context, l Limits) error {
	tasks, mem, swap := uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(math.MaxUint64)
	if l.TasksMax > 0 {
		tasks = uint64(max(l.TasksMax, sdMinTasks))
	}
	if l.MemoryBytes > 0 {
		mem, swap = uint64(l.MemoryBytes), 0
	}
	props := []sddbus.Property{
		{Name: "TasksMax", Value: dbus.MakeVariant(tasks)},
		{Name: "MemoryMax", Value: dbus.MakeVariant(mem)},
		{Name: "MemorySwapMax", Value: dbus.MakeVariant(swap)},
	}
	ctx, cancel := s.b.bound(ctx)
	defer cancel()
	err := s.b.call(ctx, func(c *sddbus.Conn) error {
		return c.SetUnitPropertiesContext(ctx, s.unit, true, props...)
	})
	if err != nil {
		return fmt.Errorf("set limits of %s: %w", s.unit, err)
	}
	s.mu.Lock()
	s.limits.TasksMax, s.limits.MemoryBytes = l.TasksMax, l.MemoryBytes
	// A memory limit set now needs the v1 OOM notification that Started
	// only registers for scopes created with one (the pool's are not).
	needOOM := l.MemoryBytes > 0 && s.oom == nil && s.watch != nil && s.paths.Memory != ""
	w, paths := s.watch, s.paths
	s.mu.Unlock()
	if needOOM {
		s.watchOOM(w, paths)
	}
	return nil
}
