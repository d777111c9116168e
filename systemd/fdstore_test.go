package systemd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStoreSendsFdWithName: FDSTORE=1 arrives with the name, FDPOLL=0 and
// the fd itself (a duplicate: writing to it reaches the original pipe).
func TestStoreSendsFdWithName(t *testing.T) {
	c := notifySocket(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	sent, err := Store("0190abcd.stdout", p[1])
	if !sent || err != nil {
		t.Fatalf("Store = %v, %v", sent, err)
	}
	buf, oob := make([]byte, 512), make([]byte, 128)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(buf[:n]), "FDSTORE=1\nFDNAME=0190abcd.stdout\nFDPOLL=0"; got != want {
		t.Errorf("datagram = %q, want %q", got, want)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages = %v, %v", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights = %v, %v", fds, err)
	}
	defer unix.Close(fds[0])
	if _, err := unix.Write(fds[0], []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if n, err := unix.Read(p[0], got); n != 1 || err != nil || got[0] != 'x' {
		t.Errorf("read through the stored duplicate = %d, %v, %q", n, err, got)
	}

	if sent, err := Remove("0190abcd.stdin"); !sent || err != nil {
		t.Fatalf("Remove = %v, %v", sent, err)
	}
	n, err = c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(buf[:n]), "FDSTOREREMOVE=1\nFDNAME=0190abcd.stdin"; got != want {
		t.Errorf("datagram = %q, want %q", got, want)
	}
	if _, err := Store("bad:name", p[1]); err == nil {
		t.Error("Store accepted a name with ':'")
	}
}

func TestStoreWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Store("x.stdout", 0); sent || err != nil {
		t.Errorf("Store without NOTIFY_SOCKET = %v, %v; want false, nil", sent, err)
	}
}

// TestReadPassed: fds from the fd store (LISTEN_FDS at 3...) and from a
// handover (HandoverEnv) come back by name; the listening socket apart.
func TestReadPassed(t *testing.T) {
	// Put a pipe at a known number for the handover entry.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("LISTEN_PID", "")
	t.Setenv(HandoverEnv, HandoverValue(map[int]string{p[1]: "e1.stdin", sock: ListenerName}))
	got, err := readPassed()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if fds := got.Fds["e1.stdin"]; len(fds) != 1 || fds[0] != p[1] {
		t.Errorf("Fds[e1.stdin] = %v, want [%d]", fds, p[1])
	}
	if len(got.Sockets) != 1 || got.Sockets[0].Fd() != uintptr(sock) || got.Sockets[0].Name() != ListenerName {
		t.Errorf("Sockets = %v, want the socket %d", got.Sockets, sock)
	}
	if v := os.Getenv(HandoverEnv); v != "" {
		t.Errorf("%s left set: %q", HandoverEnv, v)
	}
	if fl, _ := unix.FcntlInt(uintptr(p[1]), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Error("passed fd not marked close-on-exec")
	}

	t.Setenv(HandoverEnv, "7x=a:"+strconv.Itoa(1<<20)+"=b")
	if _, err := readPassed(); err == nil {
		t.Error("bad handover entries accepted")
	}
}

// readNotify reads one datagram and the fds it carries.
func readNotify(t *testing.T, c *net.UnixConn) (string, []int) {
	t.Helper()
	buf, oob := make([]byte, 512), make([]byte, 128)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, got...)
	}
	return string(buf[:n]), fds
}

