// Package systemd integrates corrald with the host's service manager:
// readiness, status and watchdog notifications (sd_notify), socket
// activation, and structured logging to the journal.
//
// Every function here is safe to call from any goroutine, and a no-op (or
// an empty result) when corrald is not running under systemd, so the daemon
// calls them unconditionally.
//
// # Journal fields
//
// JournalWriter is zerolog's journald writer. Each zerolog event becomes one
// journal entry:
//
//   - the "message" field becomes MESSAGE;
//   - the "level" field becomes PRIORITY (trace/debug 7, info 6, warn 4,
//     error 3, fatal 2, panic 0, no level 5) and is not stored otherwise;
//   - the "time" field is dropped (the journal stamps entries itself);
//   - every other top-level key is upper-cased, with characters outside
//     [A-Z0-9_] replaced by '_' and an "X" prefixed when it would start with
//     a digit or '_': "exec_id" -> EXEC_ID, "owner_uid" -> OWNER_UID,
//     "event" -> EVENT, "peer-pid" -> PEER_PID. String values are stored as
//     is, numbers in decimal, anything else (objects, arrays, bools) as JSON;
//   - the whole event is also stored as JSON in the JSON field.
//
// So `journalctl -u corrald EXEC_ID=<id>` finds every line about one
// execution, and `journalctl -o json` shows the fields. Avoid field names
// that collide with journal fields the writer or journald set themselves
// (message, priority, syslog_identifier, code_file, code_line, json, and
// anything starting with '_', which becomes X_...). To set the identifier
// shown by journalctl (otherwise the process name), add the field
// "syslog_identifier" once to the logger's context.
package systemd

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/coreos/go-systemd/v22/journal"
	"github.com/rs/zerolog/journald"
	"golang.org/x/sys/unix"
)

// SocketName is the name systemd gives the fds of corrald.socket
// (LISTEN_FDNAMES defaults to the socket unit's name).
const SocketName = "corrald.socket"

// UnderSystemd reports whether the process runs as a systemd service: the
// host runs systemd (/run/systemd/system exists) and the process was
// started by it (INVOCATION_ID or NOTIFY_SOCKET is set).
func UnderSystemd() bool {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return false
	}
	return os.Getenv("INVOCATION_ID") != "" || os.Getenv("NOTIFY_SOCKET") != ""
}

// notify sends state to $NOTIFY_SOCKET. It reports false and no error when
// the variable is unset. The variable is left set: it is needed for every
// later notification (children must not inherit it; see ScrubEnv).
func notify(state string) (bool, error) { return sendWithFds(state, nil) }

// notifier is the process's one connection to $NOTIFY_SOCKET: a datagram
// socket connected once and kept (CLOEXEC), so that a notification costs one
// sendmsg (the fd store sends several per execution from the reactor's
// loop). It is reopened when a send on it fails (systemd re-created its
// socket: daemon-reexec) and when $NOTIFY_SOCKET names another socket, and
// closed when the variable is unset.
type notifier struct {
	mu    sync.Mutex
	fd    int    // -1: none
	path  string // what fd is connected to, as in $NOTIFY_SOCKET
	opens int    // sockets opened so far (for tests)
}

var notifySock = notifier{fd: -1}

// sendWithFds sends state with fds (SCM_RIGHTS) to $NOTIFY_SOCKET. It
// reports false and no error when the variable is unset.
func sendWithFds(state string, fds []int) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	n := &notifySock
	n.mu.Lock()
	defer n.mu.Unlock()
	if path == "" {
		n.closeLocked()
		return false, nil
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if n.fd >= 0 && n.path == path {
		if err := unix.Sendmsg(n.fd, []byte(state), oob, nil, 0); err == nil {
			return true, nil
		}
		// A stale connection (the receiver's socket was re-created): the
		// error worth reporting is the fresh socket's, below.
	}
	n.closeLocked()
	if err := n.openLocked(path); err != nil {
		return false, fmt.Errorf("sd_notify %q: %w", firstLine(state), err)
	}
	if err := unix.Sendmsg(n.fd, []byte(state), oob, nil, 0); err != nil {
		n.closeLocked()
		return false, fmt.Errorf("sd_notify %q: %w", firstLine(state), os.NewSyscallError("sendmsg", err))
	}
	return true, nil
}

