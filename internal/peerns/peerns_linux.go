// Package peerns establishes the network namespace of a process that
// connected to corrald, without racing against its pid's reuse.
//
// A pid read from SO_PEERCRED names the connecting process only while that
// process holds it: once it exits, /proc/<pid> may be another process's. So
// the namespace is read once, at accept, through a pidfd, which names the
// process itself: SO_PEERPIDFD's (Linux 6.5) is the very process that
// called connect(2); on older kernels pidfd_open(2) of SO_PEERCRED's pid
// stands in for it (a pid reused between connect and accept is then not
// detected: those kernels have nothing better). The pidfd gives the
// namespace through PIDFD_GET_NET_NAMESPACE (Linux 6.11); before that,
// /proc/<pid>/ns/net is read and the pidfd then proves the pid still named
// its process during the read.
//
// A namespace is identified by its inode number: the N of
// /proc/<pid>/ns/net's "net:[N]", which stat(2) of that path and fstat(2)
// of a namespace fd both give.
package peerns

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// pidfdGetNetNamespace is PIDFD_GET_NET_NAMESPACE, _IO(PIDFS_IOCTL_MAGIC,
// 4) with PIDFS_IOCTL_MAGIC 0xFF (include/uapi/linux/pidfd.h, Linux 6.11),
// not in x/sys. The value is _IO's asm-generic encoding (_IOC_NONE is 0:
// x86, arm, arm64, riscv, s390, loongarch); an architecture encoding _IO
// otherwise (powerpc, mips, sparc) gets ENOTTY for it and takes the /proc
// fallback.
const pidfdGetNetNamespace = 0xFF04

// resolver holds the steps that tests replace to take the fallbacks.
type resolver struct {
	// peerPidfd returns a pidfd of a connected unix socket's peer
	// (SO_PEERPIDFD).
	peerPidfd func(sockfd int) (int, error)
	// netnsFd returns an fd of the namespace of pidfd's process
	// (PIDFD_GET_NET_NAMESPACE).
	netnsFd func(pidfd int) (int, error)
}

var std = resolver{
	peerPidfd: func(sockfd int) (int, error) {
		return unix.GetsockoptInt(sockfd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	},
	netnsFd: func(pidfd int) (int, error) {
		for {
			fd, err := unix.IoctlRetInt(pidfd, pidfdGetNetNamespace)
			if err != unix.EINTR {
				return fd, err
			}
		}
	},
}

// Peer resolves the network namespace of the peer of sockfd, a connected
// unix socket; pid is the peer's pid from SO_PEERCRED. The result is never
// nil: a namespace that could not be established has Err set.
func Peer(sockfd int, pid int32) *api.NetNS { return std.peer(sockfd, pid) }

// Process resolves the network namespace of the process pid is now, by
// pidfd_open(2): for a caller that did not connect (a test's in-process
// caller standing for a peer). Never nil, as Peer.
func Process(pid int) *api.NetNS {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return &api.NetNS{Err: fmt.Errorf("network namespace of pid %d: %w", pid, os.NewSyscallError("pidfd_open", err))}
	}
	defer unix.Close(pidfd)
	ino, err := std.ofPidfd(pidfd, int32(pid))
	return result(ino, err, pid)
}

// Self is the inode of the calling process's network namespace (its
// thread group leader's, as /proc/self names it).
func Self() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: "/proc/self/ns/net", Err: err}
	}
	return st.Ino, nil
}

func result(ino uint64, err error, pid int) *api.NetNS {
	if err != nil {
		return &api.NetNS{Err: fmt.Errorf("network namespace of pid %d: %w", pid, err)}
	}
	return &api.NetNS{Ino: ino}
}

func (r resolver) peer(sockfd int, pid int32) *api.NetNS {
	pidfd, err := r.peerPidfd(sockfd)
	if errors.Is(err, unix.ENOPROTOOPT) {
		// Before Linux 6.5: no SO_PEERPIDFD.
		pidfd, err = unix.PidfdOpen(int(pid), 0)
		if err != nil {
			err = os.NewSyscallError("pidfd_open", err)
		}
	} else if err != nil {
		err = os.NewSyscallError("getsockopt SO_PEERPIDFD", err)
	}
	if err != nil {
		return &api.NetNS{Err: fmt.Errorf("network namespace of pid %d: %w", pid, err)}
	}
	defer unix.Close(pidfd)
	ino, err := r.ofPidfd(pidfd, pid)
	return result(ino, err, int(pid))
}

// ofPidfd is the inode of the network namespace of pidfd's process, whose
// pid is pid.
func (r resolver) ofPidfd(pidfd int, pid int32) (uint64, error) {
	nsfd, err := r.netnsFd(pidfd)
	if err == nil {
		var st unix.Stat_t
		err := unix.Fstat(nsfd, &st)
		unix.Close(nsfd)
		if err != nil {
			return 0, os.NewSyscallError("fstat of the namespace fd", err)
		}
		return st.Ino, nil
	}
	// Before Linux 6.11 a pidfd has no such ioctl (ENOTTY; EINVAL where
	// the pidfd is not yet a pidfs file). Any other error (ESRCH: the
	// process has exited) is the answer.
	if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
		return 0, os.NewSyscallError("ioctl PIDFD_GET_NET_NAMESPACE", err)
	}
	return viaProc(pidfd, pid)
}

// viaProc reads pid's namespace from /proc, then checks that pidfd's
// process had not been reaped by then: while it is not, no other process
// can have its pid, so the read was of it. (A zombie still holds its pid
// and signal 0 still reaches it; its /proc/<pid>/ns/net is gone, so the
// read failed.)
func viaProc(pidfd int, pid int32) (uint64, error) {
	path := fmt.Sprintf("/proc/%d/ns/net", pid)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return 0, fmt.Errorf("%s may be another process's (the pidfd's process is gone): %w",
			path, os.NewSyscallError("pidfd_send_signal", err))
	}
	return st.Ino, nil
}