func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// TestNotifierKeepsOneSocket: an execution's worth of fd store messages
// (four Stores, a Remove, a watchdog ping) arrive in order, each Store with
// its name and its own fd, over one socket opened once; when the receiver's
// socket is re-created at the same path, the next message opens one new
// socket and arrives.
func TestNotifierKeepsOneSocket(t *testing.T) {
	c := notifySocket(t)
	closeNotifier()
	before := notifierOpens()
	var pipes [2][2]int
	for i := range pipes {
		if err := unix.Pipe2(pipes[i][:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pipes[i][0])
		defer unix.Close(pipes[i][1])
	}
	stores := []struct {
		name string
		fd   int
	}{
		{"e1.stdout", pipes[0][0]}, {"e1.stdin", pipes[0][1]},
		{"e1.stderr", pipes[1][0]}, {"e1.pidfd", pipes[1][1]},
	}
	for _, s := range stores {
		if sent, err := Store(s.name, s.fd); !sent || err != nil {
			t.Fatalf("Store(%s) = %v, %v", s.name, sent, err)
		}
	}
	if sent, err := Remove("e1.stdin"); !sent || err != nil {
		t.Fatalf("Remove = %v, %v", sent, err)
	}
	if sent, err := Watchdog(); !sent || err != nil {
		t.Fatalf("Watchdog = %v, %v", sent, err)
	}
	for _, s := range stores {
		msg, fds := readNotify(t, c)
		if want := "FDSTORE=1\nFDNAME=" + s.name + "\nFDPOLL=0"; msg != want {
			t.Errorf("datagram = %q, want %q", msg, want)
		}
		if len(fds) != 1 {
			t.Fatalf("%s: %d fds passed, want 1", s.name, len(fds))
		}
		if !sameFile(t, fds[0], s.fd) {
			t.Errorf("%s: the passed fd is not the stored one", s.name)
		}
		unix.Close(fds[0])
	}
	if msg, fds := readNotify(t, c); msg != "FDSTOREREMOVE=1\nFDNAME=e1.stdin" || len(fds) != 0 {
		t.Errorf("remove datagram = %q with %d fds", msg, len(fds))
	}
	if msg, _ := readNotify(t, c); msg != "WATCHDOG=1" {
		t.Errorf("watchdog datagram = %q", msg)
	}
	if got := notifierOpens() - before; got != 1 {
		t.Errorf("%d sockets opened for 6 messages, want 1", got)
	}

	// The receiver re-creates its socket (as systemd does on daemon-reexec).
	path := os.Getenv("NOTIFY_SOCKET")
	c.Close()
	os.Remove(path)
	c2, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if sent, err := Store("e2.stdout", pipes[0][0]); !sent || err != nil {
		t.Fatalf("Store after the receiver's restart = %v, %v", sent, err)
	}
	msg, fds := readNotify(t, c2)
	if msg != "FDSTORE=1\nFDNAME=e2.stdout\nFDPOLL=0" || len(fds) != 1 || !sameFile(t, fds[0], pipes[0][0]) {
		t.Errorf("after the receiver's restart: %q with fds %v", msg, fds)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if got := notifierOpens() - before; got != 2 {
		t.Errorf("%d sockets opened in all, want 2 (one reopen)", got)
	}
}

// TestNotifierDoesNotBlockWhenReceiverStalls: systemd not reading its
// notify socket (busy) must not stall the caller, the reactor's loop, whose
// watchdog pings would stop with it: 2,000 Stores with Removes between
// them (far more than the receiver's queue holds) and a watchdog ping all
// return while nobody reads; once the receiver reads, every message
// arrives in the order sent, each Store with its fd, and the duplicates
// kept for the wait are closed.
func TestNotifierDoesNotBlockWhenReceiverStalls(t *testing.T) {
	c := notifySocket(t)
	closeNotifier()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	fdsBefore := openFds(t)
	notifySock.mu.Lock()
	queuedBefore := notifySock.queued
	notifySock.mu.Unlock()

	const n = 2000
	var want []string
	for i := 0; i < n; i++ {
		name := "e" + strconv.Itoa(i) + ".stdout"
		want = append(want, "FDSTORE=1\nFDNAME="+name+"\nFDPOLL=0")
		if i%10 == 9 {
			want = append(want, "FDSTOREREMOVE=1\nFDNAME="+name)
		}
	}
	want = append(want, "WATCHDOG=1")
	done := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			name := "e" + strconv.Itoa(i) + ".stdout"
			if sent, err := Store(name, p[1]); !sent || err != nil {
				done <- fmt.Errorf("Store(%s) = %v, %v", name, sent, err)
				return
			}
			if i%10 == 9 {
				if sent, err := Remove(name); !sent || err != nil {
					done <- fmt.Errorf("Remove(%s) = %v, %v", name, sent, err)
					return
				}
			}
		}
		_, err := Watchdog()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("notifications block while the receiver does not read (its queue is full)")
	}
	notifySock.mu.Lock()
	queued := notifySock.queued - queuedBefore
	notifySock.mu.Unlock()
	if queued == 0 {
		t.Fatalf("no notification had to wait: the receiver's queue never filled, the test proves nothing")
	}
	for i, w := range want {
		msg, fds := readNotify(t, c)
		if msg != w {
			t.Fatalf("message %d = %q, want %q", i, msg, w)
		}
		wantFds := 0
		if strings.HasPrefix(w, "FDSTORE=1") {
			wantFds = 1
		}
		if len(fds) != wantFds {
			t.Fatalf("message %d (%q) carried %d fds, want %d", i, msg, len(fds), wantFds)
		}
		for _, fd := range fds {
			if !sameFile(t, fd, p[1]) {
				t.Errorf("message %d: the passed fd is not the stored one", i)
			}
			unix.Close(fd)
		}
	}
	// The queue's duplicates are closed once their messages went out.
	deadline := time.Now().Add(10 * time.Second)
	for {
		notifySock.mu.Lock()
		idle := !notifySock.draining && len(notifySock.pending) == 0
		notifySock.mu.Unlock()
		if idle && openFds(t) <= fdsBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after delivery: draining %v, %d fds open, %d before", !idle, openFds(t), fdsBefore)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openFds counts the process's open fds, not counting the notifier's
// kept socket.
func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	notifySock.mu.Lock()
	kept := notifySock.fd >= 0
	notifySock.mu.Unlock()
	if kept {
		return len(ents) - 1
	}
	return len(ents)
}
