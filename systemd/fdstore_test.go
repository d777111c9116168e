package systemd

import (
	"os"
	"strconv"
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
