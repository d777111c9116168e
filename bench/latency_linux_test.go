package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

var (
	latencyN  = 300 // samples per side in exec_latency
	latencyWU = 20  // unrecorded warm-up rounds
	notifyN   = 100 // samples per side in exit_notify
)

const pollEvery = 100 * time.Millisecond

// runWait is one /bin/true through corrald: exec.start, then exec.wait until
// cleaned. It returns the time from before the start to the answer.
func runWait(t *testing.T, ctx context.Context, c *ipc.Client) time.Duration {
	t.Helper()
	t0 := time.Now()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
	el := time.Since(t0)
	if err != nil {
		t.Fatalf("exec.wait: %v", err)
	}
	checkTrue(t, rec)
	return el
}

// runFollow is one /bin/true through corrald: exec.start, then exec.follow.
// It returns the time from before the start to the exec.state notification
// that says exited, and to the final (cleaned) record.
func runFollow(t *testing.T, ctx context.Context, c *ipc.Client) (exited, cleaned time.Duration) {
	t.Helper()
	t0 := time.Now()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	var (
		mu       sync.Mutex
		exitedAt time.Time
	)
	rec, err = c.Follow(ctx, api.FollowParams{ID: rec.ID}, func(method string, params json.RawMessage) {
		if method != api.NotifyState {
			return
		}
		now := time.Now()
		var n api.StateNotification
		if json.Unmarshal(params, &n) != nil || !n.Record.State.Finished() {
			return
		}
		mu.Lock()
		if exitedAt.IsZero() {
			exitedAt = now
		}
		mu.Unlock()
	})
	cleaned = time.Since(t0)
	if err != nil {
		t.Fatalf("exec.follow: %v", err)
	}
	checkTrue(t, rec)
	mu.Lock()
	defer mu.Unlock()
	if exitedAt.IsZero() {
		t.Fatalf("exec.follow of %s: no exec.state notification with state exited or later", rec.ID)
	}
	return exitedAt.Sub(t0), cleaned
}

func checkTrue(t *testing.T, rec api.Record) {
	t.Helper()
	if rec.State != api.StateCleaned || rec.Outcome == nil || *rec.Outcome != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != 0 {
		b, _ := json.Marshal(rec)
		t.Fatalf("/bin/true through corrald: want cleaned, outcome exited, exit 0; got %s", b)
	}
}

// runBare is /bin/true with os/exec in this process.
func runBare(t *testing.T) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Fatalf("bare /bin/true: %v", err)
	}
	return time.Since(t0)
}

// benchExecLatency is (a): exec-to-result latency of /bin/true through
// corrald (cgroup and pgroup backends) against a bare os/exec Run, all five
// sides interleaved in one loop.
func (s *suite) benchExecLatency(t *testing.T) {
	cg := s.startDaemon(t, "cgroup", "cgroup")
	pg := s.startDaemon(t, "pgroup", "pgroup")
	ccg, cpg := cg.client(t), pg.client(t)
	ctx := ctxT(t, 5*time.Minute)

	var (
		bare                        durations
		cgWait, cgExited, cgCleaned durations
		pgWait, pgExited, pgCleaned durations
	)
	for i := 0; i < latencyWU+latencyN; i++ {
		rec := i >= latencyWU
		add := func(d *durations, v time.Duration) {
			if rec {
				*d = append(*d, v)
			}
		}
		rotate(i,
			func() { add(&bare, runBare(t)) },
			func() { add(&cgWait, runWait(t, ctx, ccg)) },
			func() { add(&pgWait, runWait(t, ctx, cpg)) },
			func() {
				e, c := runFollow(t, ctx, ccg)
				add(&cgExited, e)
				add(&cgCleaned, c)
			},
			func() {
				e, c := runFollow(t, ctx, cpg)
				add(&pgExited, e)
				add(&pgCleaned, c)
			},
		)
	}
	const base = "os/exec Run"
	s.latencyTable("(a) exec-to-result latency of /bin/true",
		fmt.Sprintf("One connection per daemon, calls in sequence; %d samples per side after %d warm-up rounds; the five sides interleaved (order rotating each round). "+
			"\"start+wait\": exec.start then exec.wait until cleaned. \"until exited\"/\"until cleaned\": exec.start then exec.follow, time of the exec.state notification with state exited, and of the final record.",
			latencyN, latencyWU),
		[]latencyRow{
			{"cgroup start+wait", "corrald cgroup", base, cgWait, bare},
			{"cgroup until exited", "corrald cgroup", base, cgExited, bare},
			{"cgroup until cleaned", "corrald cgroup", base, cgCleaned, bare},
			{"pgroup start+wait", "corrald pgroup", base, pgWait, bare},
			{"pgroup until exited", "corrald pgroup", base, pgExited, bare},
			{"pgroup until cleaned", "corrald pgroup", base, pgCleaned, bare},
		})
}

