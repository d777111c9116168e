package scope

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// Why the backend listens for UnitRemoved: Remove of an empty scope waits
// for systemd to stop and unload it (see selfStopped). Asking systemd
// whether the unit is still loaded costs a D-Bus round trip that systemd
// answers behind the work it is doing; systemd also says so by itself:
// on its private socket it sends every unit signal to every connection,
// UnitRemoved(name, path) among them, the moment the unit is freed. go-systemd
// reads the signals of its second connection and dispatches only
// JobRemoved; the backend's own dial (the default, systemdBus.defaultDial)
// gives that connection a signal handler that sees each signal first
// (removalTee) and passes it on.
//
// On the system bus (a non-root daemon) systemd sends unit signals only to
// subscribers, and subscribing would make it broadcast every unit change on
// the host: there, and with a Dial of the caller's, no removal is seen and
// Remove asks systemd as before. A signal lost (systemd re-executing, the
// connection re-dialled) costs Remove a bounded wait (removalWait) and then
// the same question.

// removals tells a scope when systemd announced its unit unloaded. mu
// guards waiting.
type removals struct {
	// live: the current connection's signals are seen (the backend's own
	// dial reached the private socket).
	live atomic.Bool

	mu      sync.Mutex
	waiting map[string]chan struct{} // unit name -> closed at its UnitRemoved
}

// watch returns a channel closed when systemd announces unit removed, or
// nil where the signals are not seen. Call it before the unit can go (before
// its start job), and forget once done.
func (r *removals) watch(unit string) <-chan struct{} {
	if !r.live.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = map[string]chan struct{}{}
	}
	ch, ok := r.waiting[unit]
	if !ok {
		ch = make(chan struct{})
		r.waiting[unit] = ch
	}
	return ch
}

// forget drops unit's watch.
func (r *removals) forget(unit string) {
	r.mu.Lock()
	delete(r.waiting, unit)
	r.mu.Unlock()
}

// removed is called for each UnitRemoved signal, on godbus's reading
// goroutine: it must not block.
func (r *removals) removed(unit string) {
	r.mu.Lock()
	if ch, ok := r.waiting[unit]; ok {
		close(ch)
		delete(r.waiting, unit)
	}
	r.mu.Unlock()
}

// removalTee is the signal handler of go-systemd's signal connection: it
// reports UnitRemoved to r, then hands every signal to godbus's usual
// handler, which delivers them to go-systemd.
type removalTee struct {
	r     *removals
	inner dbus.SignalHandler
}

func (t *removalTee) DeliverSignal(iface, name string, sig *dbus.Signal) {
	if sig.Name == "org.freedesktop.systemd1.Manager.UnitRemoved" && len(sig.Body) > 0 {
		if unit, ok := sig.Body[0].(string); ok {
			t.r.removed(unit)
		}
	}
	t.inner.DeliverSignal(iface, name, sig)
}

func (t *removalTee) AddSignal(ch chan<- *dbus.Signal) {
	if reg, ok := t.inner.(dbus.SignalRegistrar); ok {
		reg.AddSignal(ch)
	}
}

func (t *removalTee) RemoveSignal(ch chan<- *dbus.Signal) {
	if reg, ok := t.inner.(dbus.SignalRegistrar); ok {
		reg.RemoveSignal(ch)
	}
}

func (t *removalTee) Terminate() {
	if term, ok := t.inner.(dbus.Terminator); ok {
		term.Terminate()
	}
}

// defaultDial is the backend's dial when SystemdOptions has none: as root,
// systemd's private socket (no dbus-daemon needed), its signal connection
// watched for UnitRemoved; otherwise, or when the private socket cannot be
// reached, the system bus.
func (b *systemdBus) defaultDial(ctx context.Context) (*sddbus.Conn, error) {
	if os.Geteuid() != 0 {
		b.removals.live.Store(false)
		return sddbus.NewSystemConnectionContext(ctx)
	}
	n := 0
	c, err := sddbus.NewConnection(func() (*dbus.Conn, error) {
		n++
		opts := []dbus.ConnOption{dbus.WithContext(ctx)}
		if n == 2 { // go-systemd's second connection receives the signals
			opts = append(opts, dbus.WithSignalHandler(&removalTee{r: &b.removals, inner: dbus.NewSequentialSignalHandler()}))
		}
		conn, err := dbus.Dial("unix:path=/run/systemd/private", opts...)
		if err != nil {
			return nil, err
		}
		// As go-systemd does for the private socket: EXTERNAL with the
		// uid, no Hello.
		if err := conn.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	})
	b.removals.live.Store(err == nil)
	if err == nil {
		return c, nil
	}
	c, err2 := sddbus.NewSystemConnectionContext(ctx)
	if err2 == nil {
		return c, nil
	}
	return nil, errors.Join(err, err2)
}
