package bench

// The (b) step's bound for corrald's design: an exit seen through a pidfd in
// an epoll loop (corrald's own eventloop package, one goroutine) in another
// process, announced as an exec.state notification on a Unix socket and
// decoded by a reader in this process, with no store, no cgroup reads and
// no RPC. What it takes beyond the wait4 floor is the inter-process hop
// corrald cannot avoid: the loop's wake-up and the client's.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
)

// notifyPeerEnv, set in the environment of the test binary, turns it into
// the notification peer (runNotifyPeer) on the socket at fd 3.
const notifyPeerEnv = "CORRAL_BENCH_NOTIFY_PEER"

// notifyPeer is the running peer process and this side of its socket.
type notifyPeer struct {
	cmd  *exec.Cmd
	conn net.Conn
	rd   *bufio.Reader
	mark string
}

// startNotifyPeer starts the peer; it is stopped (and any sleep of its
// left killed) at the test's cleanup.
func startNotifyPeer(t *testing.T) *notifyPeer {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "notify-peer"), os.NewFile(uintptr(fds[1]), "notify-peer-child")
	p := &notifyPeer{mark: markValue() + "-notify-peer"}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), notifyPeerEnv+"="+p.mark)
	p.cmd.ExtraFiles = []*os.File{theirs}
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start notify peer: %v", err)
	}
	theirs.Close()
	p.conn, err = net.FileConn(ours) // this process's netpoller, as ipc.Client
	ours.Close()
	if err != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		t.Fatalf("notify peer socket: %v", err)
	}
	p.rd = bufio.NewReader(p.conn)
	t.Cleanup(func() {
		p.conn.Close() // the peer's loop sees EOF and returns
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("notify peer: %v", err)
			}
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
			t.Errorf("notify peer did not stop within 5s of its socket closing")
		}
		killMarked(p.mark)
	})
	return p
}

// sample is one (b) sample through the peer: it starts sleep 60, the
// benchmark SIGKILLs it at T0, and the figure is T0 to the decoded
// exec.state notification.
func (p *notifyPeer) sample(t *testing.T) time.Duration {
	t.Helper()
	if _, err := p.conn.Write([]byte("start\n")); err != nil {
		t.Fatalf("notify peer: %v", err)
	}
	line, err := p.rd.ReadString('\n')
	if err != nil {
		t.Fatalf("notify peer: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil {
		t.Fatalf("notify peer answered %q, want pid N", line)
	}
	waitBlocked(pid, "sleep")
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := p.rd.ReadBytes('\n')
	if err != nil {
		t.Fatalf("no notification from the peer for %d: %v", pid, err)
	}
	// As ipc.Client: the frame is decoded, then the handler sees it.
	var msg struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		t.Fatalf("notification %q: %v", b, err)
	}
	at := time.Now()
	var n api.StateNotification
	if err := json.Unmarshal(msg.Params, &n); err != nil || msg.Method != api.NotifyState || n.Record.PID != pid || n.Record.State != api.StateExited {
		t.Fatalf("notification %s for %d: %v", b, pid, err)
	}
	return at.Sub(t0)
}

// runNotifyPeer is the peer: one eventloop on the socket at fd 3 and the
// pidfds of the sleeps it starts. "start\n" starts a sleep 60 and answers
// "pid N\n"; when a sleep's pidfd is readable the loop reaps it and writes
// an exec.state notification of an exited record, the size of corrald's.
// EOF on the socket ends it.
func runNotifyPeer() int {
	if err := notifyPeerLoop(os.Getenv(notifyPeerEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "notify peer:", err)
		return 1
	}
	return 0
}

func notifyPeerLoop(mark string) error {
	const sock = 3
	unix.CloseOnExec(sock) // the sleeps it starts do not inherit it
	if err := unix.SetNonblock(sock, true); err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	loop, err := eventloop.New()
	if err != nil {
		return err
	}
	defer loop.Close()
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	var (
		in      []byte
		failure error
	)
	fail := func(err error) {
		if failure == nil {
			failure = err
		}
		loop.Stop()
	}
	send := func(b []byte) {
		for len(b) > 0 { // a few hundred bytes: the socket takes them
			n, err := unix.Write(sock, b)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				fail(fmt.Errorf("write: %w", err))
				return
			}
			b = b[n:]
		}
	}
	start := func() {
		pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "60"}, &syscall.ProcAttr{
			Env:   []string{markEnv + "=" + mark},
			Files: []uintptr{devnull.Fd(), devnull.Fd(), devnull.Fd()},
		})
		if err != nil {
			fail(fmt.Errorf("start sleep: %w", err))
			return
		}
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			fail(fmt.Errorf("pidfd_open %d: %w", pid, err))
			return
		}
		startedAt := time.Now()
		if err := loop.Add(pidfd, eventloop.Readable, func(eventloop.Events) {
			_ = loop.Remove(pidfd)
			unix.Close(pidfd)
			var ws unix.WaitStatus
			var ru unix.Rusage
			if _, err := unix.Wait4(pid, &ws, 0, &ru); err != nil {
				fail(fmt.Errorf("wait4 %d: %w", pid, err))
				return
			}
			send(peerNote(pid, ws, &ru, startedAt))
		}); err != nil {
			fail(err)
			return
		}
		send([]byte("pid " + strconv.Itoa(pid) + "\n"))
	}
	buf := make([]byte, 512)
	if err := loop.Add(sock, eventloop.Readable, func(eventloop.Events) {
		n, err := unix.Read(sock, buf)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			return
		case err != nil:
			fail(fmt.Errorf("read: %w", err))
			return
		case n == 0:
			loop.Stop() // the benchmark is done
			return
		}
		in = append(in, buf[:n]...)
		for {
			i := strings.IndexByte(string(in), '\n')
			if i < 0 {
				return
			}
			cmd := string(in[:i])
			in = in[i+1:]
			if cmd != "start" {
				fail(fmt.Errorf("unknown command %q", cmd))
				return
			}
			start()
		}
	}); err != nil {
		return err
	}
	if err := loop.Run(context.Background()); err != nil && !errors.Is(err, eventloop.ErrClosed) {
		return err
	}
	return failure
}

// peerNote is the exec.state notification of pid's exited record, encoded
// as corrald encodes one (encoding/json, one line).
func peerNote(pid int, ws unix.WaitStatus, ru *unix.Rusage, startedAt time.Time) []byte {
	now := time.Now()
	sig := unix.SignalName(ws.Signal())
	outcome := api.OutcomeSignaled
	rec := api.Record{
		ID: fmt.Sprintf("01%030d", pid), Owner: api.Owner{PID: int32(os.Getpid())}, State: api.StateExited, PID: pid,
		Argv: []string{"sleep", "60"}, CreatedAt: startedAt, StartedAt: &startedAt,
		ExitedAt: &now, DurationMS: now.Sub(startedAt).Milliseconds(), Signal: &sig, Outcome: &outcome,
		Scope: "corral-bench/exec-" + strconv.Itoa(pid), Backend: "cgroup", Network: "host",
		Usage: api.Usage{CPUUserMS: ru.Utime.Nano() / 1e6, CPUSystemMS: ru.Stime.Nano() / 1e6, PeakMemoryBytes: ru.Maxrss * 1024},
	}
	note := struct {
		JSONRPC string                `json:"jsonrpc"`
		Method  string                `json:"method"`
		Params  api.StateNotification `json:"params"`
	}{"2.0", api.NotifyState, api.StateNotification{Record: rec}}
	b, err := json.Marshal(note)
	if err != nil {
		panic(err) // a fixed shape: cannot fail
	}
	return append(b, '\n')
}
