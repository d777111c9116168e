package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// emit appends s to stream of execution id, announced to the next follow.
func (d *fakeDaemon) emit(id, stream, s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	x := d.execs[id]
	x.notes = append(x.notes, api.OutputNotification{ID: id, Stream: stream, Offset: int64(len(x.out[stream])), Data: []byte(s)})
	x.out[stream] = append(x.out[stream], s...)
	x.rec.Stdout.TotalBytes = int64(len(x.out["stdout"]))
	x.rec.Stderr.TotalBytes = int64(len(x.out["stderr"]))
}

func (d *fakeDaemon) count(f func(d *fakeDaemon) int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return f(d)
}

// fakeSocket serves fake daemons one after the other on one socket path, as
// corrald restarting does.
type fakeSocket struct {
	t      *testing.T
	path   string
	srv    *ipc.Server
	served chan error
}

func newFakeSocket(t *testing.T, d *fakeDaemon) *fakeSocket {
	f := &fakeSocket{t: t, path: filepath.Join(t.TempDir(), "corrald.sock")}
	f.serve(d)
	t.Cleanup(f.stop)
	return f
}

func (f *fakeSocket) serve(d *fakeDaemon) { f.serveMax(d, 0) }

// serveMax serves d taking at most maxConns connections (0: the default).
func (f *fakeSocket) serveMax(d *fakeDaemon, maxConns int) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.path, Net: "unix"})
	if err != nil {
		f.t.Fatal(err)
	}
	f.srv = ipc.NewServer(d, zerolog.New(zerolog.NewTestWriter(f.t)).Level(zerolog.ErrorLevel))
	if maxConns > 0 {
		f.srv.MaxConns = maxConns
	}
	f.served = make(chan error, 1)
	go func(srv *ipc.Server, served chan error) { served <- srv.Serve(l) }(f.srv, f.served)
}

func (f *fakeSocket) stop() {
	if f.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		f.t.Errorf("shutdown: %v", err)
	}
	if err := <-f.served; !errors.Is(err, ipc.ErrServerClosed) {
		f.t.Errorf("Serve: %v", err)
	}
	f.srv = nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// running is a corralctl started in the background.
type running struct {
	t         *testing.T
	out, errb *syncBuffer
	res       chan result
}

func startCorralctl(t *testing.T, socket string, stdin io.Reader, sigs <-chan os.Signal, args ...string) *running {
	r := &running{t: t, out: &syncBuffer{}, errb: &syncBuffer{}, res: make(chan result, 1)}
	e := &env{stdin: stdin, stdout: r.out, stderr: r.errb, getenv: func(k string) string {
		if k == ipc.SocketEnv {
			return socket
		}
		return ""
	}}
	if sigs != nil {
		e.notifySignals = func() (<-chan os.Signal, func()) { return sigs, func() {} }
	}
	go func() {
		code := Main(args, e)
		r.res <- result{code, r.out.String(), r.errb.String()}
	}()
	return r
}

