package survival

import (
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReloadFeedsWatchdog: the watchdog runs on through a reload, so the
// handover must ping it across the exec. With WatchdogSec=60s corrald pings
// every 30s; a reload a few seconds after a ping must still leave systemd
// with a ping taken during the handover (systemd's WatchdogTimestamp moves
// past the moment of the reload), not the one from before it. Without
// that, under load the last ping before the exec, the handover and the
// new image's wait for its first tick added up to more than WatchdogSec and
// systemd aborted corrald right after the reload (the drill's sd-reload
// and dbus-restart losses).
func TestReloadFeedsWatchdog(t *testing.T) {
	setup(t)
	runAs(t, corrald(), "60s")
	c := dial(t)
	before, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the start's pings are now 2s old
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	reloadAt := uint64(ts.Nano() / 1000)
	reloadAndWait(t, before.StartedAt, 20*time.Second)
	last, _ := strconv.ParseUint(prop(t, "WatchdogTimestampMonotonic"), 10, 64)
	if last < reloadAt {
		t.Errorf("systemd's last watchdog ping is %.1fs before the reload (WatchdogTimestampMonotonic %d, reload at %d): no ping across the handover",
			float64(reloadAt-last)/1e6, last, reloadAt)
	}
	if got := prop(t, "NRestarts"); got != "0" {
		t.Errorf("NRestarts = %s after the reload, want 0", got)
	}
}
