package systemdscope_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/tests/harness"
)

// dropJobRemoved is a godbus signal handler that loses every JobRemoved
// signal, as a daemon-reexec of PID 1 loses those of the jobs in flight.
type dropJobRemoved struct {
	inner interface {
		dbus.SignalHandler
		dbus.SignalRegistrar
		dbus.Terminator
	}
	dropped atomic.Int32
}

func (h *dropJobRemoved) DeliverSignal(iface, name string, sig *dbus.Signal) {
	if sig.Name == "org.freedesktop.systemd1.Manager.JobRemoved" {
		h.dropped.Add(1)
		return
	}
	h.inner.DeliverSignal(iface, name, sig)
}
func (h *dropJobRemoved) AddSignal(ch chan<- *dbus.Signal)    { h.inner.AddSignal(ch) }
func (h *dropJobRemoved) RemoveSignal(ch chan<- *dbus.Signal) { h.inner.RemoveSignal(ch) }
func (h *dropJobRemoved) Terminate()                          { h.inner.Terminate() }

// A start or stop job whose completion signal never comes must still end
// with its real result (the backend re-checks the unit), not wait out the
// job timeout: the failure drill's daemon-reexec at 64 clients.
func TestJobsCompleteWithoutJobRemovedSignal(t *testing.T) {
	harness.Require(t)
	//lint:ignore SA1019 the test wraps godbus's default handler to drop JobRemoved; there is no other way to reach it
	h := &dropJobRemoved{inner: dbus.NewDefaultSignalHandler()}
	dial := func(ctx context.Context) (*sddbus.Conn, error) {
		n := 0
		return sddbus.NewConnection(func() (*dbus.Conn, error) {
			n++
			opts := []dbus.ConnOption{dbus.WithContext(ctx)}
			if n == 2 { // go-systemd's second connection receives the signals
				opts = append(opts, dbus.WithSignalHandler(h))
			}
			c, err := dbus.Dial("unix:path=/run/systemd/private", opts...)
			if err != nil {
				return nil, err
			}
			if err := c.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		})
	}
	const jobTimeout = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := scope.NewSystemd(ctx, scope.SystemdOptions{Dial: dial, JobTimeout: jobTimeout})
	if err != nil {
		t.Fatalf("NewSystemd: %v", err)
	}
	t.Cleanup(func() { b.Close() })

	for i := range 3 {
		began := time.Now()
		c := startIn(t, b, uniqueID(t)+"-"+strconv.Itoa(i), scope.Limits{}, "sh", "-c", "sleep 0.2; exit 7")
		if took := time.Since(began); took >= jobTimeout/2 {
			t.Errorf("round %d: Started took %v with JobTimeout %v: it waited for the lost signal", i, took, jobTimeout)
		}
		c.wait(t, 10*time.Second)
		if code := c.cmd.ProcessState.ExitCode(); code != 7 {
			t.Errorf("round %d: exit %d, want 7", i, code)
		}
		waitEmpty(t, c.sc, 10*time.Second)
		if err := c.sc.Remove(); err != nil {
			t.Errorf("round %d: Remove: %v", i, err)
		}
		if got := unitProp(t, c.sc.Name(), "LoadState"); got != "not-found" {
			t.Errorf("round %d: LoadState after Remove = %q, want not-found", i, got)
		}
	}
	if h.dropped.Load() == 0 {
		t.Fatal("no JobRemoved signal was dropped; the test proves nothing")
	}
}
