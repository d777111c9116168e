package reactor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"

	"github.com/corral-dev/corral/tests/testenv"
)

// The test binary doubles as a child program: with CORRAL_TEST_HELPER set
// it runs the named behaviour instead of the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == shim.Arg {
		shim.Main()
	}
	if h := os.Getenv("CORRAL_TEST_HELPER"); h != "" {
		os.Exit(helper(h))
	}
	os.Exit(testenv.Main(m))
}

func helper(name string) int {
	switch name {
	case "interleave": // 1 MiB to each of stdout and stderr, alternating
		chunk := bytes.Repeat([]byte("x"), 4096)
		for i := 0; i < 256; i++ {
			os.Stdout.Write(chunk)
			os.Stderr.Write(chunk)
		}
		return 0
	case "loopback": // lo works inside the (new) network namespace
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			fmt.Println("dial:", err)
			return 1
		}
		c.Close()
		fmt.Println("loopback ok")
		return 0
	case "dial": // reach a listener of the host's loopback
		c, err := net.DialTimeout("tcp", os.Getenv("CORRAL_TEST_ADDR"), 2*time.Second)
		if err != nil {
			fmt.Println("dial failed:", err)
			return 1
		}
		c.Close()
		fmt.Println("dial ok")
		return 0
	case "cat":
		buf := make([]byte, 64<<10)
		for {
			n, err := os.Stdin.Read(buf)
			os.Stdout.Write(buf[:n])
			if err != nil {
				return 0
			}
		}
	}
	return 99
}

// testCaller is an in-process caller of uid (and gid) uid, standing for a
// peer connected from this test process: its pid is this process's, as
// SO_PEERCRED would give it, and its network namespace is resolved as ipc
// resolves a peer's at accept (peerns), so that Start (otherNetns) gives it
// the host's network; a caller with a pid and no resolved namespace gets
// network "none".
func testCaller(uid uint32) api.Owner {
	return api.Owner{UID: uid, GID: uid, PID: int32(os.Getpid()), Netns: peerns.Process(os.Getpid())}
}

var root = testCaller(0)

type testReactor struct {
	*Reactor
	t *testing.T
}

func newTestReactor(t *testing.T, mod func(*Config)) *testReactor {
	t.Helper()
	testenv.SkipRoot(t, "children run as the caller's uid")
	cfg := Config{
		Backend:   scope.NewPgroup(),
		Log:       zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		KillWait:  2 * time.Second,
		Subreaper: true,
		SocketGID: -1,
		Info:      api.Info{Pidfd: true},
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		// What a test left running ends and is cleaned before the loop
		// stops, as at corrald's shutdown: no child, pidfd or pipe
		// outlives the test (TestMain's leak check counts them).
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := r.Shutdown(sctx, 0); err != nil {
			t.Errorf("Shutdown() = %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
	return &testReactor{Reactor: r, t: t}
}

// run starts p and waits until cleaned.
func (tr *testReactor) run(p api.StartParams) api.Record {
	tr.t.Helper()
	rec, err := tr.Start(context.Background(), root, p)
	if err != nil {
		tr.t.Fatalf("Start(%v) = %v", p.Argv, err)
	}
	return tr.wait(rec.ID)
}

func (tr *testReactor) wait(id string) api.Record {
	tr.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := tr.Wait(ctx, root, api.WaitParams{ID: id})
	if err != nil {
		tr.t.Fatalf("Wait(%s) = %v", id, err)
	}
	if rec.State != api.StateCleaned {
		tr.t.Fatalf("Wait(%s) state = %v, want cleaned", id, rec.State)
	}
	return rec
}

func (tr *testReactor) stdout(id string) string {
	tr.t.Helper()
	out, err := tr.Output(context.Background(), root, api.OutputParams{ID: id, Stream: "stdout"})
	if err != nil {
		tr.t.Fatalf("Output(%s) = %v", id, err)
	}
	return string(out.Data)
}

func outcome(rec api.Record) api.Outcome {
	if rec.Outcome == nil {
		return ""
	}
	return *rec.Outcome
}

func self(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func TestExitSeenThroughPidfd(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "echo hi; exit 3"}})
	if outcome(rec) != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != 3 {
		t.Errorf("outcome, exit_code = %v, %v; want exited, 3", outcome(rec), rec.ExitCode)
	}
	if got := tr.stdout(rec.ID); got != "hi\n" {
		t.Errorf("stdout = %q, want %q", got, "hi\n")
	}
	if n, w := tr.reapedPidfd.Load(), tr.reapedWaiter.Load(); n != 1 || w != 0 {
		t.Errorf("reaped via pidfd, waiter = %d, %d; want 1, 0", n, w)
	}
}

func TestFallbackWaiterPath(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.NoPidfd = true })
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "exit 7"}})
	if rec.ExitCode == nil || *rec.ExitCode != 7 {
		t.Errorf("exit_code = %v, want 7", rec.ExitCode)
	}
	if n, w := tr.reapedPidfd.Load(), tr.reapedWaiter.Load(); n != 0 || w != 1 {
		t.Errorf("reaped via pidfd, waiter = %d, %d; want 0, 1", n, w)
	}
	info, _ := tr.Info(context.Background())
	if info.Pidfd {
		t.Error("daemon.info pidfd = true with the fallback forced")
	}
}

