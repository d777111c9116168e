package ipc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"

	"github.com/corral-dev/corral/tests/testenv"
)

// TestMain fails the package when fds or goroutines outlive the tests. The
// test binary is also the child some tests start (connectHelperEnv).
func TestMain(m *testing.M) {
	if path := os.Getenv(connectHelperEnv); path != "" {
		os.Exit(connectHelper(path))
	}
	os.Exit(testenv.Main(m))
}

// fakeService answers from memory. Behaviour is chosen by the id:
//
//	"panic"    panics
//	"internal" returns a plain error
//	"missing"  returns api.ErrNotFound with an internal cause
//	"block"    (Wait) blocks until release is closed or ctx ends
//
// Every call's caller is recorded.
type fakeService struct {
	mu      sync.Mutex
	callers []api.Owner

	release     chan struct{} // closes to end blocking waits
	waitStarted chan struct{} // receives once per blocking wait that reached the service
	waitEnded   chan error    // receives ctx.Err() (or nil) of each blocking wait
	cancelled   chan string   // receives exec.cancel ids

	follow func(ctx context.Context, p api.FollowParams, notify func(string, any) bool) (api.Record, error)

	// Parked exec.output calls (OutputWait), in arrival order; parkedCtx
	// ends are counted in parkDropped.
	parkMu      sync.Mutex
	parkedCalls []parkedCall
	parkDropped int
}

type parkedCall struct {
	p     api.OutputParams
	reply func(api.OutputResult, error)
	done  bool
}

var _ Service = (*fakeService)(nil)

func newFake() *fakeService {
	return &fakeService{
		release:     make(chan struct{}),
		waitStarted: make(chan struct{}, 1024),
		waitEnded:   make(chan error, 1024),
		cancelled:   make(chan string, 16),
	}
}

func (f *fakeService) record(caller api.Owner) {
	f.mu.Lock()
	f.callers = append(f.callers, caller)
	f.mu.Unlock()
}

// lastCaller is the caller of the latest call.
func (f *fakeService) lastCaller() api.Owner {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.callers) == 0 {
		return api.Owner{}
	}
	return f.callers[len(f.callers)-1]
}

func (f *fakeService) byID(caller api.Owner, id string) (api.Record, error) {
	f.record(caller)
	switch id {
	case "panic":
		panic("boom")
	case "internal":
		return api.Record{}, errors.New("disk on fire at /secret/path")
	case "missing":
		return api.Record{}, &api.Error{Code: api.CodeNotFound, Message: "execution not found", Err: errors.New("secret detail")}
	}
	return api.Record{ID: id, Owner: caller, State: api.StateRunning, CreatedAt: time.Unix(0, 0).UTC()}, nil
}

func (f *fakeService) Start(_ context.Context, caller api.Owner, p api.StartParams) (api.Record, error) {
	f.record(caller)
	if len(p.Argv) == 0 {
		return api.Record{}, api.Errorf(api.CodeInvalidParams, "params.argv: required")
	}
	return api.Record{ID: "started", Owner: caller, Argv: p.Argv, State: api.StateStarted}, nil
}

func (f *fakeService) Get(_ context.Context, caller api.Owner, p api.IDParams) (api.Record, error) {
	return f.byID(caller, p.ID)
}

func (f *fakeService) Wait(ctx context.Context, caller api.Owner, p api.WaitParams) (api.Record, error) {
	if p.ID != "block" {
		return f.byID(caller, p.ID)
	}
	f.record(caller)
	select {
	case f.waitStarted <- struct{}{}:
	default: // nobody looks at more than a few
	}
	select {
	case <-f.release:
		f.waitEnded <- nil
		return api.Record{ID: "block", State: api.StateCleaned}, nil
	case <-ctx.Done():
		f.waitEnded <- ctx.Err()
		return api.Record{}, ctx.Err()
	}
}

// awaitWait waits until a blocking wait has reached the service, failing
// the test after 10s.
func (f *fakeService) awaitWait(t *testing.T) {
	t.Helper()
	select {
	case <-f.waitStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking exec.wait did not reach the service within 10s")
	}
}

func (f *fakeService) Cancel(_ context.Context, caller api.Owner, p api.CancelParams) (api.Record, error) {
	f.cancelled <- p.ID
	return f.byID(caller, p.ID)
}

func (f *fakeService) Signal(_ context.Context, caller api.Owner, p api.SignalParams) (api.Record, error) {
	return f.byID(caller, p.ID)
}

func (f *fakeService) Write(_ context.Context, caller api.Owner, p api.WriteParams) (api.WriteResult, error) {
	f.record(caller)
	return api.WriteResult{Written: len(p.Data)}, nil
}

