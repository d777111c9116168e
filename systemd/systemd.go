// Package systemd is corrald's host integration with systemd: sd_notify
// (READY, STATUS, STOPPING, WATCHDOG), socket activation, and the journald
// log writer. Every function is a harmless no-op when the daemon does not
// run under systemd, so callers need not check.
package systemd

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/rs/zerolog/journald"
)

// UnderSystemd reports whether systemd is the service manager and started
// this process as a service (it set INVOCATION_ID or NOTIFY_SOCKET).
func UnderSystemd() bool {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return false
	}
	return os.Getenv("INVOCATION_ID") != "" || os.Getenv("NOTIFY_SOCKET") != ""
}

// Ready tells systemd the daemon is up (Type=notify). It reports whether a
// notification was sent.
func Ready() bool { return notify(daemon.SdNotifyReady) }

// Stopping tells systemd the daemon is shutting down.
func Stopping() bool { return notify(daemon.SdNotifyStopping) }

// Status sets the one-line status systemctl status shows.
func Status(s string) bool { return notify("STATUS=" + s) }

// Watchdog pings the watchdog; call it more often than WatchdogInterval.
func Watchdog() bool { return notify(daemon.SdNotifyWatchdog) }

// WatchdogInterval returns WatchdogSec when the watchdog is enabled for this
// process.
func WatchdogInterval() (time.Duration, bool) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

func notify(state string) bool {
	ok, err := daemon.SdNotify(false, state)
	return ok && err == nil
}

// Listeners returns the Unix stream sockets passed by socket activation
// (LISTEN_FDS), or none. It unsets the LISTEN_* variables so children never
// see them.
func Listeners() ([]*net.UnixListener, error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	var out []*net.UnixListener
	for _, l := range lns {
		if l == nil {
			continue
		}
		ul, ok := l.(*net.UnixListener)
		if !ok {
			l.Close()
			return nil, fmt.Errorf("socket activation: passed %s socket, want a Unix stream socket", l.Addr().Network())
		}
		out = append(out, ul)
	}
	return out, nil
}

// JournalWriter returns a zerolog writer that sends each log line to
// journald as one entry. Field names become journal fields upper-cased:
// exec_id becomes EXEC_ID, label_tool_call becomes LABEL_TOOL_CALL. When the
// journal socket is missing it writes JSON lines to stderr instead.
func JournalWriter() io.Writer {
	if _, err := os.Stat("/run/systemd/journal/socket"); err != nil {
		return os.Stderr
	}
	return journald.NewJournalDWriter()
}