// until waits for cond while corralctl runs; false when it ended first or
// after a generous bound (the bug these tests catch is a hang).
func (r *running) until(cond func() bool) bool {
	bound := time.After(30 * time.Second)
	for !cond() {
		select {
		case x := <-r.res:
			r.res <- x
			return false
		case <-bound:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// end waits for corralctl to exit; it fails the test when it runs on.
func (r *running) end(what string) result {
	select {
	case x := <-r.res:
		return x
	case <-time.After(30 * time.Second):
		r.t.Fatalf("%s: corralctl still running after 30 s; stderr %q", what, r.errb.String())
		return result{}
	}
}

func startHang(t *testing.T, d *fakeDaemon) {
	if _, err := d.Start(context.Background(), api.Owner{}, api.StartParams{Argv: []string{"hang"}}); err != nil {
		t.Fatal(err)
	}
}

func cancelExec(d *fakeDaemon, id string) {
	_, _ = d.Cancel(context.Background(), api.Owner{}, api.CancelParams{ID: id})
}

// TestRunWritesEachByteOnceAcrossARestart: output on both streams before
// and after corrald restarts reaches run's stdout and stderr once each, in
// order (run follows on from the offsets it wrote, not from 0).
func TestRunWritesEachByteOnceAcrossARestart(t *testing.T) {
	d := &fakeDaemon{}
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader(""), nil, "run", "--", "twice")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool {
		return strings.Contains(r.out.String(), "out1\n") && strings.Contains(r.errb.String(), "err1\n")
	}) {
		t.Fatalf("run did not write the first output: stdout %q, stderr %q", r.out.String(), r.errb.String())
	}
	f.stop()
	d.emit("exec-1", "stdout", "out2\n")
	d.emit("exec-1", "stderr", "err2\n")
	f.serve(d)
	if !r.until(func() bool {
		return strings.Contains(r.out.String(), "out2\n") && strings.Contains(r.errb.String(), "err2\n")
	}) {
		t.Fatalf("run did not write the output after the restart: stdout %q, stderr %q", r.out.String(), r.errb.String())
	}
	cancelExec(d, "exec-1")
	res := r.end("run")
	if res.code != 143 || res.stdout != "out1\nout2\n" {
		t.Errorf("run across a restart = %d, stdout %q; want 143 and out1, out2 once each", res.code, res.stdout)
	}
	if strings.Count(res.stderr, "err1\n") != 1 || strings.Count(res.stderr, "err2\n") != 1 || strings.Index(res.stderr, "err1\n") > strings.Index(res.stderr, "err2\n") {
		t.Errorf("run across a restart: stderr %q; want err1 then err2, once each", res.stderr)
	}
}

// TestRedialGivesUpOnAPeerThatClosesAtOnce: a socket that accepts and
// closes at once (corrald at its connection limit, an old image still
// accepting) is not taken for corrald back: wait, run and logs -f give up
// after one budget, without claiming to have reconnected, and with a
// back-off (not a connection every few microseconds).
func TestRedialGivesUpOnAPeerThatClosesAtOnce(t *testing.T) {
	old := runRedialFor
	runRedialFor = 2 * time.Second
	defer func() { runRedialFor = old }()
	for _, tt := range []struct {
		name  string
		args  []string
		calls func(d *fakeDaemon) int
	}{
		{"wait", []string{"wait", "exec-1"}, func(d *fakeDaemon) int { return d.waits }},
		{"run", []string{"run", "--", "hang"}, func(d *fakeDaemon) int { return d.follows }},
		{"logs -f", []string{"logs", "-f", "exec-1"}, func(d *fakeDaemon) int { return d.follows }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDaemon{}
			if tt.name != "run" {
				startHang(t, d)
			}
			f := newFakeSocket(t, d)
			r := startCorralctl(t, f.path, strings.NewReader(""), nil, tt.args...)
			if !r.until(func() bool { return d.count(tt.calls) >= 1 }) {
				t.Fatalf("%s did not start waiting: stderr %q", tt.name, r.errb.String())
			}
			f.stop()
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			accepted := 0
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					accepted++
					mu.Unlock()
					c.Close()
				}
			}()
			res := r.end(tt.name)
			l.Close()
			<-closed
			want := 125
			if tt.name == "logs -f" {
				want = 1
			}
			if res.code != want || strings.Contains(res.stderr, "; reconnected") || !strings.Contains(res.stderr, "not reconnected within 2s") {
				t.Errorf("%s with a peer closing at once = %d, stderr %q; want %d, no \"reconnected\", and \"not reconnected within 2s\"", tt.name, res.code, res.stderr, want)
			}
			mu.Lock()
			defer mu.Unlock()
			if accepted == 0 || accepted > 50 {
				t.Errorf("%s made %d connections in its 2 s budget; want a few, with a back-off", tt.name, accepted)
			}
		})
	}
}

