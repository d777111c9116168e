package scope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
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
	hier, err := readHierarchies()
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
	b := &systemdBackend{opts: opts, hier: hier, controllers: hier.controllers(),
		bus: newSystemdBus(opts.Dial, opts.JobTimeout, opts.Log)}
	if _, err := b.bus.get(ctx); err != nil {
		b.bus.close()
		return nil, fmt.Errorf("systemd backend: connect: %w", err)
	}
	if hier.Unified.Point != "" {
		// Without it the scopes' counters are read only when asked, which
		// may be after systemd pruned the cgroup (see cgroupWatch).
		b.watcher, b.watcherErr = cgroupv2.NewWatcher()
	}
	return b, nil
}

// systemdBackend is immutable after NewSystemd except for its bus, which is
// safe for concurrent use; so is the backend.
type systemdBackend struct {
	opts SystemdOptions
	hier hierarchies
	// controllers are the limit controllers systemd can use on this host.
	controllers limitControllers
	bus         *systemdBus
	// watcher watches every scope's unified cgroup.events and
	// memory.events (nil without a unified hierarchy, or when it could not
	// start: watcherErr).
	watcher    *cgroupv2.Watcher
	watcherErr error
}

var (
	_ Backend         = (*systemdBackend)(nil)
	_ LeftoverCleaner = (*systemdBackend)(nil)
)

func (b *systemdBackend) Name() string { return "systemd" }

// Placement is PlaceHeld: the unit is created around the pid in Started,
// so the caller holds the child until then.
func (b *systemdBackend) Placement() Placement { return PlaceHeld }

// Close closes the D-Bus connection. Scopes already created keep running
// (their processes are killed through the cgroup still); later D-Bus calls
// fail.
func (b *systemdBackend) Close() error {
	b.bus.close()
	if b.watcher != nil {
		if err := b.watcher.Close(); err != nil {
			return fmt.Errorf("systemd backend: close cgroup watcher: %w", err)
		}
	}
	return nil
}

// unitName returns the scope unit name for an execution id, refusing ids
// that systemd would not accept in a unit name.
func unitName(id string) (string, error) {
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

// unitDescription is the unit's Description: "corral <id>: <argv>", cut to
// keep `systemctl status` readable.
func unitDescription(id string, argv []string) string {
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
	unit, err := unitName(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("prepare systemd scope: %w", err)
	}
	return &systemdScope{
		b:      b,
		id:     spec.ID,
		unit:   unit,
		desc:   unitDescription(spec.ID, spec.Argv),
		limits: spec.Limits,
		// Until Started learns the unit's ControlGroup, assume systemd's
		// usual place for it.
		paths: b.hier.cgroupsOf(slicePath(b.opts.Slice) + "/" + unit),
		last:  unknownStats(),
	}, nil
}

// CleanLeftovers kills and stops every corral-*.scope unit still loaded,
// left by a previous run of the daemon, and returns their names. Call it at
// start-up, before any Prepare.
func (b *systemdBackend) CleanLeftovers(ctx context.Context) ([]string, error) {
	return b.CleanLeftoversExcept(ctx, nil)
}

// CleanLeftoversExcept is CleanLeftovers, but leaves the units keep accepts
// (by unit name), which hold executions the daemon adopts, and units in
// another slice than the backend's (another corrald's).
func (b *systemdBackend) CleanLeftoversExcept(ctx context.Context, keep func(name string) bool) ([]string, error) {
	var units []sddbus.UnitStatus
	err := b.bus.call(ctx, func(c *sddbus.Conn) error {
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
		if keep != nil && keep(u.Name) {
			continue
		}
		var slice string
		_ = b.bus.call(ctx, func(c *sddbus.Conn) error {
			p, err := c.GetUnitTypePropertyContext(ctx, u.Name, "Scope", "Slice")
			if err == nil {
				slice, _ = p.Value.Value().(string)
			}
			return err
		})
		if slice != "" && slice != b.opts.Slice {
			continue // another corrald's
		}
		err := b.bus.call(ctx, func(c *sddbus.Conn) error {
			return c.KillUnitWithTarget(ctx, u.Name, sddbus.All, int32(unix.SIGKILL))
		})
		if err != nil && !noSuchUnit(err) {
			errs = append(errs, fmt.Errorf("kill %s: %w", u.Name, err))
		}
		if err := b.bus.stopAndWait(ctx, u.Name); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", u.Name, err))
			continue
		}
		names = append(names, u.Name)
	}
	return names, errors.Join(errs...)
}

// slicePath is where systemd places slice's cgroup: a dash in a slice name
// nests it in the slice named by what precedes the dash
// ("corral-pool4.slice" is /corral.slice/corral-pool4.slice), the root
// slice "-.slice" is the root. A name systemd would not accept gives the
// flat guess; Started asks systemd when a guessed path does not exist.
func slicePath(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	if name == "-" {
		return ""
	}
	var path, prefix string
	for i, part := range strings.Split(name, "-") {
		if part == "" {
			return "/" + slice
		}
		if i > 0 {
			prefix += "-"
		}
		prefix += part
		path += "/" + prefix + ".slice"
	}
	return path
}
