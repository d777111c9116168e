package scope

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"github.com/rs/zerolog"
)

var errBackendClosed = errors.New("systemd backend closed")

// systemdBus is the systemd backend's D-Bus plumbing: one connection to
// systemd, dialled lazily and re-dialled in one place (get) once it broke;
// every call goes through call, which retries once when the connection
// closed under it; job results arrive on buffered channels (runJob). It
// knows units only by name. Safe for concurrent use; mu guards conn and
// closed.
type systemdBus struct {
	dialFn     func(ctx context.Context) (*sddbus.Conn, error)
	jobTimeout time.Duration
	log        zerolog.Logger
	// life outlives every call: godbus closes a connection when the context
	// it was dialled with ends, so the connection is dialled with life, and
	// callers' contexts only bound the wait for it.
	life   context.Context
	cancel context.CancelFunc

	// removals are the UnitRemoved signals seen, where they are
	// (systemd_removed_linux.go).
	removals removals

	mu     sync.Mutex
	conn   *sddbus.Conn // nil until dialled, and after it broke
	closed bool
}

// newSystemdBus returns the plumbing; a nil dial is the backend's own
// (defaultDial).
func newSystemdBus(dial func(ctx context.Context) (*sddbus.Conn, error), jobTimeout time.Duration, log zerolog.Logger) *systemdBus {
	life, cancel := context.WithCancel(context.Background())
	b := &systemdBus{dialFn: dial, jobTimeout: jobTimeout, log: log, life: life, cancel: cancel}
	if dial == nil {
		b.dialFn = b.defaultDial
	}
	return b
}

// close closes the connection; later calls fail with errBackendClosed.
// Idempotent.
func (b *systemdBus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	b.cancel()
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
}

// get returns the live connection, dialling a new one if there is none
// or the old one broke. This is the one place that reconnects.
func (b *systemdBus) get(ctx context.Context) (*sddbus.Conn, error) {
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
		b.log.Warn().Msg("systemd D-Bus connection lost; reconnecting")
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
func (b *systemdBus) dial(ctx context.Context) (*sddbus.Conn, error) {
	type result struct {
		c   *sddbus.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := b.dialFn(b.life)
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
func (b *systemdBus) call(ctx context.Context, fn func(*sddbus.Conn) error) error {
	for attempt := 0; ; attempt++ {
		c, err := b.get(ctx)
		if err != nil {
			return err
		}
		err = fn(c)
		if err == nil || attempt > 0 || !disconnected(c, err) {
			return err
		}
		b.mu.Lock()
		if b.conn == c {
			c.Close()
			b.conn = nil
		}
		b.mu.Unlock()
		b.log.Warn().Err(err).Msg("systemd D-Bus call failed on a closed connection; reconnecting")
	}
}

// disconnected reports whether err means the connection is gone, rather
// than systemd answering with an error.
func disconnected(c *sddbus.Conn, err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return false
	}
	return errors.Is(err, dbus.ErrClosed) || !c.Connected()
}

// noSuchUnit reports whether systemd answered that the unit is not loaded.
func noSuchUnit(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.systemd1.NoSuchUnit"
	}
	var dp *dbus.Error
	return errors.As(err, &dp) && dp.Name == "org.freedesktop.systemd1.NoSuchUnit"
}

// bound limits ctx to JobTimeout.
func (b *systemdBus) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.jobTimeout)
}

// jobKind says what a job waited for by runJob does, which is what its
// result is inferred from when its completion signal never comes.
type jobKind int

const (
	jobStart jobKind = iota // the unit ends active
	jobStop                 // the unit ends inactive or unloaded
)

// Re-checking a job whose completion signal has not come: first after
// recheckFirst, then at doubling intervals up to recheckMax, and at once
// when the connection the job was started on is gone.
const (
	recheckFirst = 250 * time.Millisecond
	recheckMax   = 2 * time.Second
)

