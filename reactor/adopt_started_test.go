package reactor

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// TestAdoptStartedRecord: corrald dies after spawn let the commands run
// (their fds parked from spawn's goroutine) but before the loop took them
// up, so their records are still started. A second reactor given those
// records and the parked fds takes them over with their real outcome: the
// pid from the pidfd, the scope the backend names, started_at = created_at,
// given stdin (written before the start) read in full.
func TestAdoptStartedRecord(t *testing.T) {
	st1 := store.NewMemory()
	fs := &fakeFdStore{fds: map[string]int{}}
	r1 := newTestReactor(t, func(c *Config) { c.Store, c.FdStore = st1, fs })
	block := make(chan struct{})
	r1.beforeAdopt = func() { <-block } // the loop never takes the children up
	t.Cleanup(func() { close(block) })  // runs before r1's shutdown
	type res struct {
		rec api.Record
		err error
	}
	started := make(chan res, 2)
	for _, p := range []api.StartParams{
		{Argv: []string{"sh", "-c", "read x; echo got $x; exit 3"}, Stdin: []byte("hello\n"), Cwd: "/"},
		{Argv: []string{"sh", "-c", "sleep 0.3; echo late >&2"}, Cwd: "/"},
	} {
		go func() {
			rec, err := r1.Start(context.Background(), root, p)
			started <- res{rec, err}
		}()
	}
	// Both parked by spawn, while the loop has adopted neither.
	var recs []api.Record
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, _ = st1.Unfinished()
		parked := 0
		fs.mu.Lock()
		for _, rec := range recs {
			if _, ok := fs.fds[FdName(rec.ID, RolePidfd)]; ok {
				parked++
			}
		}
		fs.mu.Unlock()
		if len(recs) == 2 && parked == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("records %d, pidfds parked %d; want 2 and 2 before adopt", len(recs), parked)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-started:
		t.Fatalf("Start answered before adopt: %+v, %v", r.rec, r.err)
	default:
	}
	// The second reactor's store holds what the first one's did at the
	// crash: the started records.
	st2 := store.NewMemory()
	var adopt []Adoptee
	for _, rec := range recs {
		if rec.State != api.StateStarted || rec.PID != 0 || rec.StartedAt != nil {
			t.Fatalf("record at the crash: state %s pid %d started_at %v; want started, no pid", rec.State, rec.PID, rec.StartedAt)
		}
		b, _, _ := st1.Params(rec.ID)
		if err := <-st2.Create(rec, b); err != nil {
			t.Fatal(err)
		}
		var p api.StartParams
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		adopt = append(adopt, Adoptee{Record: rec, Params: p, Fds: fs.passBack(t, rec.ID)})
	}
	r2 := newTestReactor(t, func(c *Config) { c.Store, c.FdStore, c.Adopt, c.Subreaper = st2, fs, adopt, false })
	if info, _ := r2.Info(context.Background()); info.Adopted != 2 {
		t.Errorf("daemon.info adopted = %d, want 2", info.Adopted)
	}
	for _, a := range adopt {
		rec := r2.wait(a.Record.ID)
		wantCode, wantOut, wantErr := 3, "got hello\n", ""
		if a.Params.Argv[2] != "read x; echo got $x; exit 3" {
			wantCode, wantOut, wantErr = 0, "", "late\n"
		}
		if outcome(rec) != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != wantCode || rec.Adopted != 1 {
			t.Errorf("%v: outcome %s exit %v adopted %d error %v; want exited %d, adopted 1", a.Params.Argv, outcome(rec), rec.ExitCode, rec.Adopted, rec.Error, wantCode)
		}
		if got := r2.stdout(a.Record.ID); got != wantOut {
			t.Errorf("%v: stdout %q, want %q", a.Params.Argv, got, wantOut)
		}
		if out, _ := r2.Output(context.Background(), root, api.OutputParams{ID: a.Record.ID, Stream: "stderr"}); string(out.Data) != wantErr {
			t.Errorf("%v: stderr %q, want %q", a.Params.Argv, out.Data, wantErr)
		}
		if rec.PID <= 0 || rec.Scope != "pgid:"+strconv.Itoa(rec.PID) {
			t.Errorf("%v: pid %d scope %q; want the pidfd's pid and its group", a.Params.Argv, rec.PID, rec.Scope)
		}
		if rec.StartedAt == nil || !rec.StartedAt.Equal(rec.CreatedAt) {
			t.Errorf("%v: started_at %v, want created_at %v", a.Params.Argv, rec.StartedAt, rec.CreatedAt)
		}
	}
}