// A child that exits at once must not race start, dup and Wait.
func TestImmediateExit(t *testing.T) {
	for _, noPidfd := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPidfd=%v", noPidfd), func(t *testing.T) {
			tr := newTestReactor(t, func(c *Config) { c.NoPidfd = noPidfd })
			var wg sync.WaitGroup
			for i := 0; i < 50; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"true"}})
					if err != nil {
						t.Errorf("Start = %v", err)
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					rec, err = tr.Wait(ctx, root, api.WaitParams{ID: rec.ID})
					if err != nil || outcome(rec) != api.OutcomeExited || *rec.ExitCode != 0 {
						t.Errorf("true: err=%v outcome=%v", err, outcome(rec))
					}
				}()
			}
			wg.Wait()
		})
	}
}

// noZombies fails if the test process has an exited child not yet reaped.
func noZombies(t *testing.T) {
	t.Helper()
	var info unix.Siginfo
	err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	// With WNOHANG, si_signo stays 0 when no child is waitable.
	if err == nil && info.Signo != 0 {
		t.Errorf("an exited child was left unreaped (siginfo %+v)", info)
	}
}

// 1,000 runs, half of them cancelled mid-run, leave no pidfd, pipe or zombie.
func TestNoLeakAfterThousandRuns(t *testing.T) {
	tr := newTestReactor(t, nil)
	// Warm up: the runtime and os/exec open some fds lazily, once.
	tr.run(api.StartParams{Argv: []string{"true"}})
	c, _ := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"sleep", "10"}})
	tr.Cancel(context.Background(), root, api.CancelParams{ID: c.ID})
	tr.wait(c.ID)
	before := testenv.Measure()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			p := api.StartParams{Argv: []string{"true"}}
			if i%2 == 1 {
				p = api.StartParams{Argv: []string{"sleep", "10"}, GraceMS: 100}
			}
			rec, err := tr.Start(context.Background(), root, p)
			if err != nil {
				t.Errorf("Start = %v", err)
				return
			}
			if i%2 == 1 {
				if _, err := tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID}); err != nil {
					t.Errorf("Cancel = %v", err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rec, err = tr.Wait(ctx, root, api.WaitParams{ID: rec.ID})
			if err != nil || rec.State != api.StateCleaned {
				t.Errorf("Wait = %v, state %v", err, rec.State)
			}
			if i%2 == 1 && outcome(rec) != api.OutcomeCancelled {
				t.Errorf("cancelled run outcome = %v, want cancelled", outcome(rec))
			}
		}()
	}
	wg.Wait()
	// The reaper opens /proc files for a moment now and then: CheckFDs
	// waits for the count to settle.
	if err := before.CheckFDs(5 * time.Second); err != nil {
		t.Errorf("after 1000 runs: %v", err)
	}
	var registered int
	tr.onLoop(context.Background(), func() { registered = tr.loop.Registered() })
	if registered != 0 {
		t.Errorf("%d fds still in the epoll set", registered)
	}
	noZombies(t)
}

func TestHandleUseAfterWait(t *testing.T) {
	tr := newTestReactor(t, nil)
	// cat runs until its stdin closes, so the execution is still in the
	// reactor's table when the test takes it (a finished one leaves it).
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	var e *execution
	tr.onLoop(context.Background(), func() { e = tr.execs[rec.ID] })
	if e == nil {
		t.Fatalf("execution %s not in the reactor while it runs", rec.ID)
	}
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	rec = tr.wait(rec.ID)
	var pidfd int
	tr.onLoop(context.Background(), func() { pidfd = e.pidfd })
	if pidfd != -1 {
		t.Errorf("pidfd = %d after exit, want closed (-1)", pidfd)
	}
	if err := e.proc.Signal(unix.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal after Wait = %v, want os.ErrProcessDone", err)
	}
	if _, err := e.proc.Wait(); err == nil {
		t.Error("second Wait succeeded, want an error")
	}
	got, err := tr.Signal(context.Background(), root, api.SignalParams{ID: rec.ID, Signal: "SIGTERM", Target: "main"})
	if err != nil || got.State != api.StateCleaned {
		t.Errorf("exec.signal on a finished execution = %v, %v; want its record", got.State, err)
	}
}

