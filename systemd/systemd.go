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
	"errors"
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
//
// A send never blocks its caller (the reactor's loop, whose stall would stop
// the watchdog pings): it is tried with MSG_DONTWAIT, and when the
// receiver's queue is full (systemd busy: net.unix.max_dgram_qlen datagrams
// unread) the message waits in pending, with duplicates of its fds, and a
// goroutine (drain) sends the queue in order as the receiver reads. While
// anything is pending every new message queues behind it, so systemd sees
// them in the order they were sent (a Remove never overtakes its Store).
type notifier struct {
	mu       sync.Mutex
	fd       int    // -1: none
	path     string // what fd is connected to, as in $NOTIFY_SOCKET
	opens    int    // sockets opened so far (for tests)
	pending  []pendingMsg
	draining bool // drain runs
	queued   int  // messages that had to wait, so far (for tests)
	// dropped counts queued messages given up on: the socket could not be
	// reopened, or $NOTIFY_SOCKET was unset while they waited.
	dropped int
	// left counts the queued messages that left the queue (sent or
	// dropped). The queue is in order, so the k-th to leave is the k-th
	// queued (queued counts those): everything queued up to queued has
	// reached the receiver (or was dropped) once left reaches it.
	left int
	// lastDrop is the number (1-based, in queued's count) of the last
	// queued message dropped, 0: none.
	lastDrop int
	// moved, when set, is closed (and cleared) whenever a message leaves
	// the queue: SyncNotify waits on it.
	moved chan struct{}
}

// pendingMsg is a notification waiting for the receiver: its state and
// the duplicates of its fds, closed once sent (or dropped).
type pendingMsg struct {
	path  string
	state string
	fds   []int
}

// maxPending bounds the queue (each entry may hold fds): beyond it a
// notification fails instead of waiting.
const maxPending = 4096

var notifySock = notifier{fd: -1}

// sendWithFds sends state with fds (SCM_RIGHTS) to $NOTIFY_SOCKET, or
// queues it when the receiver is not reading (see notifier). It reports
// false and no error when the variable is unset; true once the message is
// sent or queued (fds are duplicated then: the caller keeps its own).
func sendWithFds(state string, fds []int) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	n := &notifySock
	n.mu.Lock()
	defer n.mu.Unlock()
	if path == "" {
		n.closeLocked()
		n.dropPendingLocked()
		return false, nil
	}
	if len(n.pending) > 0 {
		return n.queueLocked(path, state, fds)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if n.fd >= 0 && n.path == path {
		if done, ok, err := n.trySendLocked(path, state, fds, oob); done {
			return ok, err
		}
		// A stale connection (the receiver's socket was re-created): the
		// error worth reporting is the fresh socket's, below.
	}
	n.closeLocked()
	if err := n.openLocked(path); err != nil {
		return false, fmt.Errorf("sd_notify %q: %w", firstLine(state), err)
	}
	done, ok, err := n.trySendLocked(path, state, fds, oob)
	if done {
		return ok, err
	}
	n.closeLocked()
	return false, fmt.Errorf("sd_notify %q: %w", firstLine(state), os.NewSyscallError("sendmsg", err))
}

// trySendLocked makes one non-blocking send of state (with oob, the fds'
// SCM_RIGHTS) on n.fd. done reports that the message was dealt with: sent
// (ok), or queued because the receiver is not reading (ok and err are
// queueLocked's). When not done, err is sendmsg's and the caller decides
// about the connection.
func (n *notifier) trySendLocked(path, state string, fds []int, oob []byte) (done, ok bool, err error) {
	err = unix.Sendmsg(n.fd, []byte(state), oob, nil, unix.MSG_DONTWAIT)
	switch {
	case err == nil:
		return true, true, nil
	case errors.Is(err, unix.EAGAIN):
		ok, err = n.queueLocked(path, state, fds)
		return true, ok, err
	}
	return false, false, err
}

// queueLocked appends a message to pending, with duplicates of fds, and
// makes sure drain runs.
func (n *notifier) queueLocked(path, state string, fds []int) (bool, error) {
	if len(n.pending) >= maxPending {
		return false, fmt.Errorf("sd_notify %q: %d notifications already wait for the service manager to read them", firstLine(state), len(n.pending))
	}
	m := pendingMsg{path: path, state: state}
	for _, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			m.closeFds()
			return false, fmt.Errorf("sd_notify %q: keep fd %d until the service manager reads: %w", firstLine(state), fd, os.NewSyscallError("fcntl", err))
		}
		m.fds = append(m.fds, d)
	}
	n.pending = append(n.pending, m)
	n.queued++
	if !n.draining {
		n.draining = true
		go n.drain()
	}
	return true, nil
}

