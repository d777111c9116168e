package reactor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testenv"
)

// start starts p as root and returns its record.
func (tr *testReactor) start(p api.StartParams) api.Record {
	tr.t.Helper()
	rec, err := tr.Start(context.Background(), root, p)
	if err != nil {
		tr.t.Fatalf("Start(%v) = %v", p.Argv, err)
	}
	return rec
}

func wantCode(t *testing.T, what string, err error, code api.Code) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("%s = %v, want error %d", what, err, code)
	}
}

func TestOutputWaitReturnsWhenDataArrives(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.start(api.StartParams{Argv: []string{"sh", "-c", "read x; echo got $x; sleep 30"}, StdinOpen: true})
	defer tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})

	type answer struct {
		res api.OutputResult
		err error
		at  time.Time
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, WaitMS: 30000})
		ch <- answer{res, err, time.Now()}
	}()
	// Nothing is written before the child is told to: the call must park.
	select {
	case a := <-ch:
		t.Fatalf("Output with wait_ms answered %q (err %v) before any output", a.res.Data, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	sent := time.Now()
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: []byte("x\n")}); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-ch:
		if a.err != nil || string(a.res.Data) != "got x\n" || a.res.EOF || a.res.NextOffset != 6 {
			t.Fatalf("Output = %+v, %v; want \"got x\\n\", next_offset 6, not eof", a.res, a.err)
		}
		t.Logf("answered %v after the input that makes the output", a.at.Sub(sent))
	case <-time.After(15 * time.Second):
		t.Fatal("Output with wait_ms 30000 did not answer within 15s of the data")
	}
}

func TestOutputWaitDeadlineAndEOF(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.start(api.StartParams{Argv: []string{"sh", "-c", "echo one; read x; exit 0"}, StdinOpen: true})
	// The first line, waited for.
	res, err := tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, WaitMS: 60000})
	if err != nil || string(res.Data) != "one\n" {
		t.Fatalf("Output with wait_ms = %+v, %v; want one", res, err)
	}
	// Past what is kept: the wait ends at its deadline with no data.
	start := time.Now()
	res, err = tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, Offset: 4, WaitMS: 300})
	took := time.Since(start)
	if err != nil || len(res.Data) != 0 || res.EOF || res.NextOffset != 4 || res.TotalBytes != 4 {
		t.Fatalf("Output at the deadline = %+v, %v; want empty at offset 4, not eof", res, err)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("Output with wait_ms 300 answered after %v, before its deadline", took)
	}
	// Data already kept is answered at once, wait_ms or not.
	res, err = tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, WaitMS: 60000})
	if err != nil || string(res.Data) != "one\n" {
		t.Fatalf("Output of kept data = %+v, %v", res, err)
	}
	// The end of the stream wakes a parked read with eof.
	ch := make(chan api.OutputResult, 1)
	go func() {
		res, _ := tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, Offset: 4, WaitMS: 60000})
		ch <- res
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: []byte("\n"), Close: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-ch:
		if !res.EOF || len(res.Data) != 0 || res.NextOffset != 4 {
			t.Fatalf("parked Output at exit = %+v, want eof at 4", res)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a parked Output was not answered when the stream ended")
	}
	tr.wait(rec.ID)
	// Cleaned (answered from the store if gone): eof at once.
	res, err = tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, Offset: 4, WaitMS: 60000})
	if err != nil || !res.EOF {
		t.Fatalf("Output of a cleaned execution = %+v, %v; want eof", res, err)
	}
}

func TestOutputWaitRejectsBadParams(t *testing.T) {
	tr := newTestReactor(t, nil)
	rec := tr.run(api.StartParams{Argv: []string{"true"}})
	for _, p := range []api.OutputParams{
		{ID: rec.ID, WaitMS: api.MaxWaitMS + 1},
		{ID: rec.ID, WaitMS: -1},
	} {
		_, err := tr.Output(context.Background(), root, p)
		wantCode(t, fmt.Sprintf("Output(wait_ms %d)", p.WaitMS), err, api.CodeInvalidParams)
		if !strings.Contains(err.Error(), "wait_ms") {
			t.Errorf("error %q does not name wait_ms", err)
		}
	}
}