func TestInterleavedMiBOnBothStreams(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{
		Argv:             []string{self(t)},
		Env:              map[string]string{"CORRAL_TEST_HELPER": "interleave"},
		OutputLimitBytes: 4 << 20,
	})
	if outcome(rec) != api.OutcomeExited || *rec.ExitCode != 0 {
		t.Fatalf("outcome = %v, error = %v", outcome(rec), rec.Error)
	}
	for _, s := range []api.StreamInfo{rec.Stdout, rec.Stderr} {
		if s.TotalBytes != 1<<20 || s.KeptBytes != 1<<20 || s.Truncated {
			t.Errorf("stream = %+v, want 1 MiB kept, not truncated", s)
		}
	}
}

func TestIgnoredSIGTERMEndsInSIGKILL(t *testing.T) {
	tr := newTestReactor(t, nil)
	start := time.Now()
	rec := tr.run(api.StartParams{
		Argv:      []string{"sh", "-c", `trap "" TERM; echo ready; while :; do sleep 1; done`},
		TimeoutMS: 500, GraceMS: 500,
	})
	el := time.Since(start)
	if outcome(rec) != api.OutcomeTimeout {
		t.Errorf("outcome = %v, want timeout", outcome(rec))
	}
	if rec.Signal == nil || *rec.Signal != "SIGKILL" {
		t.Errorf("signal = %v, want SIGKILL", rec.Signal)
	}
	// The daemon's own clock, from running to exited, excludes the spawn
	// and the cleanup, which a loaded host may stretch; it must show the
	// SIGKILL came at timeout+grace, not at the default grace.
	if max := 500*time.Millisecond + 500*time.Millisecond + time.Second; time.Duration(rec.DurationMS)*time.Millisecond > max {
		t.Errorf("duration_ms %d, want within timeout+grace+1s = %v", rec.DurationMS, max)
	}
	if max := 500*time.Millisecond + 500*time.Millisecond + 10*time.Second; el > max {
		t.Errorf("start to cleaned took %v, want within timeout+grace+10s = %v", el, max)
	}
}

func TestBackgroundedSleepIsKilled(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "sleep 1000 & echo $!"}})
	pid, err := strconv.Atoi(strings.TrimSpace(tr.stdout(rec.ID)))
	if err != nil {
		t.Fatalf("stdout %q: %v", tr.stdout(rec.ID), err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Fatalf("background sleep %d still exists after cleaned: %s", pid, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func vmRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestGigabyteOfOutputKeepsMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GB of output") // not an environment skip
	}
	tr := newTestReactor(t, nil)
	runtime.GC()
	before := vmRSS(t)
	rec := tr.run(api.StartParams{Argv: []string{"head", "-c", "1073741824", "/dev/zero"}, TimeoutMS: 60000})
	after := vmRSS(t)
	if rec.Stdout.TotalBytes != 1<<30 || !rec.Stdout.Truncated || rec.Stdout.KeptBytes != api.DefaultOutputLimitBytes {
		t.Errorf("stdout = %+v, want 1 GiB counted, truncated, %d kept", rec.Stdout, api.DefaultOutputLimitBytes)
	}
	if grew := after - before; grew > 32<<20 {
		t.Errorf("RSS grew by %d MiB for 1 GB of output, want < 32 MiB", grew>>20)
	}
	out, err := tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, Offset: 200 << 10})
	if err != nil || !out.Gap || out.Offset != 1<<30-api.DefaultOutputLimitBytes/2 {
		t.Errorf("Output in the dropped middle = gap %v offset %d err %v; want gap at the tail start", out.Gap, out.Offset, err)
	}
}

func TestStartFailed(t *testing.T) {
	tr := newTestReactor(t, nil)
	noExec := t.TempDir() + "/data"
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		p     api.StartParams
		errno string
	}{
		{"not found", api.StartParams{Argv: []string{"no-such-command-corral"}}, "ENOENT"},
		{"not executable", api.StartParams{Argv: []string{noExec}}, "EACCES"},
		{"bad cwd", api.StartParams{Argv: []string{"true"}, Cwd: "/nonexistent-corral"}, "ENOENT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tr.run(tc.p)
			if outcome(rec) != api.OutcomeStartFailed || rec.Error == nil || rec.StartErrno != tc.errno {
				t.Errorf("outcome %v, errno %q, error %v; want start_failed, %s", outcome(rec), rec.StartErrno, rec.Error, tc.errno)
			}
		})
	}
}