// runJob starts a job on unit with start and waits for its result.
// go-systemd delivers the result on ch once; the channel is buffered
// because an unread one would wedge the connection's signal dispatch.
//
// The JobRemoved signal can be lost: systemd daemon-reexec drops every
// connection (and the jobs go on in the new PID 1, which signals only its
// new subscribers), and a re-exec behind the system bus drops the signals
// sent while it runs. So a job whose result has not come within
// recheckFirst, or whose connection broke, is looked up (recheckJob): once
// systemd no longer has it, its result is inferred from the unit's state.
func (b *systemdBus) runJob(ctx context.Context, unit string, kind jobKind, start func(c *sddbus.Conn, ch chan<- string) (int, error)) (string, error) {
	ch := make(chan string, 1)
	var id int
	var conn *sddbus.Conn
	if err := b.call(ctx, func(c *sddbus.Conn) error {
		var err error
		id, err = start(c, ch)
		conn = c
		return err
	}); err != nil {
		return "", err
	}
	wait := recheckFirst
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// Polls whether the job's connection broke, between re-checks.
	lost := time.NewTicker(20 * time.Millisecond)
	defer lost.Stop()
	for {
		select {
		case res := <-ch:
			return res, nil
		case <-ctx.Done():
			return "", fmt.Errorf("wait for job %d: %w", id, ctx.Err())
		case <-lost.C:
			if conn.Connected() {
				continue
			}
			lost.Stop() // from now on only the timer re-checks
		case <-timer.C:
			wait = min(2*wait, recheckMax)
		}
		res, ok, err := b.recheckJob(ctx, unit, id, kind)
		if err != nil {
			// systemd may be re-executing still: try again later.
			b.log.Debug().Err(err).Str("unit", unit).Int("job", id).Msg("re-check job")
		}
		if ok {
			b.log.Info().Str("unit", unit).Int("job", id).Str("result", res).Msg("job ended without its completion signal; result from the unit's state")
			return res, nil
		}
		timer.Reset(wait)
	}
}

// recheckJob looks up job id of unit. ok is false while systemd still has
// the job (or cannot tell); once the job is gone, res is its result as
// the unit's state shows it: "done" if the unit is where kind wanted it,
// "failed" otherwise. A job id of 0 (go-systemd could not parse the job
// path) cannot be looked up and is waited for by its signal only.
func (b *systemdBus) recheckJob(ctx context.Context, unit string, id int, kind jobKind) (res string, ok bool, err error) {
	if id == 0 {
		return "", false, nil
	}
	// ListUnitsByPatterns looks only through the loaded units (see
	// unitLoaded) and gives the unit's job and state in one call.
	var units []sddbus.UnitStatus
	err = b.call(ctx, func(c *sddbus.Conn) error {
		var err error
		units, err = c.ListUnitsByPatternsContext(ctx, nil, []string{unit})
		return err
	})
	if err != nil {
		return "", false, fmt.Errorf("look up unit: %w", err)
	}
	active := "" // not loaded
	for _, u := range units {
		if u.Name != unit {
			continue
		}
		if u.JobId == uint32(id) {
			return "", false, nil // still queued or running
		}
		active = u.ActiveState
	}
	switch {
	case kind == jobStart && active == "active":
		return "done", true, nil
	case kind == jobStop && (active == "" || active == "inactive"):
		return "done", true, nil
	}
	return "failed", true, nil
}

// unitLoaded reports whether systemd has unit loaded. It asks
// ListUnitsByPatterns, which only looks through the loaded units: a
// property read or a StopUnit of a name systemd does not know makes it
// load the unit first (a search of the unit paths), and StopUnit also
// waits behind every job call in flight on the connection (go-systemd
// holds one lock across a job call, so behind the pool's
// StartTransientUnit).
func (b *systemdBus) unitLoaded(ctx context.Context, unit string) (bool, error) {
	var units []sddbus.UnitStatus
	err := b.call(ctx, func(c *sddbus.Conn) error {
		var err error
		units, err = c.ListUnitsByPatternsContext(ctx, nil, []string{unit})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("look up unit: %w", err)
	}
	for _, u := range units {
		if u.Name == unit {
			return true, nil
		}
	}
	return false, nil
}

// stopAndWait stops unit (if loaded) and waits until it is unloaded or
// inactive. Every unit corral makes has CollectMode inactive-or-failed, so
// a stop job that ends "done" is the end; other results (canceled by a
// newer job, timeout) are followed by polling the unit's state.
func (b *systemdBus) stopAndWait(ctx context.Context, unit string) error {
	res, err := b.runJob(ctx, unit, jobStop, func(c *sddbus.Conn, ch chan<- string) (int, error) {
		return c.StopUnitContext(ctx, unit, "replace", ch)
	})
	switch {
	case noSuchUnit(err):
		return nil // not loaded: already gone
	case err != nil:
		return fmt.Errorf("stop: %w", err)
	case res == "done":
		// The unit reached inactive or failed, and CollectMode
		// inactive-or-failed unloads it in either: its cgroups are gone.
		// Asking for its state would cost two more round trips.
		return nil
	}
	b.log.Debug().Str("unit", unit).Str("result", res).Msg("stop job did not finish as done")
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
func (b *systemdBus) unitGone(ctx context.Context, unit string) (bool, error) {
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
	if noSuchUnit(err) {
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
		if err != nil && !noSuchUnit(err) {
			return false, fmt.Errorf("reset failed: %w", err)
		}
	}
	return false, nil
}