// A thousand exec.output calls with wait_ms, over the real ipc server, park
// without a goroutine each and all return: 500 when output arrives, 500 at
// their deadline; and a closed connection drops its parked reads.
func TestThousandParkedReaders(t *testing.T) {
	tr := newTestReactor(t, nil)
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	srv := ipc.NewServer(tr.Reactor, zerolog.Nop())
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	rec := tr.start(api.StartParams{Argv: []string{"sh", "-c", "read x; echo $x; read y; echo $y; sleep 30"}, StdinOpen: true})
	defer tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})

	const n = 1000
	conns := make([]*bufio.ReadWriter, 4)
	ncs := make([]net.Conn, 4)
	for i := range conns {
		nc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ncs[i] = nc
		conns[i] = bufio.NewReadWriter(bufio.NewReader(nc), bufio.NewWriter(nc))
	}
	// One answered call per connection: its reader and writer goroutines
	// run before the baseline is taken. Goroutines are then told apart by
	// id, not counted, so that those ending meanwhile (an earlier test's,
	// these calls') do not hide new ones.
	for i, c := range conns {
		fmt.Fprintf(c, `{"jsonrpc":"2.0","id":"info%d","method":"daemon.info"}`+"\n", i)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if line, err := c.ReadString('\n'); err != nil || !strings.Contains(line, `"result"`) {
			t.Fatalf("daemon.info on connection %d = %q, %v", i, line, err)
		}
	}
	before := testenv.GoroutineStacks()
	// Connections 0 and 1: 500 reads that data ends; 2: 250 that end at
	// their deadline; 3: 250 dropped when the connection closes. Those of
	// connection 0 are sent one at a time, each parked before the next, so
	// their answers must come in id order.
	parkedNow := func() (n int) {
		_ = tr.onLoop(context.Background(), func() { n = len(tr.execs[rec.ID].streams[0].parked) })
		return n
	}
	waitParked := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for parkedNow() != want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := parkedNow(); got != want {
			t.Fatalf("%d reads parked, want %d", got, want)
		}
	}
	send := func(c, i int) {
		wait := 60000
		if c == 2 {
			wait = 5000
		}
		fmt.Fprintf(conns[c], `{"jsonrpc":"2.0","id":%d,"method":"exec.output","params":{"id":%q,"wait_ms":%d}}`+"\n", i, rec.ID, wait)
	}
	// Connection 0 first, one read at a time; then the others at once (the
	// deadline ones' clock starts then).
	for i := 0; i < n; i += 4 {
		send(0, i)
		if err := conns[0].Flush(); err != nil {
			t.Fatal(err)
		}
		waitParked(i/4 + 1)
	}
	for i := range n {
		if c := i % 4; c != 0 {
			send(c, i)
		}
	}
	for _, c := range conns {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitParked(n)
	// A read counts as parked once the loop has queued it; the request
	// goroutine that brought it (up to MaxInFlight per connection) returns
	// only after that, which on a loaded host can take a while. So wait,
	// bounded, for them to go: what a goroutine per parked read would
	// leave stays, the 750 reads that wait 60 s outlast the wait.
	first, grown, took := testenv.WaitGoroutinesSettle(before, nil, 50, 10*time.Second)
	if len(grown) > 50 {
		t.Fatalf("%d goroutines started since the %d parked reads were sent are still there after %v, want none per read; they are:\n%s",
			len(grown), n, took, testenv.GroupStacks(grown))
	}
	t.Logf("%d parked reads: %d goroutines new since before at first look, %d after %v", n, first, len(grown), took)

	ncs[3].Close()
	type resp struct {
		ID     int              `json:"id"`
		Result api.OutputResult `json:"result"`
		Error  *json.RawMessage `json:"error"`
	}
	read := func(c *bufio.ReadWriter, count int) []resp {
		var out []resp
		for range count {
			line, err := c.ReadString('\n')
			if err != nil {
				t.Fatalf("read answer: %v", err)
			}
			var r resp
			if err := json.Unmarshal([]byte(line), &r); err != nil || r.Error != nil {
				t.Fatalf("answer %q: %v", line, err)
			}
			out = append(out, r)
		}
		return out
	}
	// The deadline ones: empty at offset 0.
	for _, r := range read(conns[2], n/4) {
		if len(r.Result.Data) != 0 || r.Result.EOF {
			t.Fatalf("deadline answer %d = %+v, want empty", r.ID, r.Result)
		}
	}
	// The dropped ones are gone from the stream's queue.
	waitParked(n / 2)
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Data: []byte("hello\n")}); err != nil {
		t.Fatal(err)
	}
	for ci, c := range conns[:2] {
		prev := -1
		for _, r := range read(c, n/4) {
			if string(r.Result.Data) != "hello\n" {
				t.Fatalf("answer %d = %q, want hello", r.ID, r.Result.Data)
			}
			if ci == 0 && r.ID <= prev {
				t.Fatalf("answer %d after %d: not in the order they parked", r.ID, prev)
			}
			prev = r.ID
		}
	}
}