func TestParamsRejected(t *testing.T) {
	tr := newTestReactor(t, nil)
	for _, tc := range []struct {
		name, field string
		p           api.StartParams
	}{
		{"no argv", "argv", api.StartParams{}},
		{"nul in argv", "argv[1]", api.StartParams{Argv: []string{"echo", "a\x00b"}}},
		{"= in env name", "env", api.StartParams{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}}},
		{"relative cwd", "cwd", api.StartParams{Argv: []string{"true"}, Cwd: "tmp"}},
		{"negative timeout", "timeout_ms", api.StartParams{Argv: []string{"true"}, TimeoutMS: -1}},
		{"bad network", "network", api.StartParams{Argv: []string{"true"}, Network: "bridge"}},
		{"bad id", "id", api.StartParams{Argv: []string{"true"}, ID: "../x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.Start(context.Background(), root, tc.p)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeInvalidParams || !strings.HasPrefix(ae.Message, tc.field) {
				t.Errorf("Start = %v, want -32602 naming %s", err, tc.field)
			}
		})
	}
}

func TestCancelIsIdempotent(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID, Reason: "test"}); err != nil {
			t.Fatalf("Cancel #%d = %v", i, err)
		}
	}
	rec = tr.wait(rec.ID)
	if outcome(rec) != api.OutcomeCancelled || rec.Signal == nil || *rec.Signal != "SIGTERM" || rec.CancelReason != "test" {
		t.Errorf("outcome %v signal %v reason %q; want cancelled by SIGTERM, reason test", outcome(rec), rec.Signal, rec.CancelReason)
	}
	again, err := tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})
	if err != nil || outcome(again) != api.OutcomeCancelled {
		t.Errorf("Cancel after cleaned = %v, %v", outcome(again), err)
	}
}

func TestStdinDataAndWrite(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"cat"}, Stdin: []byte("given\n")})
	if got := tr.stdout(rec.ID); got != "given\n" {
		t.Errorf("stdin data: stdout = %q", got)
	}
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("y"), 3<<20) // more than a pipe holds
	if res, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: big}); err != nil || res.Written != len(big) {
		t.Fatalf("Write = %v, %v", res, err)
	}
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: []byte("end"), Close: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: []byte("late")}); api.ErrorCode(err) != api.CodeInvalidParams {
		t.Errorf("Write after close = %v, want -32602", err)
	}
	rec = tr.wait(rec.ID)
	if rec.Stdout.TotalBytes != int64(len(big))+3 {
		t.Errorf("cat echoed %d bytes, want %d", rec.Stdout.TotalBytes, len(big)+3)
	}
}

func TestIdempotencyKey(t *testing.T) {
	tr := newTestReactor(t, nil)
	p := api.StartParams{Argv: []string{"sh", "-c", "echo once"}, ID: "tool-call-1"}
	first := tr.run(p)
	again, err := tr.Start(context.Background(), root, p)
	if err != nil || again.ID != first.ID || again.State != api.StateCleaned {
		t.Errorf("second Start = %v %v, want the first record", again.State, err)
	}
	if tr.total.Load() != 1 {
		t.Errorf("total = %d, want 1: the retry started something", tr.total.Load())
	}
	p.Argv = []string{"echo", "other"}
	if _, err := tr.Start(context.Background(), root, p); api.ErrorCode(err) != api.CodeIdempotency {
		t.Errorf("same id, other argv = %v, want -32004", err)
	}
}

func TestCapacity(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.MaxRunning = 1 })
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"true"}}); api.ErrorCode(err) != api.CodeOverCapacity {
		t.Errorf("second Start = %v, want -32003", err)
	}
	if tr.total.Load() != 1 {
		t.Errorf("total = %d: the refused start was counted", tr.total.Load())
	}
	tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})
	tr.wait(rec.ID)
}

func TestOwnershipHidesOthers(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"true"}})
	other := testCaller(4242)
	if _, err := tr.Get(context.Background(), other, api.IDParams{ID: rec.ID}); api.ErrorCode(err) != api.CodeNotFound {
		t.Errorf("Get by another uid = %v, want -32001", err)
	}
	l, _ := tr.List(context.Background(), other, api.ListParams{})
	if len(l.Executions) != 0 {
		t.Errorf("List by another uid shows %d executions", len(l.Executions))
	}
	if _, err := tr.Start(context.Background(), other, api.StartParams{Argv: []string{"true"}, User: "root"}); api.ErrorCode(err) != api.CodePermission {
		t.Errorf("non-root asking for user root = %v, want -32002", err)
	}
}

