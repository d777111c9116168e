package reactor

import (
	"context"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestWaitForCleanedAnsweredWithoutTheLoop: exec.wait for an execution
// whose cleaned record is durable is answered on the caller's goroutine
// from the record the store's writer kept, with the store's JSON, even
// while the loop is busy (here blocked on purpose): no round trip through
// the loop once the record is final. Another uid's wait is still not
// answered from it.
func TestWaitForCleanedAnsweredWithoutTheLoop(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Cwd: "/", Argv: []string{"true"}})
	block, blocked := make(chan struct{}), make(chan struct{})
	if err := tr.loop.Post(func() { close(blocked); <-block }); err != nil {
		t.Fatal(err)
	}
	defer close(block)
	<-blocked
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: rec.ID})
	if err != nil || got.State != api.StateCleaned || len(js) == 0 {
		t.Fatalf("WaitEncoded while the loop is blocked = %v, %d bytes of JSON, %v; want cleaned with the store's JSON", got.State, len(js), err)
	}
	if _, ok := tr.recentFor(testCaller(4242), rec.ID); ok {
		t.Error("another uid's caller found the kept record")
	}
}