// TestRunCancelsAcrossTheGap: a SIGINT while corrald is away is not lost:
// the cancel is sent on the connection the redial makes, and run ends with
// the execution.
func TestRunCancelsAcrossTheGap(t *testing.T) {
	d := &fakeDaemon{}
	f := newFakeSocket(t, d)
	sigs := make(chan os.Signal, 2)
	r := startCorralctl(t, f.path, strings.NewReader(""), sigs, "run", "--", "hang")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.follows }) >= 1 }) {
		t.Fatalf("run did not follow: stderr %q", r.errb.String())
	}
	f.stop()
	sigs <- syscall.SIGINT
	if !r.until(func() bool { return strings.Contains(r.errb.String(), "cancelling exec-1") }) {
		t.Fatalf("run did not take the SIGINT: stderr %q", r.errb.String())
	}
	f.serve(d)
	res := r.end("run")
	if rec, _ := d.Get(context.Background(), api.Owner{}, api.IDParams{ID: "exec-1"}); rec.CancelReason != "corralctl received SIGINT" {
		t.Errorf("after a SIGINT while corrald was away: cancel reason %q, want the SIGINT's (stderr %q)", rec.CancelReason, res.stderr)
	}
	if res.code != 143 || !strings.Contains(res.stderr, "sending the cancel") {
		t.Errorf("run = %d, stderr %q; want 143 and a note that the kept cancel was sent", res.code, res.stderr)
	}
}

// TestWaitTimeoutKeptWhileCorraldIsAway: wait --timeout ends at its
// timeout (124) when corrald does not come back, not after the redial's
// budget with 125.
func TestWaitTimeoutKeptWhileCorraldIsAway(t *testing.T) {
	d := &fakeDaemon{}
	startHang(t, d)
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader(""), nil, "wait", "--timeout", "1s", "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.waits }) >= 1 }) {
		t.Fatalf("wait did not wait: stderr %q", r.errb.String())
	}
	f.stop()
	res := r.end("wait")
	if res.code != exitTimeout || !strings.Contains(res.stderr, "--timeout 1s passed") {
		t.Errorf("wait --timeout 1s with corrald gone = %d, stderr %q; want %d and why", res.code, res.stderr, exitTimeout)
	}
}

// TestRunStdinSaysHowToReattach: run -i does not redial (its stdin
// forwarder holds the old connection) but says that the execution runs on
// and how to get at it.
func TestRunStdinSaysHowToReattach(t *testing.T) {
	d := &fakeDaemon{}
	f := newFakeSocket(t, d)
	pr, pw := io.Pipe()
	defer pw.Close()
	r := startCorralctl(t, f.path, pr, nil, "run", "-i", "--", "cat")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.follows }) >= 1 }) {
		t.Fatalf("run -i did not follow: stderr %q", r.errb.String())
	}
	f.stop()
	res := r.end("run -i")
	if res.code != 125 || !strings.Contains(res.stderr, "runs on") || !strings.Contains(res.stderr, "corralctl wait exec-1") || !strings.Contains(res.stderr, "corralctl logs -f exec-1") {
		t.Errorf("run -i across a restart = %d, stderr %q; want 125, that it runs on, and corralctl wait/logs -f exec-1", res.code, res.stderr)
	}
}

// TestRedialToADaemonThatDoesNotKnowTheID: when the corrald that answers
// after the loss does not know the execution, wait says it may be another
// daemon, not only that the id is wrong.
func TestRedialToADaemonThatDoesNotKnowTheID(t *testing.T) {
	d := &fakeDaemon{}
	startHang(t, d)
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader(""), nil, "wait", "exec-1")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.waits }) >= 1 }) {
		t.Fatalf("wait did not wait: stderr %q", r.errb.String())
	}
	f.stop()
	f.serve(&fakeDaemon{})
	res := r.end("wait")
	if res.code != 125 || !strings.Contains(res.stderr, "may be a different daemon") {
		t.Errorf("wait redialled to a daemon without exec-1 = %d, stderr %q; want 125 and that it may be another daemon", res.code, res.stderr)
	}
}

// TestHelpSaysWhatIsRedialled: run --help, wait --help and the man page say
// what happens across a corrald reload or restart.
func TestHelpSaysWhatIsRedialled(t *testing.T) {
	for _, args := range [][]string{{"run", "--help"}, {"wait", "--help"}, {"logs", "--help"}, {manCommand}} {
		r := corralctl(t, "/nonexistent", "", nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "15 s after the connection was lost") || !strings.Contains(r.stdout, "do not redial") {
			t.Errorf("corralctl %s = %d, stdout without the redial's paragraph:\n%s", strings.Join(args, " "), r.code, r.stdout)
		}
	}
}