func TestFollowStreamsOutputAndState(t *testing.T) {
	tr := newTestReactor(t, nil)
	// The child prints "two" only once the follower has seen "one" (the
	// test then writes its stdin), so the follow is registered before the
	// execution ends however slow the host is, and must see it end live.
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"sh", "-c", "echo one; read x; echo two"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var out bytes.Buffer
	var states []api.State
	wrote := make(chan error, 1)
	released := false
	final, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, func(method string, params any) bool {
		mu.Lock()
		defer mu.Unlock()
		switch n := params.(type) {
		case api.OutputNotification:
			if n.Offset != int64(out.Len()) {
				t.Errorf("output offset %d, want %d", n.Offset, out.Len())
			}
			out.Write(n.Data)
			if !released && strings.HasPrefix(out.String(), "one\n") {
				released = true
				// Not from here: notify runs on the loop goroutine, which
				// Write needs.
				go func() {
					_, err := tr.Write(ctx, root, api.WriteParams{ID: rec.ID, Data: []byte("go\n"), Close: true})
					wrote <- err
				}()
			}
		case api.StateNotification:
			states = append(states, n.Record.State)
		case json.RawMessage: // a live one: the record as the store encoded it (tell)
			var sn api.StateNotification
			if err := json.Unmarshal(n, &sn); err != nil {
				t.Errorf("exec.state params %s: %v", n, err)
			}
			states = append(states, sn.Record.State)
		}
		return true
	})
	if err != nil || final.State != api.StateCleaned {
		t.Fatalf("Follow = %v, %v (output so far %q)", final.State, err, out.String())
	}
	if err := <-wrote; err != nil {
		t.Errorf("write to the child's stdin: %v", err)
	}
	if out.String() != "one\ntwo\n" {
		t.Errorf("followed output %q", out.String())
	}
	if len(states) < 2 || states[len(states)-1] != api.StateCleaned {
		t.Errorf("states %v, want ending in cleaned", states)
	}
}

func TestOutputKeepsHeadAndTail(t *testing.T) {
	k := newKeptOutput(10)
	for _, s := range []string{"abc", "defgh", "ijklmnop", "qrstuvwxyz"} {
		k.write([]byte(s))
	}
	if k.total != 26 || k.kept() != 10 || !k.truncated() {
		t.Fatalf("total %d kept %d", k.total, k.kept())
	}
	if d, start, gap := k.read(0, 100); string(d) != "abcde" || start != 0 || gap {
		t.Errorf("read(0) = %q %d %v", d, start, gap)
	}
	if d, start, gap := k.read(7, 100); string(d) != "vwxyz" || start != 21 || !gap {
		t.Errorf("read(7) = %q %d %v, want the tail from 21 with a gap", d, start, gap)
	}
	if d, _, _ := k.read(23, 2); string(d) != "xy" {
		t.Errorf("read(23,2) = %q", d)
	}
}

// TestStoredOutputDoesNotAliasTheRing: the kept output handed to the store
// (keptForStore, encoded later on the store's writer) stays what it was
// when the record was made while the loop keeps writing: a tail ring that
// one chunk filled (tpos 0) used to be handed over as is, and the next
// write overwrote the store's copy.
func TestStoredOutputDoesNotAliasTheRing(t *testing.T) {
	for _, chunks := range [][]string{
		{"HHHHHHHH", "abcdefgh"},        // one chunk fills the tail
		{"HHHHHHHH", "abcd", "efgh"},    // filled by appends
		{"HHHHHHHH", "abcdefgh", "ijk"}, // wrapped
	} {
		e := &execution{}
		e.streams[0] = &stream{name: "stdout", kept: newKeptOutput(16)}
		for _, c := range chunks {
			e.streams[0].kept.write([]byte(c))
		}
		outs := keptForStore(e)
		before := string(outs[0].Kept.Tail)
		e.streams[0].kept.write([]byte("XYZW"))
		if got := string(outs[0].Kept.Tail); got != before {
			t.Errorf("after %q: the stored tail changed from %q to %q with the next write", chunks, before, got)
		}
	}
}

func TestNetworkNone(t *testing.T) {
	tr := newTestReactor(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	env := map[string]string{"CORRAL_TEST_ADDR": l.Addr().String()}
	for _, tc := range []struct {
		network, helper string
		code            int
	}{
		{"host", "dial", 0},
		{"none", "dial", 1},
		{"none", "loopback", 0},
	} {
		t.Run(tc.network+"/"+tc.helper, func(t *testing.T) {
			e := map[string]string{"CORRAL_TEST_HELPER": tc.helper}
			for k, v := range env {
				e[k] = v
			}
			rec := tr.run(api.StartParams{Argv: []string{self(t)}, Env: e, Network: tc.network})
			if rec.ExitCode == nil || *rec.ExitCode != tc.code {
				t.Errorf("exit %v (%v), want %d; stdout %q", rec.ExitCode, outcome(rec), tc.code, tr.stdout(rec.ID))
			}
		})
	}
}

func TestShimStartFailed(t *testing.T) {
	tr := newTestReactor(t, nil)
	// network none goes through the shim: a missing command is still a
	// failed start with its errno, not an exit 127.
	rec := tr.run(api.StartParams{Argv: []string{"/nonexistent/corral-cmd"}, Network: "none"})
	if outcome(rec) != api.OutcomeStartFailed || rec.StartErrno != "ENOENT" {
		t.Errorf("outcome %v errno %q error %v", outcome(rec), rec.StartErrno, rec.Error)
	}
}

func TestCPULimitBackstopWithoutCgroup(t *testing.T) {
	tr := newTestReactor(t, nil) // pgroup: no cgroup measures the tree
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "while :; do :; done"}, CPUMS: 1000, TimeoutMS: 20000})
	if outcome(rec) != api.OutcomeCPULimit {
		t.Errorf("outcome = %v (signal %v), want cpu_limit", outcome(rec), rec.Signal)
	}
}

