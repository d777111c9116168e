package survival

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/tests/harness"
)

// TestKill9WhileStarting: corrald is killed -9 while many exec.start are
// in flight (each on its own connection), so some are caught after their
// created record and before their running one. One whose command was let
// run is adopted (its fds were parked by then) and ends with its real
// outcome (exit code, stdout, a file it made); one whose command never
// ran ends start_failed with the error saying so, and the file it would
// have made does not exist. None may end lost: a shim caught before its
// release or during a pooled dispatch had its fds parked with its
// exec-error pipe (reactor.RoleExec), which tells the restart which of
// the two it was.
func TestKill9WhileStarting(t *testing.T) {
	setup(t)
	c := dial(t)
	info, err := c.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.Survival == nil || !info.Survival.FdStore {
		t.Fatalf("daemon.info survival = %+v, want fdstore true under systemd", info.Survival)
	}
	const n = 48
	run := fmt.Sprintf("kill9start-%d", time.Now().UnixNano())
	ids := make([]string, n)
	answered := make([]bool, n)
	var mu sync.Mutex
	nAnswered := 0
	var wg sync.WaitGroup
	first := make(chan struct{})
	var once sync.Once
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%d", run, i)
		cl, err := ipc.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			mark := filepath.Join(countDir, ids[i])
			sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := cl.Start(sctx, api.StartParams{ID: ids[i], Cwd: "/",
				Argv: []string{"sh", "-c", fmt.Sprintf("touch %s; echo hi-%d; sleep 1; exit %d", mark, i, i%5)}})
			if err == nil {
				mu.Lock()
				answered[i] = true
				nAnswered++
				mu.Unlock()
				once.Do(func() { close(first) })
			}
		}()
	}
	// Kill once the first start was answered: the others are in flight.
	select {
	case <-first:
	case <-time.After(60 * time.Second):
		t.Fatal("no exec.start answered within 60s")
	}
	old := mainPID(t)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", "corrald.service")
	mu.Lock()
	atKill := nAnswered
	mu.Unlock()
	wg.Wait()
	c = waitNewMain(t, old)

	var adoptedStarting, neverRan, absent int
	for i, id := range ids {
		wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		rec, err := c.Wait(wctx, api.WaitParams{ID: id})
		cancel()
		if api.ErrorCode(err) == api.CodeNotFound && !answered[i] {
			absent++ // the exec.start never reached the daemon
			continue
		}
		if err != nil {
			t.Errorf("%s: exec.wait: %v", id, err)
			continue
		}
		mark := filepath.Join(countDir, id)
		_, statErr := os.Stat(mark)
		os.Remove(mark)
		switch outcome := outcomeOf(rec); outcome {
		case api.OutcomeExited:
			if rec.ExitCode == nil || *rec.ExitCode != i%5 {
				t.Errorf("%s: exit code %v, want %d", id, rec.ExitCode, i%5)
			}
			out, err := c.Output(ctx(t), api.OutputParams{ID: id})
			if err != nil || string(out.Data) != fmt.Sprintf("hi-%d\n", i) {
				t.Errorf("%s: stdout %q (%v), want hi-%d", id, out.Data, err, i)
			}
			// The pid of one adopted while starting is known only if it
			// still ran at the restart (a reaped process's pidfd says no pid).
			if (answered[i] && rec.PID <= 0) || rec.StartedAt == nil || rec.Scope == "" {
				t.Errorf("%s: pid %d started_at %v scope %q after adoption", id, rec.PID, rec.StartedAt, rec.Scope)
			}
			if !answered[i] && rec.Adopted > 0 {
				adoptedStarting++
			}
		case api.OutcomeStartFailed:
			if answered[i] {
				t.Errorf("%s: start_failed (%s), though its exec.start was answered", id, strOr(rec.Error))
			}
			if strOr(rec.Error) != reactor.StartFailedRestart {
				t.Errorf("%s: start_failed with error %q, want %q", id, strOr(rec.Error), reactor.StartFailedRestart)
			}
			if statErr == nil {
				t.Errorf("%s: start_failed (nothing ran), but its command made %s", id, mark)
			}
			neverRan++
		default:
			t.Errorf("%s: outcome %s (error %q), want exited or start_failed (answered before the kill: %v)", id, outcome, strOr(rec.Error), answered[i])
		}
	}
	t.Logf("%d starts, %d answered before the kill, %d answered in all; after the restart: %d adopted while starting, %d start_failed (never ran), %d never reached the daemon",
		n, atKill, nAnswered, adoptedStarting, neverRan, absent)
	if adoptedStarting+neverRan == 0 {
		t.Errorf("no start was in flight at the kill (%d answered before it): the test did not test", atKill)
	}
}

