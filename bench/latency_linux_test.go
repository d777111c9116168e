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
	spacedN   = 150 // samples per side in exec_latency's spaced pool comparison
	notifyN   = 100 // samples per side in exit_notify
)

// spacedGap is the idle time before each execution of the spaced pool
// comparison: enough for a warm pool to refill off the hot path.
const spacedGap = 30 * time.Millisecond

const pollEvery = 100 * time.Millisecond

// phases splits one start+wait by the daemon's own timestamps in the final
// record (same host clock as the client's).
type phases struct {
	toCreated, toStarted, toExited, toCleaned, toAnswer durations
}

func (p *phases) add(t0, answered time.Time, rec api.Record) {
	if rec.StartedAt == nil || rec.ExitedAt == nil || rec.CleanedAt == nil {
		return
	}
	p.toCreated = append(p.toCreated, rec.CreatedAt.Sub(t0))
	p.toStarted = append(p.toStarted, rec.StartedAt.Sub(rec.CreatedAt))
	p.toExited = append(p.toExited, rec.ExitedAt.Sub(*rec.StartedAt))
	p.toCleaned = append(p.toCleaned, rec.CleanedAt.Sub(*rec.ExitedAt))
	p.toAnswer = append(p.toAnswer, answered.Sub(*rec.CleanedAt))
}