func TestWorkspaceForUnprivilegedUser(t *testing.T) {
	state := t.TempDir()
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	tr := newTestReactor(t, func(c *Config) { c.StateDir = state })
	nobody := testCaller(65534)
	rec, err := tr.Start(context.Background(), nobody, api.StartParams{Argv: []string{"sh", "-c", "pwd; id -u; echo x > f"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rec, err = tr.Wait(ctx, nobody, api.WaitParams{ID: rec.ID})
	if err != nil || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Fatalf("run as nobody in its workspace: %v %v error %q", err, outcome(rec), *rec.Error)
	}
	out, _ := tr.Output(context.Background(), nobody, api.OutputParams{ID: rec.ID})
	want := filepath.Join(state, "work", rec.ID) + "\n65534\n"
	if string(out.Data) != want {
		t.Errorf("stdout = %q, want %q", out.Data, want)
	}
	if rec.Workspace == nil || *rec.Workspace != filepath.Join(state, "work", rec.ID) {
		t.Errorf("workspace = %v", rec.Workspace)
	}
	if _, err := os.Stat(filepath.Join(state, "work", rec.ID)); !os.IsNotExist(err) {
		t.Errorf("workspace still exists after cleaned: %v", err)
	}
}

// TestWorkspaceGoneAndReleased: at cleaned the workspace is gone from the
// file system, and the daemon lets go of the directory right after (it holds
// it across the removal so that the inode is freed off the answer's path):
// no descriptor of the daemon still points at it.
func TestWorkspaceGoneAndReleased(t *testing.T) {
	state := t.TempDir()
	tr := newTestReactor(t, func(c *Config) { c.StateDir = state })
	for i := 0; i < 4; i++ {
		script := "mkdir d; echo x > d/f; echo y > f"
		if i%2 == 1 {
			script = "true" // an empty workspace: removed by its rmdir alone
		}
		rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", script}})
		if rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Workspace == nil {
			t.Fatalf("run in a workspace: exit %v, workspace %v", rec.ExitCode, rec.Workspace)
		}
		ws := *rec.Workspace
		if _, err := os.Stat(ws); !os.IsNotExist(err) {
			t.Fatalf("workspace %s still exists after cleaned: %v", ws, err)
		}
		held := func() []string {
			var fds []string
			ents, _ := os.ReadDir("/proc/self/fd")
			for _, e := range ents {
				if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, ws) {
					fds = append(fds, e.Name()+" -> "+l)
				}
			}
			return fds
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(held()) > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if h := held(); len(h) > 0 {
			t.Fatalf("5s after cleaned the daemon still holds the removed workspace: %v", h)
		}
	}
}

func TestRedactedOutput(t *testing.T) {
	tr := newTestReactor(t, nil)
	script := `printf 'token: Bearer abcdefghijklmnop123\nkey AKIAABCDEFGHIJKLMNOP\n'`
	for _, redact := range []bool{false, true} {
		rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", script}, Redact: redact})
		out := tr.stdout(rec.ID)
		leaked := strings.Contains(out, "abcdefghijklmnop123") || strings.Contains(out, "AKIAABCDEFGHIJKLMNOP")
		if leaked == redact {
			t.Errorf("redact=%v: stdout %q", redact, out)
		}
		if redact && !strings.Contains(out, "[REDACTED]") {
			t.Errorf("redacted stdout %q has no [REDACTED]", out)
		}
		if rec.Stdout.TotalBytes != 59 {
			t.Errorf("redact=%v: total_bytes = %d, want the 59 bytes the child wrote", redact, rec.Stdout.TotalBytes)
		}
	}
}

func TestWarmPool(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.PoolSize = 2 })
	waitIdle := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for tr.pool.idleCount() < want {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d idle shims, want %d", tr.pool.idleCount(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The pool serves commands that need a shim: here, a caller other
	// than root (the shim drops to its user).
	nobody := testCaller(65534)
	run := func(p api.StartParams) api.Record {
		t.Helper()
		rec, err := tr.Start(context.Background(), nobody, p)
		if err != nil {
			t.Fatalf("Start(%v) = %v", p.Argv, err)
		}
		return tr.wait(rec.ID)
	}
	waitIdle(2)
	rec := run(api.StartParams{Argv: []string{"sh", "-c", "echo pooled $0 $(id -u); echo err >&2; exit 6"}, Stdin: []byte("x")})
	if rec.ExitCode == nil || *rec.ExitCode != 6 || tr.stdout(rec.ID) != "pooled sh 65534\n" || rec.Stderr.TotalBytes != 4 {
		t.Errorf("pooled run: exit %v stdout %q stderr %d bytes", rec.ExitCode, tr.stdout(rec.ID), rec.Stderr.TotalBytes)
	}
	waitIdle(2)
	rec = run(api.StartParams{Argv: []string{"cat"}, Stdin: []byte("through the pool")})
	if got := tr.stdout(rec.ID); got != "through the pool" {
		t.Errorf("stdin through a pooled shim: %q", got)
	}
	waitIdle(1)
	rec = run(api.StartParams{Argv: []string{"no-such-corral-cmd"}})
	if outcome(rec) != api.OutcomeStartFailed || rec.StartErrno != "ENOENT" {
		t.Errorf("pooled start failure: %v %q", outcome(rec), rec.StartErrno)
	}
	waitIdle(1)
	rec = run(api.StartParams{Argv: []string{"sleep", "10"}, TimeoutMS: 200, GraceMS: 100})
	if outcome(rec) != api.OutcomeTimeout {
		t.Errorf("pooled timeout: %v", outcome(rec))
	}
	info, _ := tr.Info(context.Background())
	if info.Pool == nil || info.Pool.Hits != 4 || info.Pool.Misses != 0 || info.Pool.Size != 2 {
		t.Errorf("daemon.info pool = %+v, want 4 hits, no miss, size 2", info.Pool)
	}

	// A root caller's command on the host network needs no shim without
	// systemd: it starts directly and leaves the pool alone.
	waitIdle(2)
	if rec := tr.run(api.StartParams{Argv: []string{"true"}}); rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Errorf("direct start next to a pool: exit %v", rec.ExitCode)
	}
	info, _ = tr.Info(context.Background())
	if info.Pool.Hits != 4 || info.Pool.Misses != 0 || info.Pool.Idle != 2 {
		t.Errorf("after a root command with no shim: pool = %+v, want it untouched (4 hits, 2 idle)", info.Pool)
	}
}