func (f *fakeService) List(_ context.Context, caller api.Owner, _ api.ListParams) (api.ListResult, error) {
	f.record(caller)
	return api.ListResult{Executions: []api.Record{}}, nil
}

func (f *fakeService) Output(_ context.Context, caller api.Owner, p api.OutputParams) (api.OutputResult, error) {
	f.record(caller)
	return api.OutputResult{Offset: p.Offset, NextOffset: p.Offset, EOF: true}, nil
}

func (f *fakeService) Follow(ctx context.Context, caller api.Owner, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
	f.record(caller)
	if f.follow == nil {
		return api.Record{ID: p.ID, State: api.StateCleaned}, nil
	}
	return f.follow(ctx, p, notify)
}

func (f *fakeService) Update(_ context.Context, caller api.Owner, p api.UpdateParams) (api.Record, error) {
	return f.byID(caller, p.ID)
}

func (f *fakeService) Resize(_ context.Context, caller api.Owner, p api.ResizeParams) (api.Record, error) {
	return f.byID(caller, p.ID)
}

var _ OutputWaiter = (*fakeService)(nil)

// OutputWait parks every call until releaseParked, or drops it (with
// ctx's error) when ctx ends, as the reactor does.
func (f *fakeService) OutputWait(ctx context.Context, caller api.Owner, p api.OutputParams, reply func(api.OutputResult, error)) {
	f.record(caller)
	f.parkMu.Lock()
	i := len(f.parkedCalls)
	f.parkedCalls = append(f.parkedCalls, parkedCall{p: p, reply: reply})
	f.parkMu.Unlock()
	context.AfterFunc(ctx, func() {
		f.parkMu.Lock()
		pc := &f.parkedCalls[i]
		if pc.done {
			f.parkMu.Unlock()
			return
		}
		pc.done = true
		f.parkDropped++
		f.parkMu.Unlock()
		pc.reply(api.OutputResult{}, ctx.Err())
	})
}

func (f *fakeService) parkedCount() int {
	f.parkMu.Lock()
	defer f.parkMu.Unlock()
	return len(f.parkedCalls)
}

// releaseParked answers every parked call, in the order they arrived,
// with its offset, and returns those offsets in that order.
func (f *fakeService) releaseParked() []int64 {
	f.parkMu.Lock()
	defer f.parkMu.Unlock()
	var order []int64
	for i := range f.parkedCalls {
		pc := &f.parkedCalls[i]
		if !pc.done {
			pc.done = true
			order = append(order, pc.p.Offset)
			pc.reply(api.OutputResult{Data: []byte("x"), Offset: pc.p.Offset, NextOffset: pc.p.Offset + 1, TotalBytes: pc.p.Offset + 1}, nil)
		}
	}
	return order
}

func (f *fakeService) Info(context.Context) (api.Info, error) {
	return api.Info{Version: "test", Backend: "pgroup"}, nil
}

// startServer serves svc on a socket in a temp dir until the test ends.
func startServer(t *testing.T, svc Service, tune func(*Server)) (string, *Server) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corrald.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	if testing.Verbose() {
		log = log.Level(zerolog.DebugLevel)
	}
	srv := NewServer(svc, log)
	if tune != nil {
		tune(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return path, srv
}

// rawConn is a hand-driven client connection.
type rawConn struct {
	t  *testing.T
	nc *net.UnixConn
	br *bufio.Reader
}

// dialClient dials the server at path with Client; the test's cleanup
// closes it.
func dialClient(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	nc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 1<<16)}
}

func (r *rawConn) send(line string) {
	r.t.Helper()
	if _, err := r.nc.Write([]byte(line + "\n")); err != nil {
		r.t.Fatalf("send %q: %v", line, err)
	}
}

// read returns the next line, failing the test after timeout.
func (r *rawConn) read(timeout time.Duration) (string, error) {
	r.nc.SetReadDeadline(time.Now().Add(timeout))
	defer r.nc.SetReadDeadline(time.Time{})
	s, err := r.br.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

func (r *rawConn) mustRead() string {
	r.t.Helper()
	s, err := r.read(5 * time.Second)
	if err != nil {
		r.t.Fatalf("read: %v (got %q)", err, s)
	}
	return s
}

// wireResp is a response as a test sees it.
type wireResp struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    api.Code        `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func decodeResp(t *testing.T, s string) wireResp {
	t.Helper()
	var r wireResp
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		t.Fatalf("response %q is not a JSON object: %v", s, err)
	}
	if r.JSONRPC != "2.0" {
		t.Fatalf("response %q: jsonrpc = %q, want 2.0", s, r.JSONRPC)
	}
	return r
}
