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
// created record and before their running one. None may end lost: one
// whose command was let run is adopted (its fds were parked by then) and
// ends with its real outcome (exit code, stdout, a file it made); one
// whose command never ran ends start_failed with the error saying so, and
// the file it would have made does not exist.
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
			if rec.PID <= 0 || rec.StartedAt == nil || rec.Scope == "" {
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