// A take that finds the pool empty grows its target (daemon.info's size)
// by one, up to poolGrowth times --pool-size, and the pool fills up to it
// with several entries created at once; without misses for poolShrinkAfter
// the target shrinks back by one per step and a surplus idle entry goes.
func TestWarmPoolGrowsOnMissesAndShrinks(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.PoolSize = 1 })
	p := tr.pool
	waitIdle := func(want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for p.idleCount() != want {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d idle shims, want %d (target %d)", p.idleCount(), want, p.targetSize())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitIdle(1)
	// Drain it, then miss until the target reaches its bound (1 -> poolGrowth).
	var taken []*pooled
	for p.idleCount() > 0 {
		if e := p.take(); e != nil {
			taken = append(taken, e)
		}
	}
	for i := 0; p.targetSize() < poolGrowth && i < 1000; i++ {
		if e := p.take(); e != nil {
			taken = append(taken, e) // refilled meanwhile: not a miss
		}
	}
	for _, e := range taken {
		p.discard(e)
	}
	if got := p.targetSize(); got != poolGrowth*1 {
		t.Fatalf("target after misses = %d, want the bound %d", got, poolGrowth)
	}
	waitIdle(poolGrowth)
	info, _ := tr.Info(context.Background())
	if info.Pool == nil || info.Pool.Size != poolGrowth || info.Pool.Misses < int64(poolGrowth-1) {
		t.Errorf("daemon.info pool = %+v, want size %d and the misses counted", info.Pool, poolGrowth)
	}
	// No miss for poolShrinkAfter: one step down, one idle entry discarded.
	p.mu.Lock()
	p.lastMiss = time.Now().Add(-poolShrinkAfter)
	p.mu.Unlock()
	p.shrink()
	if got := p.targetSize(); got != poolGrowth-1 {
		t.Errorf("target after a quiet period = %d, want %d", got, poolGrowth-1)
	}
	if got := p.idleCount(); got != poolGrowth-1 {
		t.Errorf("idle after shrinking = %d, want %d", got, poolGrowth-1)
	}
}

func TestWarmPoolNetworkNoneAndUser(t *testing.T) {
	state := t.TempDir()
	os.Chmod(state, 0o700)
	tr := newTestReactor(t, func(c *Config) { c.PoolSize = 1; c.StateDir = state })
	deadline := time.Now().Add(10 * time.Second)
	for tr.pool.idleCount() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rec := tr.run(api.StartParams{Argv: []string{self(t)}, Env: map[string]string{"CORRAL_TEST_HELPER": "loopback"}, Network: "none"})
	if rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Errorf("loopback in a pooled shim's new netns: exit %v, %q", rec.ExitCode, tr.stdout(rec.ID))
	}
	for tr.pool.idleCount() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	nobody := testCaller(65534)
	rec, err := tr.Start(context.Background(), nobody, api.StartParams{Argv: []string{"sh", "-c", "id -u; pwd"}})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ = tr.Wait(context.Background(), nobody, api.WaitParams{ID: rec.ID})
	out, _ := tr.Output(context.Background(), nobody, api.OutputParams{ID: rec.ID})
	if want := "65534\n" + filepath.Join(state, "work", rec.ID) + "\n"; string(out.Data) != want {
		t.Errorf("pooled run as nobody: %q, want %q (error %v)", out.Data, want, rec.Error)
	}
}

