package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// benchLongPoll is (l): how soon a client that waits for new output learns
// of it. At T0 the benchmark types a line into `cat` (exec.write); end: the
// answer of an exec.output with wait_ms parked at the old offset, the
// exec.output notification of an exec.follow on its own connection (the
// baseline: the push path), and a client polling exec.output every 100 ms
// (what a stateless client without wait_ms does). Each on its own
// connection, all watching the same execution at once.
func (s *suite) benchLongPoll(t *testing.T) {
	d := s.startDaemon(t, "long-poll", "cgroup", 0)
	ctx := ctxT(t, 5*time.Minute)
	cw, cl, cf, cp := d.Client(), d.Client(), d.Client(), d.Client()
	rec, err := cw.Start(ctx, api.StartParams{Argv: []string{"cat"}, StdinOpen: true, TimeoutMS: 600000,
		Env: map[string]string{markEnv: markValue()}})
	if err != nil {
		t.Fatalf("exec.start: %v", err)
	}
	notes := make(chan time.Time, 16)
	followed := make(chan error, 1)
	go func() {
		_, err := cf.Follow(ctx, api.FollowParams{ID: rec.ID}, func(method string, params json.RawMessage) {
			if method == api.NotifyOutput {
				notes <- time.Now()
			}
		})
		followed <- err
	}()
	var longPolled, followedNote, polled durations
	var next int64 // offset of the next line
	for i := 0; i < 5+notifyN; i++ {
		keep := i >= 5
		off := next
		lp := make(chan time.Time, 1)
		go func() {
			res, err := cl.Output(ctx, api.OutputParams{ID: rec.ID, Offset: off, WaitMS: 10000})
			if err != nil || len(res.Data) == 0 {
				t.Errorf("long poll at %d: %d bytes, %v", off, len(res.Data), err)
			}
			lp <- time.Now()
		}()
		pl := make(chan time.Time, 1)
		stop := make(chan struct{})
		go func() {
			// The poller's phase is random against T0, as a real one's is.
			time.Sleep(rand.N(pollEvery))
			for {
				res, err := cp.Output(ctx, api.OutputParams{ID: rec.ID, Offset: off})
				if err == nil && len(res.Data) > 0 {
					pl <- time.Now()
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(pollEvery):
				}
			}
		}()
		time.Sleep(50 * time.Millisecond) // the long poll is parked
		t0 := time.Now()
		if _, err := cw.Write(ctx, api.WriteParams{ID: rec.ID, Data: []byte("x\n")}); err != nil {
			t.Fatalf("exec.write: %v", err)
		}
		var a, b, c time.Time
		for _, ch := range []struct {
			at *time.Time
			c  <-chan time.Time
		}{{&a, lp}, {&b, notes}, {&c, pl}} {
			select {
			case *ch.at = <-ch.c:
			case <-time.After(10 * time.Second):
				t.Fatalf("sample %d: no answer within 10s", i)
			}
		}
		close(stop)
		next += 2
		if keep {
			longPolled = append(longPolled, a.Sub(t0))
			followedNote = append(followedNote, b.Sub(t0))
			polled = append(polled, c.Sub(t0))
		}
	}
	if _, err := cw.Cancel(ctx, api.CancelParams{ID: rec.ID}); err != nil {
		t.Fatalf("exec.cancel: %v", err)
	}
	if err := <-followed; err != nil {
		t.Fatalf("exec.follow: %v", err)
	}
	for _, c := range []*ipc.Client{cw, cl, cf, cp} {
		c.Close()
	}
	s.latencyTable("(l) new output to a waiting client",
		fmt.Sprintf("`cat` with stdin_open; at T0 the benchmark writes a line with exec.write; end: the client has the line. "+
			"%d samples, the three clients on their own connections watching at once; cgroup backend, --pool-size 0.", notifyN),
		[]latencyRow{
			{"long poll vs push", "exec.output wait_ms", "exec.follow notification", longPolled, followedNote},
			{"long poll vs polling", "exec.output wait_ms", fmt.Sprintf("exec.output every %s", pollEvery), longPolled, polled},
		})
}
