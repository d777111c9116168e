package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// fakeExec is one execution of fakeDaemon. What it does is chosen by
// argv[0]:
//
//	print CODE  writes to stdout and stderr (one stdout notification is
//	            "dropped" so the client must fetch it) and exits CODE
//	timeout     times out (SIGKILL)
//	killed      dies from SIGKILL
//	missing     cannot be started (ENOENT)
//	refuse      exec.start fails with -32003
//	hang        runs until cancelled, then is SIGTERMed
//	stubborn    never ends, even when cancelled
//	chatty      writes a line at once, then runs until cancelled
//	twice       as chatty, on stdout and stderr (fakeDaemon.emit adds more)
//	cat         echoes its stdin (stdin_open) to stdout once stdin is closed
//	sink        takes its stdin (stdin_open), then runs until cancelled
//	big         writes 2 MiB to stdout in 4 KiB chunks, every other one dropped
type fakeExec struct {
	rec       api.Record
	out       map[string][]byte
	notes     []api.OutputNotification // what Follow announces
	cancelled chan struct{}
	stdin     bytes.Buffer
	stdinEOF  chan struct{}
}

type fakeDaemon struct {
	mu    sync.Mutex
	execs map[string]*fakeExec
	order []string
	n     int
	// signals records exec.signal calls as "id SIG target".
	signals []string
	// updates records exec.update calls as "id TIMEOUT_MS"; resizes
	// exec.resize calls as "id ROWSxCOLS".
	updates, resizes []string
	// traceparents records exec.start's traceparent params.
	traceparents []string
	// follows and waits count exec.follow and exec.wait calls.
	follows, waits int
}

var _ ipc.Service = (*fakeDaemon)(nil)

func (d *fakeDaemon) lookup(id string) (*fakeExec, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	x, ok := d.execs[id]
	if !ok {
		return nil, api.ErrNotFound
	}
	return x, nil
}

func (d *fakeDaemon) snapshot(x *fakeExec) api.Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return x.rec
}

func (d *fakeDaemon) Start(_ context.Context, caller api.Owner, p api.StartParams) (api.Record, error) {
	if len(p.Argv) == 0 {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "params.argv: required")
	}
	if p.Argv[0] == "refuse" {
		return api.Record{}, api.Errorf(api.CodeOverCapacity, "too many running executions")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	d.traceparents = append(d.traceparents, p.Traceparent)
	id := p.ID
	if id == "" {
		id = fmt.Sprintf("exec-%d", d.n)
	}
	now := time.Now()
	x := &fakeExec{
		rec: api.Record{ID: id, Owner: caller, Argv: p.Argv, Labels: p.Labels, State: api.StateRunning,
			PID: 1000 + d.n, CreatedAt: now, StartedAt: &now},
		out:       map[string][]byte{},
		cancelled: make(chan struct{}),
		stdinEOF:  make(chan struct{}),
	}
	if u := p.Labels["unenforced"]; u != "" {
		x.rec.Unenforced, x.rec.Backend = strings.Split(u, ","), "cgroup"
	}
	emit := func(stream, s string, announce bool) {
		n := api.OutputNotification{ID: id, Stream: stream, Offset: int64(len(x.out[stream])), Data: []byte(s)}
		x.out[stream] = append(x.out[stream], s...)
		if announce {
			x.notes = append(x.notes, n)
		}
	}
	switch p.Argv[0] {
	case "print":
		emit("stdout", "hello\n", true)
		emit("stderr", "warning\n", true)
		emit("stdout", "dropped line\n", false)
		emit("stdout", "bye\n", true)
		emit("stdout", "last line, also dropped\n", false)
		code := 0
		if len(p.Argv) > 1 {
			fmt.Sscan(p.Argv[1], &code)
		}
		finish(&x.rec, api.OutcomeExited, &code, nil)
	case "big":
		for i := range 512 {
			emit("stdout", strings.Repeat(string(rune('a'+i%26)), 4095)+"\n", i%2 == 0)
		}
		finish(&x.rec, api.OutcomeExited, ptr(0), nil)
	case "timeout":
		finish(&x.rec, api.OutcomeTimeout, nil, ptr("SIGKILL"))
	case "killed":
		finish(&x.rec, api.OutcomeSignaled, nil, ptr("SIGKILL"))
	case "missing":
		x.rec.PID = 0
		x.rec.StartErrno = "ENOENT"
		x.rec.Error = ptr(`exec "missing": no such file or directory`)
		finish(&x.rec, api.OutcomeStartFailed, nil, nil)
	case "chatty":
		emit("stdout", "chat\n", true)
	case "twice":
		emit("stdout", "out1\n", true)
		emit("stderr", "err1\n", true)
	case "hang", "stubborn":
	case "cat", "sink":
		if !p.StdinOpen {
			return api.Record{}, api.Errorf(api.CodeInvalidParams, "cat needs stdin_open")
		}
	default:
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "fake: unknown command %q", p.Argv[0])
	}
	x.rec.Stdout = api.StreamInfo{TotalBytes: int64(len(x.out["stdout"])), KeptBytes: int64(len(x.out["stdout"]))}
	x.rec.Stderr = api.StreamInfo{TotalBytes: int64(len(x.out["stderr"])), KeptBytes: int64(len(x.out["stderr"]))}
	if d.execs == nil {
		d.execs = map[string]*fakeExec{}
	}
	d.execs[id] = x
	d.order = append(d.order, id)
	return x.rec, nil
}