// TestRedialGivesUpOnAFullCorrald: a corrald at its connection limit
// answers -32003 and closes; the redial takes that for a failed dial (no
// "reconnected") and wait ends with 125 after its budget.
func TestRedialGivesUpOnAFullCorrald(t *testing.T) {
	old := runRedialFor
	runRedialFor = 2 * time.Second
	defer func() { runRedialFor = old }()
	d := &fakeDaemon{}
	startHang(t, d)
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader(""), nil, "wait", "exec-1")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.waits }) >= 1 }) {
		t.Fatalf("wait did not wait: stderr %q", r.errb.String())
	}
	f.stop()
	f.serveMax(d, 1)
	holder, err := ipc.Dial(f.path) // takes the one connection
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.Info(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := r.end("wait")
	if res.code != 125 || strings.Contains(res.stderr, "; reconnected") || !strings.Contains(res.stderr, "too many connections") {
		t.Errorf("wait against a full corrald = %d, stderr %q; want 125, no \"reconnected\", and corrald's -32003", res.code, res.stderr)
	}
}

// TestRedialBudgetSpansConnectionsThatBreakAtOnce: a peer that answers the
// redial's exec.get and then closes (a dying image) does not give each new
// connection a fresh budget: wait ends after one budget, with a back-off.
func TestRedialBudgetSpansConnectionsThatBreakAtOnce(t *testing.T) {
	old := runRedialFor
	runRedialFor = 2 * time.Second
	defer func() { runRedialFor = old }()
	d := &fakeDaemon{}
	startHang(t, d)
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader(""), nil, "wait", "exec-1")
	defer cancelExec(d, "exec-1")
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.waits }) >= 1 }) {
		t.Fatalf("wait did not wait: stderr %q", r.errb.String())
	}
	f.stop()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: f.path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	accepted := 0
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			// Answer the first request (exec.get) with a running record,
			// then close.
			var req struct {
				ID int64 `json:"id"`
			}
			if json.NewDecoder(c).Decode(&req) == nil {
				fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%d,"result":{"id":"exec-1","state":"running"}}`+"\n", req.ID)
			}
			c.Close()
		}
	}()
	res := r.end("wait")
	l.Close()
	<-closed
	if res.code != 125 || !strings.Contains(res.stderr, "not reconnected within 2s") {
		t.Errorf("wait against a peer that answers then closes = %d, stderr %q; want 125 and \"not reconnected within 2s\"", res.code, res.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if accepted == 0 || accepted > 50 {
		t.Errorf("wait made %d connections in its 2 s budget; want a few, with a back-off", accepted)
	}
}

// TestRunStdinAtEOFGoesOnAcrossARestart: once all of run -i's stdin reached
// corrald (EOF, the close taken), nothing rides on the old connection, and
// run -i redials as plain run does.
func TestRunStdinAtEOFGoesOnAcrossARestart(t *testing.T) {
	d := &fakeDaemon{}
	f := newFakeSocket(t, d)
	r := startCorralctl(t, f.path, strings.NewReader("abc"), nil, "run", "-i", "--", "sink")
	defer cancelExec(d, "exec-1")
	closedIn := func() bool {
		x, err := d.lookup("exec-1")
		if err != nil {
			return false
		}
		select {
		case <-x.stdinEOF:
			return d.count(func(d *fakeDaemon) int { return d.follows }) >= 1
		default:
			return false
		}
	}
	if !r.until(closedIn) {
		t.Fatalf("run -i did not send its stdin: stderr %q", r.errb.String())
	}
	f.stop()
	f.serve(d)
	if !r.until(func() bool { return d.count(func(d *fakeDaemon) int { return d.follows }) >= 2 }) {
		res := r.end("run -i")
		t.Fatalf("run -i at EOF across a restart = %d, stderr %q; want it to follow on", res.code, res.stderr)
	}
	cancelExec(d, "exec-1")
	res := r.end("run -i")
	x, _ := d.lookup("exec-1")
	if res.code != 143 || !strings.Contains(res.stderr, "; reconnected") || x.stdin.String() != "abc" {
		t.Errorf("run -i at EOF across a restart = %d, stderr %q, stdin %q; want 143, reconnected, abc", res.code, res.stderr, x.stdin.String())
	}
}