func TestWarmPoolReplacesDeadShim(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.PoolSize = 1 })
	deadline := time.Now().Add(10 * time.Second)
	for tr.pool.idleCount() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	tr.pool.mu.Lock()
	victim := tr.pool.idle[0].cmd.Process.Pid
	tr.pool.mu.Unlock()
	if err := unix.Kill(victim, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Replaced within the pool's one-second check, and the dead one reaped.
	for {
		tr.pool.mu.Lock()
		replaced := len(tr.pool.idle) == 1 && tr.pool.idle[0].cmd.Process.Pid != victim
		tr.pool.mu.Unlock()
		if replaced {
			break
		}
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("dead pool shim not replaced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(victim)); !os.IsNotExist(err) {
		t.Errorf("dead pool shim %d not reaped", victim)
	}
	rec := tr.run(api.StartParams{Argv: []string{"echo", "after"}})
	if tr.stdout(rec.ID) != "after\n" {
		t.Errorf("run after the replacement: %q", tr.stdout(rec.ID))
	}
}

// TestOrphansAreMainThreadChildren: the reaper's quick path reads only the
// main thread's children list, on the claim that the kernel hands an orphan
// to the first live thread of its subreaper. An orphan made by a child that
// another thread forked must show up there, and be reaped once it exits.
func TestOrphansAreMainThreadChildren(t *testing.T) {
	tr := newTestReactor(t, nil) // makes this process a child subreaper
	out := make(chan []byte, 1)
	go func() {
		// A locked goroutine is unlikely to run on the main thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b, _ := exec.Command("sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!").Output()
		out <- b
	}()
	pid, err := strconv.Atoi(strings.TrimSpace(string(<-out)))
	if err != nil {
		t.Fatalf("orphan pid: %v", err)
	}
	// sh has exited and been waited for: sleep was reparented then.
	if !slices.Contains(leaderChildren(), pid) {
		unix.Kill(pid, unix.SIGKILL)
		t.Fatalf("orphan %d is not among the main thread's children %v (all threads: %v)", pid, leaderChildren(), children())
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		tr.reaper.reapOrphans()
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSigchldReapsAreSpaced: a burst of child exits (each a SIGCHLD) is
// reaped on the signal at most once per sigReapEvery, and an orphan that
// exits is still reaped by the signal's reap, well before the 1 s sweep.
func TestSigchldReapsAreSpaced(t *testing.T) {
	tr := newTestReactor(t, nil) // makes this process a child subreaper
	from := time.Now()
	before := tr.reaper.sigReaps.Load()
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				// Not registered main processes: the reaper may reap them
				// first, so Run's ECHILD is not an error here.
				_ = exec.Command("true").Run()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	time.Sleep(2 * sigReapEvery) // the reap at the end of the last interval
	reaps := tr.reaper.sigReaps.Load() - before
	// Reaps at least sigReapEvery apart: a window of w holds at most
	// w/sigReapEvery + 1 of them. The window is the whole count's, the
	// sleep included (a reap of the reactor's own start-up may have set
	// the schedule just before it): counting only the burst's time (most
	// elapsed/sigReapEvery + 2) failed once with 5 reaps in 43 ms + 40 ms.
	window := time.Since(from)
	if most := int64(window/sigReapEvery) + 1; reaps > most {
		t.Errorf("80 child exits in %s (%s counted): %d reaps on SIGCHLD, want at most %d (one per %s)", elapsed, window, reaps, most, sigReapEvery)
	}
	if reaps == 0 {
		t.Errorf("80 child exits: no reap on SIGCHLD")
	}
	// An orphan that exits is reaped on its SIGCHLD: a reap within
	// sigReapEvery of the signal, not the sweep a second later.
	b, _ := exec.Command("sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!").Output()
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("orphan pid: %v", err)
	}
	n := tr.reaper.sigReaps.Load()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped within 10s", pid)
		}
		time.Sleep(time.Millisecond)
	}
	if tr.reaper.sigReaps.Load() == n {
		t.Errorf("orphan %d was reaped, but by no reap on SIGCHLD", pid)
	}
}
