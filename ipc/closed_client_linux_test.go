package ipc

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/tests/testenv"
)

// TestClosedClientLeavesNothing: a client that goes away while a call it
// made is still pending (an exec.wait, an exec.follow, a parked exec.output
// wait_ms, a follow whose notifications fill its socket because it never
// reads, or a wait after shutdown(SHUT_WR) and then close) leaves none of
// its connection in the server: within a bound, every goroutine the server
// started for it has ended and the process holds no more fds than before
// it dialled. A connection kept after its client closed it is what a
// TestDrillHost/kill-9 failure at 1b6b218 (2 sockets, 2 goroutines more
// after the load) was read as.
func TestClosedClientLeavesNothing(t *testing.T) {
	flood := func(ctx context.Context, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
		chunk := make([]byte, 4096)
		for i := 0; ctx.Err() == nil; i++ {
			notify(api.NotifyOutput, api.OutputNotification{ID: p.ID, Stream: "stdout", Offset: int64(i * len(chunk)), Data: chunk})
			time.Sleep(time.Millisecond)
		}
		return api.Record{}, ctx.Err()
	}
	cases := []struct {
		name   string
		follow func(ctx context.Context, p api.FollowParams, notify func(string, any) bool) (api.Record, error)
		req    string
		// pending waits until the call has reached the service.
		pending func(t *testing.T, f *fakeService)
		half    bool // shutdown(SHUT_WR) first, then close
	}{
		{name: "wait", req: `{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"block"}}`,
			pending: func(t *testing.T, f *fakeService) { f.awaitWait(t) }},
		{name: "half-closed-wait", req: `{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"block"}}`,
			pending: func(t *testing.T, f *fakeService) { f.awaitWait(t) }, half: true},
		{name: "parked-output", req: `{"jsonrpc":"2.0","id":1,"method":"exec.output","params":{"id":"x","wait_ms":60000}}`,
			pending: func(t *testing.T, f *fakeService) {
				for deadline := time.Now().Add(10 * time.Second); f.parkedCount() == 0; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the exec.output did not park within 10s")
					}
				}
			}},
		{name: "follow-never-read", follow: flood, req: `{"jsonrpc":"2.0","id":1,"method":"exec.follow","params":{"id":"f"}}`,
			pending: func(t *testing.T, f *fakeService) {
				// Long enough for the socket buffer to fill and the writer
				// to block in write(2).
				time.Sleep(300 * time.Millisecond)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.follow = tc.follow
			path, _ := startServer(t, f, nil)
			// One connection served and ended first (to the server's
			// close: EOF after our shutdown(SHUT_WR)), so that the
			// listener's own goroutines run and no fd of it is left
			// when the baseline is taken.
			warm := dialRaw(t, path)
			warm.send(`{"jsonrpc":"2.0","id":0,"method":"daemon.info"}`)
			if err := warm.nc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			warm.mustRead()
			if _, err := warm.read(10 * time.Second); !errors.Is(err, io.EOF) {
				t.Fatalf("warm-up connection: %v, want EOF", err)
			}
			warm.nc.Close()
			before := testenv.GoroutineStacks()
			fds := openFDs(t)

			c := dialRaw(t, path)
			c.send(tc.req)
			tc.pending(t, f)
			if tc.half {
				if err := c.nc.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * hangupPoll)
			}
			c.nc.Close()

			_, left, took := testenv.WaitGoroutinesSettle(before, serverGoroutine, 0, 10*time.Second)
			if len(left) > 0 {
				t.Fatalf("%d goroutines of the server are still there %v after the client closed, want none:\n%s", len(left), took, testenv.GroupStacks(left))
			}
			deadline := time.Now().Add(10 * time.Second)
			for openFDs(t) > fds && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := openFDs(t); n > fds {
				t.Fatalf("the process holds %d fds 10s after the client closed, %d before it dialled", n, fds)
			}
		})
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