func (m *pendingMsg) closeFds() {
	for _, fd := range m.fds {
		unix.Close(fd)
	}
	m.fds = nil
}

func (n *notifier) dropPendingLocked() {
	for i := range n.pending {
		n.pending[i].closeFds()
	}
	n.dropped += len(n.pending)
	n.leftLocked(len(n.pending), true)
	n.pending = nil
}

// leftLocked notes that k queued messages left the queue, sent or (drop)
// dropped, and wakes SyncNotify.
func (n *notifier) leftLocked(k int, drop bool) {
	if k == 0 {
		return
	}
	n.left += k
	if drop {
		n.lastDrop = n.left
	}
	if n.moved != nil {
		close(n.moved)
		n.moved = nil
	}
}

// drain sends pending in order, waiting (off the caller's goroutine) for
// the receiver's queue to have room, and ends when pending is empty.
func (n *notifier) drain() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for len(n.pending) > 0 {
		m := &n.pending[0]
		if n.fd < 0 || n.path != m.path {
			n.closeLocked()
			if err := n.openLocked(m.path); err != nil {
				// Nobody listens there any more (systemd gone or the
				// variable changed): what waits is lost.
				n.dropPendingLocked()
				break
			}
		}
		var oob []byte
		if len(m.fds) > 0 {
			oob = unix.UnixRights(m.fds...)
		}
		err := unix.Sendmsg(n.fd, []byte(m.state), oob, nil, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			m.closeFds()
			n.pending = n.pending[1:]
			n.leftLocked(1, false)
			continue
		case errors.Is(err, unix.EAGAIN):
			// Wait for room without the lock: senders queue meanwhile.
			fd := n.fd
			n.mu.Unlock()
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			_, _ = unix.Poll(pfd, 100)
			n.mu.Lock()
			continue
		}
		// The receiver's socket was re-created: reopen and try again (a
		// second failure in a row drops the message).
		n.closeLocked()
		if n.openLocked(m.path) == nil {
			if err := unix.Sendmsg(n.fd, []byte(m.state), oob, nil, unix.MSG_DONTWAIT); err == nil || errors.Is(err, unix.EAGAIN) {
				if err == nil {
					m.closeFds()
					n.pending = n.pending[1:]
					n.leftLocked(1, false)
				}
				continue
			}
		}
		m.closeFds()
		n.pending = n.pending[1:]
		n.dropped++
		n.leftLocked(1, true)
	}
	n.pending = nil
	n.draining = false
}

// FlushNotify waits up to d for the notifications still queued (see
// notifier) to reach the service manager, and reports whether none is
// left. A process about to exec calls it: the queue, and the fds it keeps
// for systemd, do not survive the exec.
func FlushNotify(d time.Duration) bool {
	n := &notifySock
	deadline := time.Now().Add(d)
	for {
		n.mu.Lock()
		idle := len(n.pending) == 0
		n.mu.Unlock()
		if idle {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SyncNotify waits up to d until every notification sent so far has
// reached the service manager's socket, and reports whether it did: false
// when one still waits in the process's queue (see notifier) after d, or
// one that waited when SyncNotify was called was dropped. It returns true
// at once when nothing waits (the usual case: a sendmsg that did not queue
// has reached the receiver). Not on a goroutine that must not block: it
// may wait up to d.
//
// A message dropped before the call (between its send and SyncNotify) is
// not seen: a drop means the socket could not be reopened at all.
func SyncNotify(d time.Duration) bool {
	n := &notifySock
	n.mu.Lock()
	defer n.mu.Unlock()
	target, from := n.queued, n.left // what waits now: from+1 .. target
	if n.left >= target {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for n.left < target {
		if n.moved == nil {
			n.moved = make(chan struct{})
		}
		moved := n.moved
		n.mu.Unlock()
		select {
		case <-moved:
			n.mu.Lock()
		case <-timer.C:
			n.mu.Lock()
			return n.left >= target && n.lastDrop <= from
		}
	}
	return n.lastDrop <= from
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
//
// It never blocks: events wait in a queue of the process's (one for every
// JournalWriter) and a goroutine sends them, in order; what does not fit
// while journald is not reading is dropped and counted in a later entry
// (journalqueue.go). Call FlushJournal before exit or exec.
func JournalWriter() io.Writer {
	if !JournalAvailable() {
		return os.Stderr
	}
	journalOnce.Do(func() { journalQ.Store(newQueuedWriter(journald.NewJournalDWriter(), journalQueueLen)) })
	return journalQ.Load()
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