func finish(r *api.Record, o api.Outcome, code *int, sig *string) {
	now := time.Now()
	r.State = api.StateCleaned
	r.Outcome = &o
	r.ExitCode = code
	r.Signal = sig
	r.ExitedAt, r.CleanedAt = &now, &now
	r.DurationMS = 1234
}

func (d *fakeDaemon) Get(_ context.Context, _ api.Owner, p api.IDParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	return d.snapshot(x), nil
}

// settle blocks until a hang or cat execution ends.
func (d *fakeDaemon) settle(ctx context.Context, x *fakeExec) error {
	switch x.rec.Argv[0] {
	case "stubborn":
		<-ctx.Done()
		return ctx.Err()
	case "hang", "chatty", "twice", "sink":
		select {
		case <-x.cancelled:
		case <-ctx.Done():
			return ctx.Err()
		}
	case "cat":
		select {
		case <-x.stdinEOF:
		case <-x.cancelled:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (d *fakeDaemon) Wait(ctx context.Context, _ api.Owner, p api.WaitParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	d.mu.Lock()
	d.waits++
	d.mu.Unlock()
	wctx := ctx
	if p.TimeoutMS != nil {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, time.Duration(*p.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	if err := d.settle(wctx, x); err != nil && ctx.Err() != nil {
		return api.Record{}, err
	}
	return d.snapshot(x), nil
}

func (d *fakeDaemon) Cancel(_ context.Context, _ api.Owner, p api.CancelParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if x.rec.Argv[0] == "stubborn" {
		x.rec.CancelReason = p.Reason
		x.rec.State = api.StateCanceling
		return x.rec, nil
	}
	if !x.rec.State.Finished() {
		x.rec.CancelReason = p.Reason
		finish(&x.rec, api.OutcomeCancelled, nil, ptr("SIGTERM"))
		close(x.cancelled)
	}
	return x.rec, nil
}

func (d *fakeDaemon) Signal(_ context.Context, _ api.Owner, p api.SignalParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	d.mu.Lock()
	d.signals = append(d.signals, p.ID+" "+p.Signal+" "+p.Target)
	d.mu.Unlock()
	return d.snapshot(x), nil
}

func (d *fakeDaemon) Write(_ context.Context, _ api.Owner, p api.WriteParams) (api.WriteResult, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.WriteResult{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-x.stdinEOF:
		return api.WriteResult{}, api.Errorf(api.CodeInvalidParams, "stdin is closed")
	default:
	}
	x.stdin.Write(p.Data)
	if p.Close && x.rec.Argv[0] == "sink" {
		close(x.stdinEOF)
		return api.WriteResult{}, nil
	}
	if p.Close {
		s := x.stdin.String()
		x.out["stdout"] = append(x.out["stdout"], s...)
		x.notes = append(x.notes, api.OutputNotification{ID: p.ID, Stream: "stdout", Data: []byte(s)})
		finish(&x.rec, api.OutcomeExited, ptr(0), nil)
		x.rec.Stdout.TotalBytes = int64(len(s))
		close(x.stdinEOF)
	}
	return api.WriteResult{Written: len(p.Data)}, nil
}

func (d *fakeDaemon) List(_ context.Context, _ api.Owner, p api.ListParams) (api.ListResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	res := api.ListResult{Executions: []api.Record{}}
	for _, id := range d.order {
		r := d.execs[id].rec
		if p.State != "" && r.State.String() != p.State {
			continue
		}
		match := true
		for k, v := range p.Labels {
			if r.Labels[k] != v {
				match = false
			}
		}
		if match {
			res.Executions = append(res.Executions, r)
		}
	}
	return res, nil
}

func (d *fakeDaemon) Output(_ context.Context, _ api.Owner, p api.OutputParams) (api.OutputResult, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.OutputResult{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	stream := p.Stream
	if stream == "" {
		stream = "stdout"
	}
	data := x.out[stream]
	off := min(p.Offset, int64(len(data)))
	end := int64(len(data))
	if p.Limit > 0 {
		end = min(end, off+p.Limit)
	}
	return api.OutputResult{Data: data[off:end], Offset: off, NextOffset: end, TotalBytes: int64(len(data)),
		EOF: end == int64(len(data)) && x.rec.State.Finished()}, nil
}

func (d *fakeDaemon) Follow(ctx context.Context, _ api.Owner, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	d.mu.Lock()
	d.follows++
	d.mu.Unlock()
	send := func() {
		d.mu.Lock()
		notes := append([]api.OutputNotification(nil), x.notes...)
		d.mu.Unlock()
		for _, n := range notes {
			notify(api.NotifyOutput, n)
		}
	}
	if x.rec.Argv[0] == "chatty" || x.rec.Argv[0] == "twice" {
		send()
		return d.snapshot(x), d.settle(ctx, x)
	}
	if err := d.settle(ctx, x); err != nil {
		return api.Record{}, err
	}
	send()
	return d.snapshot(x), nil
}

func (d *fakeDaemon) Update(_ context.Context, _ api.Owner, p api.UpdateParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	if p.TimeoutMS == nil {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "timeout_ms: required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.updates = append(d.updates, fmt.Sprintf("%s %d", p.ID, *p.TimeoutMS))
	if x.rec.State.Finished() {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "id: execution %s has exited; there is no deadline to move", p.ID)
	}
	dl := time.Now().Add(time.Duration(*p.TimeoutMS) * time.Millisecond)
	x.rec.Deadline = &dl
	return x.rec, nil
}

func (d *fakeDaemon) Resize(_ context.Context, _ api.Owner, p api.ResizeParams) (api.Record, error) {
	x, err := d.lookup(p.ID)
	if err != nil {
		return api.Record{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resizes = append(d.resizes, fmt.Sprintf("%s %dx%d", p.ID, p.Rows, p.Cols))
	return x.rec, nil
}

func (d *fakeDaemon) Info(context.Context) (api.Info, error) {
	return api.Info{Version: "fake-1", PID: 42, Backend: "pgroup", Cgroup: "hybrid", Kernel: "6.18",
		Default: api.Defaults{TimeoutMS: 30000, GraceMS: 2000, TasksMax: 256, OutputLimitBytes: 262144}}, nil
}

// serveFake serves a fakeDaemon on a temp socket until the test ends.
func serveFake(t *testing.T) (string, *fakeDaemon) {
	t.Helper()
	d := &fakeDaemon{}
	path := filepath.Join(t.TempDir(), "corrald.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	srv := ipc.NewServer(d, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ipc.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return path, d
}

type result struct {
	code           int
	stdout, stderr string
}

// corralctl runs Main in-process against socket.
func corralctl(t *testing.T, socket string, stdin string, sigs <-chan os.Signal, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errb,
		getenv: func(k string) string {
			if k == ipc.SocketEnv {
				return socket
			}
			return ""
		},
	}
	if sigs != nil {
		e.notifySignals = func() (<-chan os.Signal, func()) { return sigs, func() {} }
	}
	code := Main(args, e)
	return result{code, out.String(), errb.String()}
}

func TestRunStreamsOutputAndExitCode(t *testing.T) {
	sock, _ := serveFake(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string // substring
	}{
		{"exit 0", []string{"run", "--", "print", "0"}, 0, "hello\ndropped line\nbye\nlast line, also dropped\n", "warning\n"},
		{"exit 3", []string{"run", "--timeout", "5s", "print", "3"}, 3, "hello\ndropped line\nbye\nlast line, also dropped\n", "warning\n"},
		{"timeout", []string{"run", "--", "timeout"}, 124, "", "timed out"},
		{"killed", []string{"run", "--", "killed"}, 137, "", ""},
		{"not found", []string{"run", "--", "missing"}, 127, "", "no such file"},
		{"refused", []string{"run", "--", "refuse"}, 125, "", "too many running executions (code -32003)"},
		{"usage", []string{"run", "--memory", "lots", "--", "print"}, 125, "", "invalid size"},
		{"no command", []string{"run"}, 125, "", "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := corralctl(t, sock, "", nil, tt.args...)
			if r.code != tt.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", r.code, tt.wantCode, r.stderr)
			}
			if r.stdout != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tt.wantStdout)
			}
			if !strings.Contains(r.stderr, tt.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tt.wantStderr)
			}
		})
	}
}

func TestRunFillsDroppedChunks(t *testing.T) {
	sock, _ := serveFake(t)
	r := corralctl(t, sock, "", nil, "run", "--", "big")
	if r.code != 0 {
		t.Fatalf("exit code %d, stderr %q", r.code, r.stderr)
	}
	var want strings.Builder
	for i := range 512 {
		want.WriteString(strings.Repeat(string(rune('a'+i%26)), 4095) + "\n")
	}
	if r.stdout != want.String() {
		t.Fatalf("stdout has %d bytes, want the %d bytes written, in order", len(r.stdout), want.Len())
	}
}

func TestRunForwardsStdin(t *testing.T) {
	sock, _ := serveFake(t)
	r := corralctl(t, sock, "from stdin\n", nil, "run", "-i", "--", "cat")
	if r.code != 0 || r.stdout != "from stdin\n" {
		t.Fatalf("run -i cat = %d, stdout %q (stderr %q); want 0, the input", r.code, r.stdout, r.stderr)
	}
}

// waitStarted waits until corralctl's one execution has started at d,
// failing the test after 10s.
func (d *fakeDaemon) waitStarted(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		n := len(d.order)
		d.mu.Unlock()
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d executions started after 10s, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunSignalCancels(t *testing.T) {
	sock, d := serveFake(t)
	sigs := make(chan os.Signal, 1)
	done := make(chan result, 1)
	go func() { done <- corralctl(t, sock, "", sigs, "run", "--", "hang") }()
	// Wait until it runs, then interrupt corralctl.
	d.waitStarted(t)
	sigs <- syscall.SIGINT
	select {
	case r := <-done:
		if r.code != 143 {
			t.Errorf("exit code = %d, want 143 (cancelled with SIGTERM); stderr %q", r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "cancelled") {
			t.Errorf("stderr = %q, want it to say cancelled", r.stderr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not end after SIGINT")
	}
	rec := d.snapshot(d.execs[d.order[0]])
	if rec.CancelReason != "corralctl received SIGINT" {
		t.Errorf("cancel reason = %q", rec.CancelReason)
	}
}

func TestRunSecondSignalStopsWaiting(t *testing.T) {
	sock, d := serveFake(t)
	sigs := make(chan os.Signal, 2)
	done := make(chan result, 1)
	go func() { done <- corralctl(t, sock, "", sigs, "run", "--", "stubborn") }()
	d.waitStarted(t)
	sigs <- syscall.SIGINT
	x := d.execs[d.order[0]]
	deadline := time.Now().Add(10 * time.Second)
	for d.snapshot(x).State != api.StateCanceling {
		if time.Now().After(deadline) {
			t.Fatal("exec.cancel did not reach the daemon within 10s of the first signal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sigs <- syscall.SIGTERM
	select {
	case r := <-done:
		if r.code != 143 || !strings.Contains(r.stderr, "stopped waiting") {
			t.Errorf("after two signals: exit %d, stderr %q; want 143 and \"stopped waiting\"", r.code, r.stderr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not end after a second signal")
	}
}

// brokenPipe is a stdout whose reader has gone.
type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, syscall.EPIPE }

func TestRunCancelsWhenStdoutCloses(t *testing.T) {
	sock, d := serveFake(t)
	var errb bytes.Buffer
	code := Main([]string{"--socket", sock, "run", "--", "chatty"}, &env{
		stdin: strings.NewReader(""), stdout: brokenPipe{}, stderr: &errb, getenv: func(string) string { return "" },
	})
	if code != 141 {
		t.Errorf("exit code = %d, want 141 (128+SIGPIPE); stderr %q", code, errb.String())
	}
	rec := d.snapshot(d.execs[d.order[0]])
	if rec.Outcome == nil || *rec.Outcome != api.OutcomeCancelled || rec.CancelReason != "corralctl: stdout closed" {
		t.Errorf("execution after stdout closed: outcome %v, reason %q; want cancelled by corralctl", rec.Outcome, rec.CancelReason)
	}
}

func TestRunDetach(t *testing.T) {
	sock, d := serveFake(t)
	r := corralctl(t, sock, "", nil, "run", "--detach", "--label", "tool_call=t1", "--", "hang")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "exec-1" {
		t.Fatalf("run --detach = %d, %q; want 0, exec-1", r.code, r.stdout)
	}
	if got := d.snapshot(d.execs["exec-1"]).Labels["tool_call"]; got != "t1" {
		t.Errorf("label tool_call = %q, want t1", got)
	}

	r = corralctl(t, sock, "", nil, "run", "--detach", "--json", "--id", "mykey", "--", "hang")
	var rec api.Record
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rec) != nil || rec.ID != "mykey" {
		t.Fatalf("run --detach --json = %d, %q; want the record of mykey", r.code, r.stdout)
	}
}

func TestNoDaemon(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	r := corralctl(t, sock, "", nil, "run", "--", "print")
	if r.code != 125 || !strings.Contains(r.stderr, "is corrald running?") {
		t.Errorf("run without daemon = %d, %q; want 125 and a hint", r.code, r.stderr)
	}
	r = corralctl(t, sock, "", nil, "ps")
	if r.code != 1 {
		t.Errorf("ps without daemon = %d, want 1", r.code)
	}
}

func TestOtherCommands(t *testing.T) {
	sock, d := serveFake(t)
	must := func(r result, code int) result {
		t.Helper()
		if r.code != code {
			t.Fatalf("exit code %d, want %d; stdout %q stderr %q", r.code, code, r.stdout, r.stderr)
		}
		return r
	}
	must(corralctl(t, sock, "", nil, "run", "--label", "k=v", "--", "print", "2"), 2)
	must(corralctl(t, sock, "", nil, "run", "--detach", "--", "hang"), 0)

	// ps: table with both, filters passed on.
	r := must(corralctl(t, sock, "", nil, "ps"), 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "exited(2)") ||
		!strings.Contains(lines[2], "running") {
		t.Errorf("ps output:\n%s", r.stdout)
	}
	r = must(corralctl(t, sock, "", nil, "ps", "--label", "k=v", "--json"), 0)
	var list api.ListResult
	if json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Executions) != 1 || list.Executions[0].ID != "exec-1" {
		t.Errorf("ps --label k=v --json = %s", r.stdout)
	}

	// status
	r = must(corralctl(t, sock, "", nil, "status", "exec-1"), 0)
	for _, want := range []string{"exec-1", "print 2", "exited(2)", "cleaned"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = must(corralctl(t, sock, "", nil, "status", "exec-1", "--json"), 0)
	var rec api.Record
	if json.Unmarshal([]byte(r.stdout), &rec) != nil || rec.ID != "exec-1" || *rec.ExitCode != 2 {
		t.Errorf("status --json = %s", r.stdout)
	}
	r = must(corralctl(t, sock, "", nil, "status", "nope"), 1)
	if !strings.Contains(r.stderr, "execution not found (code -32001): it does not exist, is another user's, or its record has expired; corralctl ps lists yours") {
		t.Errorf("status nope: stderr %q", r.stderr)
	}
	must(corralctl(t, sock, "", nil, "status"), 2)

	// logs
	r = must(corralctl(t, sock, "", nil, "logs", "exec-1"), 0)
	if r.stdout != "hello\ndropped line\nbye\nlast line, also dropped\n" {
		t.Errorf("logs = %q", r.stdout)
	}
	r = must(corralctl(t, sock, "", nil, "logs", "--stderr", "exec-1"), 0)
	if r.stdout != "warning\n" {
		t.Errorf("logs --stderr = %q", r.stdout)
	}
	r = must(corralctl(t, sock, "", nil, "logs", "-f", "exec-1"), 0)
	if r.stdout != "hello\ndropped line\nbye\nlast line, also dropped\n" {
		t.Errorf("logs -f = %q", r.stdout)
	}

	// wait: finished -> its status; still running -> 124 after the timeout
	must(corralctl(t, sock, "", nil, "wait", "exec-1"), 2)
	r = must(corralctl(t, sock, "", nil, "wait", "--timeout", "50ms", "exec-2"), 124)
	if !strings.Contains(r.stdout, "exec-2 running") {
		t.Errorf("wait --timeout on a running execution printed %q", r.stdout)
	}

	// signal and cancel
	must(corralctl(t, sock, "", nil, "signal", "exec-2", "int", "--main"), 0)
	must(corralctl(t, sock, "", nil, "signal", "exec-2", "9"), 0)
	must(corralctl(t, sock, "", nil, "signal", "exec-2", "-TERM"), 0)
	must(corralctl(t, sock, "", nil, "signal", "exec-2", "NOPE"), 2)
	d.mu.Lock()
	sigs := strings.Join(d.signals, ";")
	d.mu.Unlock()
	if sigs != "exec-2 SIGINT main;exec-2 SIGKILL all;exec-2 SIGTERM all" {
		t.Errorf("signals sent: %q", sigs)
	}
	r = must(corralctl(t, sock, "", nil, "cancel", "--reason", "enough", "exec-2"), 0)
	if !strings.Contains(r.stdout, "cancelled(SIGTERM)") {
		t.Errorf("cancel printed %q", r.stdout)
	}
	if got := d.snapshot(d.execs["exec-2"]).CancelReason; got != "enough" {
		t.Errorf("cancel reason = %q, want enough", got)
	}
	must(corralctl(t, sock, "", nil, "wait", "exec-2"), 143)

	// info
	r = must(corralctl(t, sock, "", nil, "info"), 0)
	if !strings.Contains(r.stdout, "fake-1") || !strings.Contains(r.stdout, "pgroup") {
		t.Errorf("info = %q", r.stdout)
	}
	r = must(corralctl(t, sock, "", nil, "--json", "info"), 0)
	var info api.Info
	if json.Unmarshal([]byte(r.stdout), &info) != nil || info.Version != "fake-1" {
		t.Errorf("info --json = %q", r.stdout)
	}

	// unknown command, help
	must(corralctl(t, sock, "", nil, "frob"), 2)
	must(corralctl(t, sock, "", nil, "help"), 0)
}

// TestRunPassesTraceparent: corralctl run sends $TRACEPARENT as exec.start's
// traceparent, and nothing when it is unset.
func TestRunPassesTraceparent(t *testing.T) {
	sock, d := serveFake(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, want := range []string{tp, ""} {
		var out, errb bytes.Buffer
		code := Main([]string{"--socket", sock, "run", "--", "print", "0"}, &env{
			stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
			getenv: func(k string) string {
				if k == "TRACEPARENT" {
					return want
				}
				return ""
			},
		})
		if code != 0 {
			t.Fatalf("run with TRACEPARENT %q = exit %d, stderr %q", want, code, errb.String())
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.traceparents) != 2 || d.traceparents[0] != tp || d.traceparents[1] != "" {
		t.Errorf("exec.start traceparents = %q, want [%q \"\"]", d.traceparents, tp)
	}
}

// TestRunWarnsOfUnenforcedLimits: a limit given as a flag that corrald could
// not apply here (the record's unenforced) is said on stderr; one corrald
// applied by default (tasks_max) is not, and the command runs as before.
func TestRunWarnsOfUnenforcedLimits(t *testing.T) {
	sock, _ := serveFake(t)
	r := corralctl(t, sock, "", nil, "run", "--memory", "20M", "--label", "unenforced=memory_bytes,tasks_max", "--", "print")
	if r.code != 0 || !strings.Contains(r.stderr, "--memory is not enforced") || strings.Contains(r.stderr, "--tasks") {
		t.Errorf("run --memory with memory_bytes unenforced = %d, stderr %q; want 0 and a warning for --memory only", r.code, r.stderr)
	}
	r = corralctl(t, sock, "", nil, "run", "--detach", "--cpu", "1s", "--label", "unenforced=cpu_ms", "--", "hang")
	if r.code != 0 || !strings.Contains(r.stderr, "--cpu is not enforced") {
		t.Errorf("run --detach --cpu with cpu_ms unenforced = %d, stderr %q; want 0 and a warning for --cpu", r.code, r.stderr)
	}
	r = corralctl(t, sock, "", nil, "run", "--label", "unenforced=tasks_max", "--", "print")
	if strings.Contains(r.stderr, "not enforced") {
		t.Errorf("run without limit flags = stderr %q; want no warning for the daemon's default tasks_max", r.stderr)
	}
}

// TestRunAndWaitGoOnAcrossARestart: corrald going away mid-run (a reload
// hands the execution over, a restart adopts it) does not end corralctl run
// or wait with 125: they redial the same socket and go on to the
// execution's end.
func TestRunAndWaitGoOnAcrossARestart(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  []string
		calls func(d *fakeDaemon) int
		code  int
	}{
		{"run", []string{"run", "--", "hang"}, func(d *fakeDaemon) int { return d.follows }, 128 + 15},
		{"wait", []string{"wait", "exec-1"}, func(d *fakeDaemon) int { return d.waits }, 128 + 15},
		{"logs -f", []string{"logs", "-f", "exec-1"}, func(d *fakeDaemon) int { return d.follows }, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDaemon{}
			if tt.name != "run" {
				if _, err := d.Start(context.Background(), api.Owner{}, api.StartParams{Argv: []string{"hang"}}); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(t.TempDir(), "corrald.sock")
			serve := func() (*ipc.Server, chan error) {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				srv := ipc.NewServer(d, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
				served := make(chan error, 1)
				go func() { served <- srv.Serve(l) }()
				return srv, served
			}
			stop := func(srv *ipc.Server, served chan error) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := srv.Shutdown(ctx); err != nil {
					t.Errorf("shutdown: %v", err)
				}
				if err := <-served; !errors.Is(err, ipc.ErrServerClosed) {
					t.Errorf("Serve: %v", err)
				}
			}
			calls := func() int {
				d.mu.Lock()
				defer d.mu.Unlock()
				return tt.calls(d)
			}
			srv, served := serve()
			res := make(chan result, 1)
			go func() { res <- corralctl(t, path, "", nil, tt.args...) }()
			waitFor := func(n int) bool {
				for calls() < n {
					select {
					case r := <-res:
						res <- r
						return false
					case <-time.After(10 * time.Millisecond):
					}
				}
				return true
			}
			if !waitFor(1) {
				t.Fatalf("%s ended before waiting: %+v", tt.name, <-res)
			}
			stop(srv, served) // corrald restarts
			srv, served = serve()
			defer stop(srv, served)
			if !waitFor(2) {
				r := <-res
				t.Fatalf("%s across a restart = %d, stderr %q; want it to go on", tt.name, r.code, r.stderr)
			}
			if _, err := d.Cancel(context.Background(), api.Owner{}, api.CancelParams{ID: "exec-1"}); err != nil {
				t.Fatal(err)
			}
			r := <-res
			if r.code != tt.code || !strings.Contains(r.stderr, "reconnected") {
				t.Errorf("%s across a restart = %d, stderr %q; want %d and a note that it reconnected", tt.name, r.code, r.stderr, tt.code)
			}
		})
	}
}
