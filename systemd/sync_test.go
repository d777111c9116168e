package systemd

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fillNotifyQueue stores fd until a Store had to wait in the notifier's
// queue (the receiver, not reading, has its own queue full), and returns
// how many messages it sent.
func fillNotifyQueue(t *testing.T, fd int) int {
	t.Helper()
	notifySock.mu.Lock()
	before := notifySock.queued
	notifySock.mu.Unlock()
	for i := 0; i < 20000; i++ {
		if sent, err := Store("sync"+strconv.Itoa(i)+".stdout", fd); !sent || err != nil {
			t.Fatalf("Store = %v, %v", sent, err)
		}
		notifySock.mu.Lock()
		queued := notifySock.queued > before
		notifySock.mu.Unlock()
		if queued {
			return i + 1
		}
	}
	t.Fatal("no Store had to wait: the receiver's queue never filled, the test proves nothing")
	return 0
}

// TestSyncNotify: what the notifier queued while systemd did not read is
// not yet in systemd's hands (a kill -9 loses it). SyncNotify reports it:
// false while a message waits, true once the receiver read them all, and
// at once when nothing waits.
func TestSyncNotify(t *testing.T) {
	c := notifySocket(t)
	closeNotifier()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])

	if !SyncNotify(0) {
		t.Fatal("SyncNotify(0) = false with nothing sent")
	}
	n := fillNotifyQueue(t, p[1])
	if SyncNotify(100 * time.Millisecond) {
		t.Fatal("SyncNotify = true while a Store waits in the queue, unread by the receiver")
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf, oob := make([]byte, 512), make([]byte, 128)
		for i := 0; i < n; i++ {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for i := range msgs {
				fds, _ := unix.ParseUnixRights(&msgs[i])
				for _, fd := range fds {
					unix.Close(fd)
				}
			}
		}
	}()
	if !SyncNotify(30 * time.Second) {
		t.Error("SyncNotify = false once the receiver read every message")
	}
	<-read
	if !SyncNotify(0) {
		t.Error("SyncNotify(0) = false with nothing left in the queue")
	}
}

// TestSyncNotifyDropped: a queued message given up on (the receiver went
// away) never reached systemd: SyncNotify says so rather than true.
func TestSyncNotifyDropped(t *testing.T) {
	path := t.TempDir() + "/notify.sock"
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	t.Cleanup(closeNotifier)
	closeNotifier()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])

	fillNotifyQueue(t, p[1])
	synced := make(chan bool, 1)
	go func() { synced <- SyncNotify(30 * time.Second) }()
	// Once SyncNotify waits, the receiver goes away unread (closing it
	// discards its queue): what waited is dropped.
	for deadline := time.Now().Add(10 * time.Second); ; {
		notifySock.mu.Lock()
		waiting := notifySock.moved != nil
		notifySock.mu.Unlock()
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SyncNotify returned or never waited")
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
	os.Remove(path)
	if <-synced {
		t.Error("SyncNotify = true though the queued messages were dropped")
	}
}
