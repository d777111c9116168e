package survival

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/harness"
)

// TestCancelThenCrash: 16 clients cancel 16 running executions at once,
// and corrald is killed with SIGKILL the moment the first answer arrives.
// Every execution must end cancelled with its reason: those whose cancel
// was answered at once (the answer means the cancel is durable), the
// others once their client, its call broken by the kill, cancels again
// after the restart (as a client does). Each child exits 0 on SIGTERM, so
// a cancel the restarted corrald did not know of shows as "exited" 0 (the
// drill's sd-kill-9 saw one: the answer went out before the canceling
// record was durable). Three rounds: the window it looks for is narrow.
func TestCancelThenCrash(t *testing.T) {
	setup(t)
	for round := 1; round <= 3; round++ {
		cancelThenCrash(t, round)
	}
}

func cancelThenCrash(t *testing.T, round int) {
	c := dial(t)
	const n = 16
	ids := make([]string, n)
	for i := range ids {
		rec, err := c.Start(ctx(t), api.StartParams{Cwd: "/", GraceMS: 10000, TimeoutMS: 120000,
			Argv: []string{"sh", "-c", "trap 'exit 0' TERM; sleep 8 & wait"}})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = rec.ID
	}
	clients := make([]*ipc.Client, n)
	for i := range clients {
		clients[i] = dial(t)
	}
	// Three kill -9 restarts in a few seconds, after other tests' own:
	// keep systemd's start limit (5 in 10 s) out of it.
	harness.Sh(t, "systemctl", "reset-failed", "corrald.service")
	pid := mainPID(t)
	// A load that keeps the store's writer busy (executions of 256 KiB of
	// kept output each, back to back), as under the drill: the canceling
	// records then wait behind other commits while an answer sent before
	// its record is durable does not.
	churned, stopChurn := churn(t, 8)
	var (
		wg       sync.WaitGroup
		killOnce sync.Once
		killed   bool
		answered = make([]bool, n)
		ready    = make(chan struct{})
	)
	reason := func(i int) string { return fmt.Sprintf("survival: round %d, cancel %d then crash", round, i) }
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := clients[i].Cancel(cctx, api.CancelParams{ID: ids[i], Reason: reason(i)})
			if err != nil {
				return // broken by the kill: cancelled again below
			}
			answered[i] = true
			killOnce.Do(func() {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Errorf("kill -9 %d: %v", pid, err)
				}
				killed = true
			})
		}()
	}
	time.Sleep(500 * time.Millisecond)
	close(ready)
	wg.Wait()
	stopChurn()
	if !killed {
		t.Fatalf("no exec.cancel was answered\n%s", journalTail())
	}
	c = waitNewMain(t, pid)
	unanswered := 0
	for i, id := range ids {
		if answered[i] {
			continue
		}
		unanswered++
		if _, err := c.Cancel(ctx(t), api.CancelParams{ID: id, Reason: reason(i)}); err != nil {
			t.Errorf("exec.cancel %s again after the restart: %v", id, err)
		}
	}
	wrong := 0
	for i, id := range ids {
		rec, err := c.Wait(ctx(t), api.WaitParams{ID: id})
		if err != nil || rec.State != api.StateCleaned {
			t.Fatalf("exec.wait %s: %v (state %v)", id, err, rec.State)
		}
		if outcome(rec) != "cancelled" || rec.CancelReason != reason(i) {
			wrong++
			code := "none"
			if rec.ExitCode != nil {
				code = fmt.Sprint(*rec.ExitCode)
			}
			t.Errorf("round %d: %s (cancel answered before the kill: %v): outcome %s exit %s error %q cancel_reason %q adopted %d, want cancelled with its reason",
				round, id, answered[i], outcome(rec), code, strOr(rec.Error), rec.CancelReason, rec.Adopted)
		}
	}
	t.Logf("round %d: %d cancels answered before the kill -9, %d cancelled again after the restart; %d wrong", round, n-unanswered, unanswered, wrong)
	for _, id := range churned() {
		rec, err := c.Wait(ctx(t), api.WaitParams{ID: id})
		if errors.Is(err, api.ErrNotFound) {
			continue // its exec.start never reached corrald
		}
		if err != nil || rec.State != api.StateCleaned {
			t.Errorf("exec.wait %s (load): %v (state %v)", id, err, rec.State)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for prop(t, "NFileDescriptorStore") != "0" {
		if time.Now().After(deadline) {
			t.Errorf("fd store holds %s fds after every execution was cleaned", prop(t, "NFileDescriptorStore"))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// churn runs w clients that start executions writing 256 KiB and wait
// for them, back to back, until stop (or their connection breaks); ids
// then lists every execution they started or may have started.
func churn(t *testing.T, w int) (ids func() []string, stop func()) {
	var (
		mu   sync.Mutex
		all  []string
		wg   sync.WaitGroup
		quit = make(chan struct{})
	)
	for k := 0; k < w; k++ {
		cc, err := ipc.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cc.Close()
			for i := 0; ; i++ {
				select {
				case <-quit:
					return
				default:
				}
				id := fmt.Sprintf("churn-%d-%d-%d", k, i, time.Now().UnixNano())
				mu.Lock()
				all = append(all, id)
				mu.Unlock()
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := cc.Start(cctx, api.StartParams{ID: id, Cwd: "/", Argv: []string{"head", "-c", "262144", "/dev/zero"}})
				if err == nil {
					_, err = cc.Wait(cctx, api.WaitParams{ID: id})
				}
				cancel()
				if err != nil {
					return // the kill broke the connection
				}
			}
		}()
	}
	return func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), all...)
		}, func() {
			close(quit)
			wg.Wait()
		}
}