func outcomeOf(rec api.Record) api.Outcome {
	if rec.Outcome == nil {
		return ""
	}
	return *rec.Outcome
}

// TestKill9BeforeAdopt: corrald (with the hidden --test-adopt-delay, a
// loop that takes children up late) is killed -9 after the commands ran
// but before any running record: their records are started, their fds
// parked by spawn. The restarted corrald adopts every one, and each ends
// with its real exit code and output (given stdin read in full), with its
// pid (still running at the restart: RestartSec=1s, the commands 4s),
// scope and started_at in the record.
func TestKill9BeforeAdopt(t *testing.T) {
	setup(t)
	corrald("--test-adopt-delay", "20s").WriteDropIn(t)
	harness.Sh(t, "systemctl", "daemon-reload")
	harness.Sh(t, "systemctl", "restart", "corrald.service")
	restored := false
	restore := func() {
		if !restored {
			restored = true
			corrald().WriteDropIn(t)
			harness.Sh(t, "systemctl", "daemon-reload")
		}
	}
	defer func() {
		restore()
		harness.Sh(t, "systemctl", "restart", "corrald.service")
	}()
	c := dial(t)
	const n = 8
	run := fmt.Sprintf("beforeadopt-%d", time.Now().UnixNano())
	var wg sync.WaitGroup
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%d", run, i)
		cl, err := ipc.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			mark := filepath.Join(countDir, ids[i])
			// stdin given: written into the pipe before the start.
			_, _ = cl.Start(sctx, api.StartParams{ID: ids[i], Cwd: "/", Stdin: []byte(fmt.Sprintf("in-%d\n", i)),
				Argv: []string{"sh", "-c", fmt.Sprintf("touch %s; read x; echo hi-$x; sleep 4; exit %d", mark, i%5)}})
		}()
	}
	// Every command ran (its mark exists), none is running in the records.
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < n; {
		if _, err := os.Stat(filepath.Join(countDir, ids[i])); err == nil {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: its command did not run within 15s", ids[i])
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range ids {
		if rec, err := c.Get(ctx(t), id); err != nil || rec.State != api.StateStarted {
			t.Fatalf("%s before the kill: state %v, %v; want started (the adopt is held)", id, rec.State, err)
		}
	}
	restore() // the restart runs without the delay
	old := mainPID(t)
	harness.Sh(t, "systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", "corrald.service")
	wg.Wait()
	c = waitNewMain(t, old)
	for i, id := range ids {
		os.Remove(filepath.Join(countDir, id))
		wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		rec, err := c.Wait(wctx, api.WaitParams{ID: id})
		cancel()
		if err != nil {
			t.Errorf("%s: exec.wait: %v", id, err)
			continue
		}
		if outcomeOf(rec) != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != i%5 || rec.Adopted != 1 {
			t.Errorf("%s: outcome %s (error %q) exit %v adopted %d; want exited %d, adopted 1", id, outcomeOf(rec), strOr(rec.Error), rec.ExitCode, rec.Adopted, i%5)
			continue
		}
		out, err := c.Output(ctx(t), api.OutputParams{ID: id})
		if err != nil || string(out.Data) != fmt.Sprintf("hi-in-%d\n", i) {
			t.Errorf("%s: stdout %q (%v), want hi-in-%d", id, out.Data, err, i)
		}
		if rec.PID <= 0 || rec.Scope == "" || rec.StartedAt == nil || !rec.StartedAt.Equal(rec.CreatedAt) {
			t.Errorf("%s: pid %d scope %q started_at %v (created_at %v); want the pidfd's pid, its scope, started_at = created_at",
				id, rec.PID, rec.Scope, rec.StartedAt, rec.CreatedAt)
		}
	}
}