func (n *notifier) openLocked(path string) error {
	addr := path
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	n.opens++
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
		unix.Close(fd)
		return os.NewSyscallError("connect", err)
	}
	n.fd, n.path = fd, path
	return nil
}

func (n *notifier) closeLocked() {
	if n.fd >= 0 {
		unix.Close(n.fd)
	}
	n.fd, n.path = -1, ""
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Ready tells systemd that start-up is finished (READY=1, for Type=notify):
// call it once the API socket is listening and recovery is done.
func Ready() (bool, error) { return notify(daemon.SdNotifyReady) }

// Status sets the free-form status line shown by `systemctl status`.
// Newlines in s are replaced by spaces (they would start a new variable).
func Status(s string) (bool, error) {
	return notify("STATUS=" + strings.ReplaceAll(s, "\n", " "))
}

// Stopping tells systemd that an orderly shutdown has begun (STOPPING=1).
func Stopping() (bool, error) { return notify(daemon.SdNotifyStopping) }

// Watchdog pings the service watchdog (WATCHDOG=1). Call it from the
// goroutine whose liveness it should prove (the event loop), every
// WatchdogInterval.
func Watchdog() (bool, error) { return notify(daemon.SdNotifyWatchdog) }

// WatchdogInterval returns the unit's WatchdogSec= (WATCHDOG_USEC) and
// whether the watchdog is enabled for this process at all (WATCHDOG_USEC set
// and WATCHDOG_PID, if set, is ours). Ping with Watchdog at least twice per
// interval (every interval/2, as systemd recommends). A malformed
// WATCHDOG_USEC counts as disabled.
func WatchdogInterval() (time.Duration, bool) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

// Listeners returns the Unix stream sockets systemd passed by socket
// activation (see TakePassed for which fds count as such) and closes every
// other passed fd. It returns nil and no error when nothing was passed (or
// the fds were meant for another process: LISTEN_PID is not ours). It
// unsets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES, marks the fds
// close-on-exec, and must be called at most once per process (and not
// together with TakePassed, which it calls). The listeners do not unlink the
// socket path on Close (systemd owns it). The caller owns them.
func Listeners() ([]*net.UnixListener, error) {
	p, err := TakePassed()
	if err != nil {
		p.Close()
		return nil, err
	}
	socks := p.Sockets
	p.Sockets = nil
	p.Close()
	return ListenersFrom(socks)
}

// JournalWriter returns zerolog's journald writer (see the package doc for
// how fields map to journal fields). When the journal's socket
// (/run/systemd/journal/socket) does not exist it returns os.Stderr, so
// the result is always usable; JournalAvailable tells the two apart. Each
// event is sent as one datagram; the writer is safe for concurrent use.
func JournalWriter() io.Writer {
	if !JournalAvailable() {
		return os.Stderr
	}
	return journald.NewJournalDWriter()
}

// JournalAvailable reports whether the journal's socket exists.
func JournalAvailable() bool { return journal.Enabled() }

// serviceEnv are the variables systemd sets for the service itself; a
// child that inherits them could notify or claim fds in corrald's name.
var serviceEnv = []string{
	"NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES",
	"WATCHDOG_PID", "WATCHDOG_USEC", "INVOCATION_ID", "JOURNAL_STREAM",
	"MAINPID", "MANAGERPID", "SYSTEMD_EXEC_PID", "TRIGGER_UNIT", "TRIGGER_TIMESTAMP_MONOTONIC", "TRIGGER_TIMESTAMP_REALTIME",
}

// ScrubEnv returns env (KEY=VALUE entries) without the variables systemd
// sets for the daemon itself (NOTIFY_SOCKET, LISTEN_*, WATCHDOG_*,
// INVOCATION_ID, JOURNAL_STREAM...), for building a child's environment.
func ScrubEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, s := range serviceEnv {
			if k == s {
				drop = true
				break
			}
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