func TestIdleTimeout(t *testing.T) {
	tr := newTestReactor(t, nil)
	t.Run("silent", func(t *testing.T) {
		rec := tr.run(api.StartParams{Argv: []string{"sleep", "100"}, IdleTimeoutMS: 500})
		if outcome(rec) != api.OutcomeIdleTimeout || rec.Signal == nil || *rec.Signal != "SIGTERM" {
			t.Fatalf("outcome %s signal %v, want idle_timeout by SIGTERM", outcome(rec), rec.Signal)
		}
		if rec.DurationMS < 500 || rec.DurationMS > 5000 {
			t.Fatalf("duration_ms = %d, want about the idle limit of 500", rec.DurationMS)
		}
		if rec.IdleTimeoutMS != 500 || rec.Error == nil || !strings.Contains(*rec.Error, "no output for 500 ms") {
			t.Fatalf("record idle_timeout_ms %d error %v", rec.IdleTimeoutMS, rec.Error)
		}
	})
	t.Run("chatty", func(t *testing.T) {
		rec := tr.start(api.StartParams{Argv: []string{"sh", "-c", "for i in $(seq 30); do echo $i; sleep 0.1; done"}, IdleTimeoutMS: 500})
		var arms int
		// Sample the arming count until it ends.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var done bool
			_ = tr.onLoop(context.Background(), func() {
				e := tr.execs[rec.ID]
				done = e == nil || e.state.Finished()
				if e != nil {
					arms = e.idleArms
				}
			})
			if done {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		rec = tr.wait(rec.ID)
		if outcome(rec) != api.OutcomeExited || *rec.ExitCode != 0 {
			t.Fatalf("outcome %s, want exited 0 (output every 100 ms under a 500 ms idle limit)", outcome(rec))
		}
		if rec.DurationMS < 3000 || rec.Stdout.TotalBytes < 80 {
			t.Fatalf("duration_ms = %d, stdout %d bytes: want the whole 3 s, 30 lines", rec.DurationMS, rec.Stdout.TotalBytes)
		}
		// One arming per idle period at most (the run's length over the
		// limit, plus the first), never one per chunk (30 lines).
		if max := int(rec.DurationMS/500) + 2; arms > max || arms == 0 {
			t.Fatalf("idle timer armed %d times over %d ms of output in 30 chunks, want at most %d", arms, rec.DurationMS, max)
		}
		t.Logf("idle timer armed %d times for 30 chunks over %d ms", arms, rec.DurationMS)
	})
	t.Run("stderr counts", func(t *testing.T) {
		rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i >&2; sleep 0.1; done"}, IdleTimeoutMS: 500})
		if outcome(rec) != api.OutcomeExited {
			t.Fatalf("outcome %s, want exited (stderr output resets the idle limit too)", outcome(rec))
		}
	})
}

func TestUpdateMovesDeadline(t *testing.T) {
	tr := newTestReactor(t, nil)
	ms := func(v int64) *int64 { return &v }
	t.Run("shorten", func(t *testing.T) {
		rec := tr.start(api.StartParams{Argv: []string{"sleep", "60"}, TimeoutMS: 60000})
		if rec.Deadline == nil || time.Until(*rec.Deadline) < 50*time.Second {
			t.Fatalf("running record deadline = %v, want about 60 s from now", rec.Deadline)
		}
		up, err := tr.Update(context.Background(), root, api.UpdateParams{ID: rec.ID, TimeoutMS: ms(300)})
		if err != nil || up.Deadline == nil || time.Until(*up.Deadline) > 300*time.Millisecond {
			t.Fatalf("Update = deadline %v, %v; want within 300 ms", up.Deadline, err)
		}
		stored, ok, err := tr.store.Get(rec.ID)
		if err != nil || !ok || stored.Deadline == nil || !stored.Deadline.Equal(*up.Deadline) {
			t.Fatalf("stored deadline = %v (%v), want the new one %v", stored.Deadline, err, up.Deadline)
		}
		final := tr.wait(rec.ID)
		if outcome(final) != api.OutcomeTimeout || final.DurationMS > 10000 || final.Deadline != nil {
			t.Fatalf("outcome %s after %d ms, deadline %v; want timeout soon after the new deadline, none in the record", outcome(final), final.DurationMS, final.Deadline)
		}
	})
	t.Run("extend", func(t *testing.T) {
		// Without the update the 2 s limit would end the 3 s sleep.
		rec := tr.start(api.StartParams{Argv: []string{"sleep", "3"}, TimeoutMS: 2000})
		if _, err := tr.Update(context.Background(), root, api.UpdateParams{ID: rec.ID, TimeoutMS: ms(30000)}); err != nil {
			t.Fatal(err)
		}
		final := tr.wait(rec.ID)
		if outcome(final) != api.OutcomeExited || *final.ExitCode != 0 {
			t.Fatalf("outcome %s, want exited 0 after the deadline was extended", outcome(final))
		}
	})
	t.Run("exited", func(t *testing.T) {
		rec := tr.run(api.StartParams{Argv: []string{"true"}})
		_, err := tr.Update(context.Background(), root, api.UpdateParams{ID: rec.ID, TimeoutMS: ms(1000)})
		wantCode(t, "Update(exited)", err, api.CodeInvalidParams)
	})
	t.Run("bad params", func(t *testing.T) {
		for _, p := range []api.UpdateParams{{ID: "x"}, {ID: "x", TimeoutMS: ms(0)}, {ID: "x", TimeoutMS: ms(-5)}, {TimeoutMS: ms(5)}} {
			_, err := tr.Update(context.Background(), root, p)
			wantCode(t, fmt.Sprintf("Update(%+v)", p), err, api.CodeInvalidParams)
		}
		_, err := tr.Update(context.Background(), root, api.UpdateParams{ID: "nope", TimeoutMS: ms(5)})
		wantCode(t, "Update(unknown)", err, api.CodeNotFound)
	})
}