// waitBlockedInRead waits until pid is sh sleeping (in read), so that the
// measured time does not include the shell's start-up.
func waitBlockedInRead(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil {
			st := string(b)
			if i := strings.LastIndexByte(st, ')'); i > 0 && strings.HasPrefix(st[strings.IndexByte(st, '(')+1:], "sh)") && len(st) > i+2 && st[i+2] == 'S' {
				return
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// notifyDaemon is one (b) sample through corrald: sh -c 'read x' with stdin
// open, followed; T0 is just before exec.write close; the result is T0 to
// the exec.state notification that says exited, and T0 to the answer of
// exec.write.
func notifyDaemon(t *testing.T, ctx context.Context, c *ipc.Client) (exit, write time.Duration) {
	t.Helper()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/sh", "-c", "read x"}, StdinOpen: true, TimeoutMS: 60000})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	seen := make(chan struct{})
	exited := make(chan time.Time, 1)
	var once sync.Once
	followed := make(chan error, 1)
	go func() {
		_, err := c.Follow(ctx, api.FollowParams{ID: rec.ID}, func(method string, params json.RawMessage) {
			if method != api.NotifyState {
				return
			}
			now := time.Now()
			once.Do(func() { close(seen) })
			var n api.StateNotification
			if json.Unmarshal(params, &n) == nil && n.Record.State.Finished() {
				select {
				case exited <- now:
				default:
				}
			}
		})
		followed <- err
	}()
	select {
	case <-seen: // the follow is registered
	case err := <-followed:
		t.Fatalf("exec.follow: %v", err)
	}
	waitBlockedInRead(rec.PID)
	t0 := time.Now()
	if _, err := c.Write(ctx, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatalf("exec.write close: %v", err)
	}
	write = time.Since(t0)
	var at time.Time
	select {
	case at = <-exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("no exited notification for %s within 10s", rec.ID)
	}
	if err := <-followed; err != nil {
		t.Fatalf("exec.follow: %v", err)
	}
	return at.Sub(t0), write
}

// notifyLocal is one (b) sample of a baseline in this process: the same sh
// started with a stdin pipe; T0 is just before closing the pipe. With poll
// set, a loop polls waitpid(WNOHANG) every 100 ms (the seed's baseline);
// otherwise a goroutine blocks in wait4 (what os/exec's Wait does).
func notifyLocal(t *testing.T, poll bool) time.Duration {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatalf("pipe: %v", err)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "read x"}, &syscall.ProcAttr{
		Env:   []string{markEnv + "=" + markValue()},
		Files: []uintptr{uintptr(p[0]), devnull.Fd(), devnull.Fd()},
	})
	devnull.Close()
	unix.Close(p[0])
	if err != nil {
		unix.Close(p[1])
		t.Fatalf("start sh: %v", err)
	}
	exited := make(chan time.Time, 1)
	go func() {
		var ws unix.WaitStatus
		if !poll {
			for {
				_, err := unix.Wait4(pid, &ws, 0, nil)
				if err != unix.EINTR {
					break
				}
			}
			exited <- time.Now()
			return
		}
		tick := time.NewTicker(pollEvery)
		defer tick.Stop()
		for range tick.C {
			if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); got == pid || err != nil {
				exited <- time.Now()
				return
			}
		}
	}()
	waitBlockedInRead(pid)
	if poll {
		// The poller's phase is set by the fork; an exit comes at any
		// moment of its period, so T0 does too.
		time.Sleep(rand.N(pollEvery))
	}
	t0 := time.Now()
	unix.Close(p[1])
	select {
	case at := <-exited:
		return at.Sub(t0)
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("baseline sh %d did not exit within 10s of closing its stdin", pid)
		return 0
	}
}

// benchExitNotify is (b) and (b2): exit-to-notification latency of corrald's
// pidfd loop and of its waiter-goroutine fallback (--no-pidfd), against a
// 100 ms polling loop and a blocking wait4, interleaved.
func (s *suite) benchExitNotify(t *testing.T) {
	pf := s.startDaemon(t, "pidfd", "cgroup")
	np := s.startDaemon(t, "no-pidfd", "cgroup", "--no-pidfd")
	cpf, cnp := pf.client(t), np.client(t)
	ctx := ctxT(t, 5*time.Minute)
	var pidfd, nopidfd, polled, waited, pfWrite, npWrite durations
	for i := 0; i < 5+notifyN; i++ {
		rec := i >= 5
		add := func(d *durations, v time.Duration) {
			if rec {
				*d = append(*d, v)
			}
		}
		rotate(i,
			func() {
				e, w := notifyDaemon(t, ctx, cpf)
				add(&pidfd, e)
				add(&pfWrite, w)
			},
			func() {
				e, w := notifyDaemon(t, ctx, cnp)
				add(&nopidfd, e)
				add(&npWrite, w)
			},
			func() { add(&polled, notifyLocal(t, true)) },
			func() { add(&waited, notifyLocal(t, false)) },
		)
	}
	poll := fmt.Sprintf("poll waitpid every %s", pollEvery)
	s.latencyTable("(b) exit-to-notification latency",
		fmt.Sprintf("`sh -c 'read x'`, waited until blocked in read; T0 just before the child's stdin is closed (corrald: exec.write close, one RPC; baselines: close(2) on the pipe); "+
			"end: the exec.state notification with state exited (corrald) or the moment the baseline learns of the exit. %d samples per side, four sides interleaved; both daemons use the cgroup backend.", notifyN),
		[]latencyRow{
			{"pidfd loop vs polling", "corrald (pidfd)", poll, pidfd, polled},
			{"(b2) waiter goroutine vs polling", "corrald --no-pidfd", poll, nopidfd, polled},
			{"pidfd loop vs blocking wait", "corrald (pidfd)", "goroutine in wait4", pidfd, waited},
			{"(b2) waiter goroutine vs blocking wait", "corrald --no-pidfd", "goroutine in wait4", nopidfd, waited},
		})
	fmt.Fprintf(&s.out, "\nPart of corrald's figures is the exec.write close call itself: T0 to its answer was p50 %s ms, p99 %s ms (pidfd daemon), p50 %s ms, p99 %s ms (--no-pidfd daemon). "+
		"The polling baseline's T0 is at a random phase of its 100 ms period.\n",
		ms(pfWrite.pct(.5)), ms(pfWrite.pct(.99)), ms(npWrite.pct(.5)), ms(npWrite.pct(.99)))
}
