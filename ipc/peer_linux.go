package ipc

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
	"github.com/corral-dev/corral/internal/transient"
)

// peerCred reads the connecting process's identity with SO_PEERCRED. The
// kernel records it at connect(2), so it cannot be changed by the peer later.
// The peer's network namespace is resolved here too, once, through a pidfd
// of the process that connected (peerns): exec.start decides on it for the
// connection's lifetime, and never reads /proc/<pid> again, where the pid
// may by then be another process's. A namespace that cannot be established
// is recorded as unknown (Owner.Netns.Err), not as a failed accept: the
// caller can still be served, without the host's network. Except when the
// daemon lacked a resource for it (fds, memory: transient.Is): that
// answer would stand for the connection's lifetime though a later try
// would succeed, so the accept fails instead (the connection is closed,
// the client connects again), as a failed SO_PEERCRED read does.
func peerCred(nc *net.UnixConn) (api.Owner, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return api.Owner{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		cred  *unix.Ucred
		serr  error
		netns *api.NetNS
	)
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if serr == nil {
			netns = resolveNetns(int(fd), cred.Pid)
		}
	}); err != nil {
		return api.Owner{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return api.Owner{}, fmt.Errorf("peer credentials: %w", os.NewSyscallError("getsockopt SO_PEERCRED", serr))
	}
	if netns.Err != nil && transient.Is(netns.Err) {
		return api.Owner{}, fmt.Errorf("peer's network namespace: %w", netns.Err)
	}
	return api.Owner{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, Netns: netns}, nil
}

// resolveNetns is peerns.Peer; a variable for the tests that make it fail.
var resolveNetns = peerns.Peer

// hangupPoll is how often a half-closed connection is checked for the peer
// having gone entirely.
const hangupPoll = 100 * time.Millisecond

// watchHangup cancels the connection's context once the peer has closed its
// socket entirely. After read EOF a peer may still be waiting for answers
// (it only shut down its write side: shutdown(SHUT_WR), as socat and nc do),
// so EOF alone does not cancel anything; a closed peer sets POLLHUP on our
// end (both directions shut down), which a zero-timeout poll reports without
// consuming anything. The returned func stops the watch.
func (c *conn) watchHangup() (stop func()) {
	rc, err := c.nc.SyscallConn()
	if err != nil {
		c.cancel()
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(hangupPoll)
		defer t.Stop()
		for {
			var hup bool
			cerr := rc.Control(func(fd uintptr) {
				fds := []unix.PollFd{{Fd: int32(fd)}}
				n, perr := unix.Poll(fds, 0)
				hup = perr == nil && n > 0 && fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
			})
			if cerr != nil || hup {
				c.log.Debug().Msg("peer hung up; cancelling its requests")
				c.cancel()
				return
			}
			select {
			case <-done:
				return
			case <-c.ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
