package scope

import (
	"testing"

	"github.com/godbus/dbus/v5"
)

// The tee reports UnitRemoved to the scope watching that unit, and hands
// every signal on to go-systemd's channel.
func TestRemovalTee(t *testing.T) {
	var r removals
	r.live.Store(true)
	tee := &removalTee{r: &r, inner: dbus.NewSequentialSignalHandler()}
	out := make(chan *dbus.Signal, 4)
	tee.AddSignal(out)
	defer tee.Terminate()

	a, b := r.watch("corral-a.scope"), r.watch("corral-b.scope")
	removed := func(unit string) *dbus.Signal {
		return &dbus.Signal{Name: "org.freedesktop.systemd1.Manager.UnitRemoved", Body: []any{unit, dbus.ObjectPath("/org/freedesktop/systemd1/unit/x")}}
	}
	tee.DeliverSignal("org.freedesktop.systemd1.Manager", "UnitRemoved", removed("corral-a.scope"))
	select {
	case <-a:
	default:
		t.Fatal("corral-a.scope's watch not closed by its UnitRemoved")
	}
	select {
	case <-b:
		t.Fatal("corral-b.scope's watch closed by another unit's UnitRemoved")
	default:
	}
	if sig := <-out; sig.Name != "org.freedesktop.systemd1.Manager.UnitRemoved" {
		t.Errorf("signal passed on: %q", sig.Name)
	}
	// A unit forgotten (Remove done) is no longer waited for; a removal of
	// it is ignored.
	r.forget("corral-b.scope")
	tee.DeliverSignal("org.freedesktop.systemd1.Manager", "UnitRemoved", removed("corral-b.scope"))
	if n := len(r.waiting); n != 0 {
		t.Errorf("%d units still watched, want 0", n)
	}
	// Without the signals seen there is nothing to wait for.
	r.live.Store(false)
	if ch := r.watch("corral-c.scope"); ch != nil {
		t.Error("watch returned a channel where the signals are not seen")
	}
}