// runWait is one /bin/true through corrald: exec.start, then exec.wait until
// cleaned. It returns the time from before the start to the answer; with ph
// set it also adds the phases of the execution to ph.
func runWait(t *testing.T, ctx context.Context, c *ipc.Client, ph *phases) time.Duration {
	t.Helper()
	t0 := time.Now()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
	answered := time.Now()
	if err != nil {
		t.Fatalf("exec.wait: %v", err)
	}
	checkTrue(t, rec)
	if ph != nil {
		ph.add(t0, answered, rec)
	}
	return answered.Sub(t0)
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
	np := s.startDaemon(t, "cgroup-nopool", "cgroup", "--pool-size", "0")
	pg := s.startDaemon(t, "pgroup", "pgroup")
	ccg, cnp, cpg := cg.client(t), np.client(t), pg.client(t)
	ctx := ctxT(t, 5*time.Minute)

	var (
		bare                        durations
		cgWait, cgExited, cgCleaned durations
		pgWait, pgExited, pgCleaned durations
		npWait                      durations
		cgPh, npPh, pgPh            phases
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
			func() {
				ph := &cgPh
				if !rec {
					ph = nil
				}
				add(&cgWait, runWait(t, ctx, ccg, ph))
			},
			func() {
				ph := &pgPh
				if !rec {
					ph = nil
				}
				add(&pgWait, runWait(t, ctx, cpg, ph))
			},
			func() {
				ph := &npPh
				if !rec {
					ph = nil
				}
				add(&npWait, runWait(t, ctx, cnp, ph))
			},
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
		fmt.Sprintf("One connection per daemon, calls in sequence; %d samples per side after %d warm-up rounds; the six sides interleaved (order rotating each round). "+
			"The daemons run with their default warm pool (--pool-size 4: shims waiting in scopes of their own) except \"cgroup, no pool\" (--pool-size 0: scope and fork inline in exec.start). "+
			"\"start+wait\": exec.start then exec.wait until cleaned. \"until exited\"/\"until cleaned\": exec.start then exec.follow, time of the exec.state notification with state exited, and of the final record.",
			latencyN, latencyWU),
		[]latencyRow{
			{"cgroup start+wait", "corrald cgroup", base, cgWait, bare},
			{"cgroup until exited", "corrald cgroup", base, cgExited, bare},
			{"cgroup until cleaned", "corrald cgroup", base, cgCleaned, bare},
			{"cgroup, no pool, start+wait", "corrald cgroup --pool-size 0", base, npWait, bare},
			{"pgroup start+wait", "corrald pgroup", base, pgWait, bare},
			{"pgroup until exited", "corrald pgroup", base, pgExited, bare},
			{"pgroup until cleaned", "corrald pgroup", base, pgCleaned, bare},
		})
	// The pool's best case: executions spaced out, so that it refills while
	// nothing else runs. Only the two cgroup daemons, alternating.
	var spPool, spInline durations
	for i := 0; i < 5+spacedN; i++ {
		rec := i >= 5
		rotate(i,
			func() {
				time.Sleep(spacedGap)
				if d := runWait(t, ctx, ccg, nil); rec {
					spPool = append(spPool, d)
				}
			},
			func() {
				time.Sleep(spacedGap)
				if d := runWait(t, ctx, cnp, nil); rec {
					spInline = append(spInline, d)
				}
			})
	}
	s.latencyTable("(a2) warm pool against inline start, spaced executions",
		fmt.Sprintf("start+wait of /bin/true, %s of idle before each, the two cgroup daemons alternating; %d samples per side. The baseline here is corrald itself with --pool-size 0.", spacedGap, spacedN),
		[]latencyRow{{"pool vs inline", "corrald cgroup (pool 4)", "corrald cgroup --pool-size 0", spPool, spInline}})

	fmt.Fprintf(&s.out, "\nWhere the start+wait time goes in (a), by the timestamps in each final record (daemon and client share the host clock):\n\n")
	fmt.Fprintf(&s.out, "| backend | phase | p50 ms | p99 ms |\n|---|---|---|---|\n")
	for _, b := range []struct {
		name string
		ph   *phases
	}{{"cgroup", &cgPh}, {"cgroup, no pool", &npPh}, {"pgroup", &pgPh}} {
		for _, r := range []struct {
			name string
			d    durations
		}{
			{"client sends exec.start → created_at", b.ph.toCreated},
			{"created_at → started_at (workspace, pipes, scope, fork or pooled shim, exec)", b.ph.toStarted},
			{"started_at → exited_at (child runs, exit seen)", b.ph.toExited},
			{"exited_at → cleaned_at (tree gone, scope and workspace removed)", b.ph.toCleaned},
			{"cleaned_at → client has the exec.wait answer", b.ph.toAnswer},
		} {
			fmt.Fprintf(&s.out, "| %s | %s | %s | %s |\n", b.name, r.name, ms(r.d.pct(.5)), ms(r.d.pct(.99)))
		}
	}
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
// exec.write, and T0 to the exited_at stamp of the final record (when the
// daemon's loop saw the exit).
func notifyDaemon(t *testing.T, ctx context.Context, c *ipc.Client) (exit, write, stamp time.Duration) {
	t.Helper()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/sh", "-c", "read x"}, StdinOpen: true, TimeoutMS: 60000})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	seen := make(chan struct{})
	exited := make(chan time.Time, 1)
	var once sync.Once
	followed := make(chan error, 1)
	var final api.Record
	go func() {
		var err error
		final, err = c.Follow(ctx, api.FollowParams{ID: rec.ID}, func(method string, params json.RawMessage) {
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
	if final.ExitedAt == nil {
		t.Fatalf("final record of %s has no exited_at", rec.ID)
	}
	return at.Sub(t0), write, final.ExitedAt.Sub(t0)
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
	var pidfd, nopidfd, polled, waited, pfWrite, npWrite, pfStamp, npStamp durations
	for i := 0; i < 5+notifyN; i++ {
		rec := i >= 5
		add := func(d *durations, v time.Duration) {
			if rec {
				*d = append(*d, v)
			}
		}
		rotate(i,
			func() {
				e, w, st := notifyDaemon(t, ctx, cpf)
				add(&pidfd, e)
				add(&pfWrite, w)
				add(&pfStamp, st)
			},
			func() {
				e, w, st := notifyDaemon(t, ctx, cnp)
				add(&nopidfd, e)
				add(&npWrite, w)
				add(&npStamp, st)
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
			{"pidfd loop, T0 → exited_at stamp", "corrald (pidfd)", poll, pfStamp, polled},
			{"(b2) waiter goroutine vs polling", "corrald --no-pidfd", poll, nopidfd, polled},
			{"(b2) waiter, T0 → exited_at stamp", "corrald --no-pidfd", poll, npStamp, polled},
			{"pidfd loop vs blocking wait", "corrald (pidfd)", "goroutine in wait4", pidfd, waited},
			{"(b2) waiter goroutine vs blocking wait", "corrald --no-pidfd", "goroutine in wait4", nopidfd, waited},
		})
	fmt.Fprintf(&s.out, "\nPart of corrald's figures is the exec.write close call itself: T0 to its answer was p50 %s ms, p99 %s ms (pidfd daemon), p50 %s ms, p99 %s ms (--no-pidfd daemon). "+
		"\"T0 → exited_at stamp\" ends at the daemon's own exited_at time (when its loop handled the exit), before the transition is committed to the store and sent. "+
		"The polling baseline's T0 is at a random phase of its 100 ms period.\n",
		ms(pfWrite.pct(.5)), ms(pfWrite.pct(.99)), ms(npWrite.pct(.5)), ms(npWrite.pct(.99)))
}
