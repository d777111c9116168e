package ipc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
	"github.com/corral-dev/corral/tests/testenv"
)

// connectHelperEnv makes the test binary connectHelper, connecting to the
// socket path the variable holds.
const connectHelperEnv = "CORRAL_IPC_TEST_CONNECT"

// connectHelper connects its fd 3, an unconnected unix socket its parent
// also holds, to path, says so on stdout and stays until stdin closes. The
// connection's peer credentials are then this process's, while the parent
// does the talking and keeps the connection after this process has gone
// (as a child of an exited caller would).
func connectHelper(path string) int {
	if err := unix.Connect(3, &unix.SockaddrUnix{Name: path}); err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	fmt.Println("connected")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// A peer that connected from another network namespace is known as in it
// for the connection's lifetime: its namespace is resolved at accept,
// through a pidfd of the process that connected, and not read again once
// that process has exited and its pid may be anyone's (with /proc/<pid>
// read at each call, this process's host namespace could be taken for the
// caller's).
func TestPeerNetnsResolvedAtAccept(t *testing.T) {
	testenv.SkipRoot(t, "a new network namespace needs root")
	f := newFake()
	path, _ := startServer(t, f, nil)
	sfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	sock := os.NewFile(uintptr(sfd), "peer socket")
	defer sock.Close()

	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), connectHelperEnv+"="+path)
	child.ExtraFiles = []*os.File{sock}
	child.Stderr = os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatalf("start the connecting child: %v", err)
	}
	waited := false
	defer func() {
		if !waited {
			_ = stdin.Close()
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "connected\n" {
		t.Fatalf("child said %q, %v; want connected", line, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", child.Process.Pid), &st); err != nil {
		t.Fatalf("stat the child's network namespace: %v", err)
	}
	childNs := st.Ino
	self, err := peerns.Self()
	if err != nil {
		t.Fatal(err)
	}
	if childNs == self {
		t.Fatalf("the child's network namespace %d is this process's", childNs)
	}

	nc, err := net.FileConn(sock)
	if err != nil {
		t.Fatalf("the child's connection: %v", err)
	}
	c := NewClient(nc)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check := func(when string) {
		t.Helper()
		if _, err := c.Get(ctx, "x"); err != nil {
			t.Fatalf("%s: exec.get: %v", when, err)
		}
		caller := f.lastCaller()
		if caller.PID != int32(child.Process.Pid) {
			t.Fatalf("%s: caller pid %d, want the child's, %d", when, caller.PID, child.Process.Pid)
		}
		if ns := caller.Netns; ns == nil || ns.Err != nil || ns.Ino != childNs {
			t.Errorf("%s: caller's network namespace = %+v, want the child's, inode %d (this process's is %d)", when, ns, childNs, self)
		}
	}
	// Answered while the child lives (it waits on stdin): the accept was
	// then too.
	check("child alive")
	_ = stdin.Close()
	waited = true
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	check("child exited and reaped")
}

// A namespace the daemon could not resolve for want of a resource (here
// EMFILE, injected) fails the accept: the connection is closed, so the
// client connects again instead of being served without the host network
// for as long as it stays connected. An answer about the peer (EACCES) is
// kept: that connection is served, without the host network.
func TestTransientNetnsFailureClosesTheConnection(t *testing.T) {
	for _, tc := range []struct {
		errno  unix.Errno
		served bool
	}{{unix.EMFILE, false}, {unix.EACCES, true}} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			old := resolveNetns
			resolveNetns = func(int, int32) *api.NetNS {
				return &api.NetNS{Err: fmt.Errorf("network namespace: %w", os.NewSyscallError("ioctl", tc.errno))}
			}
			t.Cleanup(func() { resolveNetns = old })
			f := newFake()
			path, _ := startServer(t, f, nil)
			c := dialClient(t, path)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.Get(ctx, "me")
			if tc.served && err != nil {
				t.Fatalf("exec.get on a connection whose namespace is unknown (%v): %v, want it served", tc.errno, err)
			}
			if !tc.served && err == nil {
				t.Fatalf("exec.get answered on a connection accepted while the daemon lacked fds for its namespace; want it closed")
			}
			if tc.served {
				if ns := f.lastCaller().Netns; ns == nil || !errors.Is(ns.Err, tc.errno) {
					t.Errorf("caller's namespace = %+v, want unknown with %v", ns, tc.errno)
				}
			}
		})
	}
}
