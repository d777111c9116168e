package testd

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/ipc"
)

// Default timings of Start and of the cleanup it registers.
const (
	// ListenWithin is how long Start waits for the socket to accept.
	ListenWithin = 15 * time.Second
	// StopWithin is how long the cleanup waits after SIGTERM before it
	// kills the daemon and fails the test.
	StopWithin = 30 * time.Second
	// LogTailBytes is how much of the log a failing test shows.
	LogTailBytes = 6000
)

// Config says how to start one corrald.
type Config struct {
	// Name, if set, tells this daemon from others in messages.
	Name string
	// Corrald is the path of the corrald binary (see Build).
	Corrald string
	// Dir holds the daemon's files unless given below: Dir/corrald.sock,
	// Dir/state and Dir/corrald.log. The caller owns it (t.TempDir).
	Dir string
	// Socket, StateDir and LogPath override the paths in Dir. Daemons run
	// one after another on the same socket and state directory (a restart)
	// need a LogPath each: Start truncates it.
	Socket, StateDir, LogPath string
	// CgroupBase, when set, is passed as --cgroup-base (see CgroupBase).
	CgroupBase string
	// Args are further flags. They come after the ones Start passes
	// (--socket, --state-dir, --cgroup-base, --config /dev/null,
	// --log-level debug, --log-format json, --kill-wait 2s), and a flag
	// given twice takes its last value, so Args may override those.
	Args []string
	// Env is added to this process's environment for the daemon.
	Env []string
	// ExtraFiles are inherited by the daemon as fds 3 and up. Start does
	// not close them.
	ExtraFiles []*os.File
}

// Daemon is one corrald started by Start. Its fields are fixed once Start
// returns. A Daemon is owned by the test goroutine that started it; Exited,
// Done and WaitErr may be called from any goroutine.
//
// A Daemon is running until it exits (on its own, by Stop or Signal, or by
// the cleanup); exited is terminal.
type Daemon struct {
	Socket, StateDir, LogPath string
	// CgroupBase is Config.CgroupBase ("" if none was given).
	CgroupBase string

	name    string // "corrald", or "corrald <Config.Name>"
	t       testing.TB
	cmd     *exec.Cmd
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's result, set before done is closed
}

// Start runs corrald as cfg says and returns once its socket accepts a
// connection. If it does not within ListenWithin, or exits first, Start
// fails the test with the tail of the log.
//
// Start registers a cleanup that stops the daemon if it still runs
// (SIGTERM, then SIGKILL after StopWithin, failing the test in that case)
// and, when the test failed, logs the tail of the daemon's log.
func Start(t testing.TB, cfg Config) *Daemon {
	t.Helper()
	d := &Daemon{
		Socket:     or(cfg.Socket, filepath.Join(cfg.Dir, "corrald.sock")),
		StateDir:   or(cfg.StateDir, filepath.Join(cfg.Dir, "state")),
		LogPath:    or(cfg.LogPath, filepath.Join(cfg.Dir, "corrald.log")),
		CgroupBase: cfg.CgroupBase,
		name:       strings.TrimSpace("corrald " + cfg.Name),
		t:          t,
		done:       make(chan struct{}),
	}
	args := []string{"--socket", d.Socket, "--state-dir", d.StateDir}
	if d.CgroupBase != "" {
		args = append(args, "--cgroup-base", d.CgroupBase)
	}
	// --config /dev/null: the host's /etc/corral/corrald.conf must not
	// change what a test runs.
	args = append(args, "--config", "/dev/null", "--log-level", "debug", "--log-format", "json", "--kill-wait", "2s")
	logf, err := os.Create(d.LogPath)
	if err != nil {
		t.Fatalf("%s log: %v", d.name, err)
	}
	d.cmd = exec.Command(cfg.Corrald, append(args, cfg.Args...)...)
	if cfg.Env != nil {
		d.cmd.Env = append(os.Environ(), cfg.Env...)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.ExtraFiles = cfg.ExtraFiles
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", d.name, err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		logf.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		if !d.Exited() {
			if err := d.Stop(syscall.SIGTERM, StopWithin); err != nil {
				t.Errorf("stop %s: %v", d.name, err)
			}
		}
		if t.Failed() {
			t.Logf("%s log %s (tail):\n%s", d.name, d.LogPath, d.LogTail(LogTailBytes))
		}
	})
	deadline := time.Now().Add(ListenWithin)
	for {
		if c, err := net.Dial("unix", d.Socket); err == nil {
			c.Close()
			return d
		}
		if d.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s (exited: %v %v):\n%s", d.name, d.Socket, d.Exited(), d.WaitErr(), d.LogTail(LogTailBytes))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// Pid is the daemon's process id (its process may have exited).
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Signal sends sig to the daemon.
func (d *Daemon) Signal(sig os.Signal) error {
	if err := d.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", d.name, err)
	}
	return nil
}

// Done is closed once the daemon has exited and been reaped.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Exited reports whether the daemon has exited and been reaped.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// WaitErr is how the daemon exited (exec.Cmd.Wait's error: nil for exit
// status 0), or nil while it runs.
func (d *Daemon) WaitErr() error {
	if !d.Exited() {
		return nil
	}
	return d.waitErr
}

// Stop sends sig unless the daemon has exited and waits up to within for
// it to exit; after that it kills it with SIGKILL, waits for that, and
// returns an error.
func (d *Daemon) Stop(sig syscall.Signal, within time.Duration) error {
	if !d.Exited() {
		_ = d.cmd.Process.Signal(sig)
	}
	select {
	case <-d.done:
		return nil
	case <-time.After(within):
		_ = d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("%s did not exit within %v of %v; killed", d.name, within, sig)
	}
}

// Client dials the daemon's socket; the test that started the daemon fails
// if it cannot, and its cleanup closes the client.
func (d *Daemon) Client() *ipc.Client {
	d.t.Helper()
	c, err := ipc.Dial(d.Socket)
	if err != nil {
		d.t.Fatalf("dial %s: %v", d.name, err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

// LogTail returns the last n bytes of the daemon's log so far.
func (d *Daemon) LogTail(n int) string {
	b, err := os.ReadFile(d.LogPath)
	if err != nil {
		return fmt.Sprintf("(read %s log: %v)", d.name, err)
	}
	return Tail(string(b), n)
}
