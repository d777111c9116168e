package peerns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
)

// nsIno is the inode of pid's network namespace, read by path.
func nsIno(t *testing.T, pid int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		t.Fatalf("stat /proc/%d/ns/net: %v", pid, err)
	}
	return st.Ino
}

func openPidfd(t *testing.T, pid int) int {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// netnsChild is a live child in a network namespace of its own, and its
// pidfd; the namespace is another than this process's.
func netnsChild(t *testing.T) (pid, pidfd int, ino uint64) {
	t.Helper()
	pid = testenv.NetnsChild(t)
	pidfd = openPidfd(t, pid)
	ino = nsIno(t, pid)
	if self := nsIno(t, os.Getpid()); ino == self {
		t.Fatalf("child's network namespace %d is this process's", ino)
	}
	return pid, pidfd, ino
}

// reapedPidfd is a pidfd of a child that has exited and been reaped: its
// pid may be anyone's now.
func reapedPidfd(t *testing.T) int {
	t.Helper()
	c := exec.Command("/bin/true")
	if err := c.Start(); err != nil {
		t.Fatalf("start /bin/true: %v", err)
	}
	fd := openPidfd(t, c.Process.Pid) // not waited for yet: at worst a zombie
	if err := c.Wait(); err != nil {
		t.Fatalf("wait /bin/true: %v", err)
	}
	return fd
}

// Self, Process and /proc/self/ns/net's "net:[N]" name one namespace by
// one number.
func TestSelfAndProcessAgree(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatalf("Self: %v", err)
	}
	link, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", self); link != want {
		t.Errorf("Self() = %d, but /proc/self/ns/net is %q", self, link)
	}
	if ns := Process(os.Getpid()); ns.Err != nil || ns.Ino != self {
		t.Errorf("Process(own pid) = %+v, want inode %d", ns, self)
	}
}

// PIDFD_GET_NET_NAMESPACE (the number this package has for it) gives the
// pidfd's process's namespace, and Process takes it.
func TestIoctlGivesThePidfdsNamespace(t *testing.T) {
	pid, pidfd, ino := netnsChild(t)
	nsfd, err := std.netnsFd(pidfd)
	if errors.Is(err, unix.ENOTTY) {
		testenv.Skip(t, "PIDFD_GET_NET_NAMESPACE needs Linux 6.11:", err)
	}
	if err != nil {
		t.Fatalf("ioctl PIDFD_GET_NET_NAMESPACE: %v", err)
	}
	var st unix.Stat_t
	err = unix.Fstat(nsfd, &st)
	unix.Close(nsfd)
	if err != nil || st.Ino != ino {
		t.Fatalf("fstat of the namespace fd = inode %d, %v; want the child's, %d", st.Ino, err, ino)
	}
	if got, err := std.ofPidfd(pidfd, int32(pid)); got != ino || err != nil {
		t.Errorf("ofPidfd(child) = %d, %v; want %d, nil", got, err, ino)
	}
	if ns := Process(pid); ns.Err != nil || ns.Ino != ino {
		t.Errorf("Process(child) = %+v, want inode %d", ns, ino)
	}
}

// A pidfd whose process is gone has no namespace, whatever its old pid
// names now (here: this process, in the host's namespace).
func TestIoctlOfAReapedProcessFailsClosed(t *testing.T) {
	fd := reapedPidfd(t)
	if got, err := std.ofPidfd(fd, int32(os.Getpid())); err == nil || got != 0 {
		t.Errorf("ofPidfd(reaped process, pid now a live one) = %d, %v; want 0 and an error", got, err)
	}
}

// Without the ioctl (ENOTTY, EINVAL), /proc/<pid>/ns/net is read, and kept
// only when the pidfd's process still held the pid: a pid whose process is
// gone and that now names a live process in another namespace gives no
// namespace. Other ioctl errors are the answer, with no fallback.
func TestFallbackReadsProcWhileThePidfdLives(t *testing.T) {
	pid, pidfd, ino := netnsChild(t)
	gone := reapedPidfd(t)
	for _, errno := range []unix.Errno{unix.ENOTTY, unix.EINVAL} {
		calls := 0
		r := resolver{netnsFd: func(int) (int, error) { calls++; return -1, errno }}
		if got, err := r.ofPidfd(pidfd, int32(pid)); got != ino || err != nil || calls != 1 {
			t.Errorf("%v: ofPidfd(live child) = %d, %v (ioctl called %d times); want %d, nil, once", errno, got, err, calls, ino)
		}
		if got, err := r.ofPidfd(gone, int32(os.Getpid())); err == nil || got != 0 {
			t.Errorf("%v: ofPidfd(reaped process, its pid now naming a live process) = %d, %v; want 0 and an error (the liveness check)", errno, got, err)
		}
	}
	r := resolver{netnsFd: func(int) (int, error) { return -1, unix.EACCES }}
	if got, err := r.ofPidfd(pidfd, int32(pid)); !errors.Is(err, unix.EACCES) || got != 0 {
		t.Errorf("ofPidfd with the ioctl failing EACCES = %d, %v; want 0, EACCES (no fallback)", got, err)
	}
}

// The peer's pidfd comes from SO_PEERPIDFD, or pidfd_open of its pid where
// the kernel has no SO_PEERPIDFD (ENOPROTOOPT); any other failure leaves
// the namespace unknown.
func TestPeerPidfd(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	self := nsIno(t, os.Getpid())
	me := int32(os.Getpid())
	if ns := Peer(fds[0], me); ns.Err != nil || ns.Ino != self {
		t.Errorf("Peer(socketpair) = %+v, want inode %d", ns, self)
	}
	old := resolver{peerPidfd: func(int) (int, error) { return -1, unix.ENOPROTOOPT }, netnsFd: std.netnsFd}
	if ns := old.peer(fds[0], me); ns.Err != nil || ns.Ino != self {
		t.Errorf("peer without SO_PEERPIDFD = %+v, want inode %d (by pidfd_open)", ns, self)
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if ns := old.peer(fds[0], int32(gone.Process.Pid)); ns.Err == nil {
		t.Errorf("peer without SO_PEERPIDFD, of a reaped pid = %+v, want an error", ns)
	}
	bad := resolver{peerPidfd: func(int) (int, error) { return -1, unix.EBADF }, netnsFd: std.netnsFd}
	if ns := bad.peer(fds[0], me); !errors.Is(ns.Err, unix.EBADF) || ns.Ino != 0 {
		t.Errorf("peer with SO_PEERPIDFD failing EBADF = %+v, want EBADF and no inode", ns)
	}
}
