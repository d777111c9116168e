package reactor

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// TestOutputBeforeExited: a follower is sent every byte the main process
// wrote before it exited ahead of the exec.state notification that says
// exited, with the pidfd and with the waiter goroutine, though that
// notification may be sent from the store's answer (on another goroutine)
// while the loop has not yet read the pipes. The command's last write
// comes right before its exit, so the pipe still holds it when the exit is
// seen.
func TestOutputBeforeExited(t *testing.T) {
	for _, noPidfd := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPidfd=%v", noPidfd), func(t *testing.T) {
			tr := newTestReactor(t, func(c *Config) { c.Store, c.NoPidfd = store.NewMemory(), noPidfd })
			for round := 0; round < 30; round++ {
				rec, err := tr.Start(context.Background(), root, api.StartParams{
					Argv: []string{"sh", "-c", "read x; head -c 200000 /dev/zero; printf end"}, StdinOpen: true})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				var (
					mu       sync.Mutex
					got      int64 // stdout bytes sent so far
					atExited = int64(-1)
					once     sync.Once
					wrote    = make(chan error, 1)
				)
				final, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, func(method string, params any) bool {
					mu.Lock()
					defer mu.Unlock()
					switch method {
					case api.NotifyOutput:
						if n, ok := params.(api.OutputNotification); ok && n.Stream == "stdout" {
							got += int64(len(n.Data))
						}
					case api.NotifyState:
						once.Do(func() {
							go func() {
								_, err := tr.Write(ctx, root, api.WriteParams{ID: rec.ID, Data: []byte("go\n"), Close: true})
								wrote <- err
							}()
						})
						if st := stateOf(t, params); st == api.StateExited && atExited < 0 {
							atExited = got
						}
					}
					return true
				})
				cancel()
				if err != nil || final.State != api.StateCleaned {
					t.Fatalf("round %d: Follow = %v, %v", round, final.State, err)
				}
				if err := <-wrote; err != nil {
					t.Fatalf("round %d: write stdin: %v", round, err)
				}
				mu.Lock()
				if final.Stdout.TotalBytes != 200003 || atExited != final.Stdout.TotalBytes {
					t.Fatalf("round %d: %d stdout bytes sent before exec.state exited, %d in all (the final record says %d): output the command wrote before it exited came after its exited",
						round, atExited, got, final.Stdout.TotalBytes)
				}
				mu.Unlock()
			}
		})
	}
}

// stateOf is the state an exec.state notification's params carry: the
// store's JSON sent on as it is, or the notification itself.
func stateOf(t *testing.T, params any) api.State {
	t.Helper()
	switch p := params.(type) {
	case api.StateNotification:
		return p.Record.State
	case *api.StateNotification:
		return p.Record.State
	case json.RawMessage:
		var n api.StateNotification
		if err := json.Unmarshal(p, &n); err != nil {
			t.Errorf("exec.state params %s: %v", p, err)
		}
		return n.Record.State
	}
	t.Errorf("exec.state params of type %T", params)
	return 0
}
