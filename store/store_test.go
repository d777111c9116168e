package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/tests/testenv"
	"github.com/rs/zerolog"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir) // never returns
	}
	os.Exit(testenv.Main(m))
}

// impls are the Store implementations every contract test runs against.
var impls = []struct {
	name string
	open func(t *testing.T) Store
}{
	{"memory", func(t *testing.T) Store {
		s := NewMemory()
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"sqlite", func(t *testing.T) Store { return openTemp(t, t.TempDir()) }},
}

func forEach(t *testing.T, f func(t *testing.T, s Store)) {
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) { f(t, impl.open(t)) })
	}
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

func openTemp(t *testing.T, dir string) *SQLite {
	t.Helper()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

var base = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newRecord(id string, uid uint32, n int, labels map[string]string) api.Record {
	return api.Record{
		ID:        id,
		Owner:     api.Owner{UID: uid, GID: uid, PID: 4242},
		Argv:      []string{"echo", id},
		Labels:    labels,
		State:     api.StateStarted,
		CreatedAt: base.Add(time.Duration(n) * time.Second),
	}
}

func mustCreate(t *testing.T, s Store, rec api.Record) {
	t.Helper()
	if err := <-s.Create(rec, []byte(`{"argv":["echo"]}`)); err != nil {
		t.Fatalf("Create(%s): %v", rec.ID, err)
	}
}

func mustTransition(t *testing.T, s Store, from api.State, rec api.Record, outs ...Output) {
	t.Helper()
	r := <-s.Transition(from, rec, outs...)
	if r.Err != nil || !r.Applied {
		t.Fatalf("Transition(%s, %s -> %s) = %+v, want applied", rec.ID, from, rec.State, r)
	}
}

func mustGet(t *testing.T, s Store, id string) api.Record {
	t.Helper()
	rec, ok, err := s.Get(id)
	if err != nil || !ok {
		t.Fatalf("Get(%s) = ok %v, err %v; want the record", id, ok, err)
	}
	return rec
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ids(recs []api.Record) string {
	var s []string
	for _, r := range recs {
		s = append(s, r.ID)
	}
	return strings.Join(s, ",")
}

func ptr[T any](v T) *T { return &v }

// finished returns rec moved to exited (outcome exited, code 0) and, when
// cleaned is set, on to cleaned at that time.
func finished(rec api.Record, cleaned *time.Time) api.Record {
	rec.State = api.StateExited
	rec.Outcome = ptr(api.OutcomeExited)
	rec.ExitCode = ptr(0)
	rec.ExitedAt = ptr(rec.CreatedAt.Add(time.Second))
	if cleaned != nil {
		rec.State = api.StateCleaned
		rec.CleanedAt = cleaned
	}
	return rec
}

func TestCreateGet(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		rec := newRecord("a", 1000, 0, map[string]string{"tool_call": "x"})
		rec.Workspace = ptr("/var/lib/corral/work/a")
		params := []byte(`{"argv":["echo","a"],"labels":{"tool_call":"x"}}`)
		if err := <-s.Create(rec, params); err != nil {
			t.Fatalf("Create: %v", err)
		}
		got := mustGet(t, s, "a")
		if g, w := jsonOf(t, got), jsonOf(t, rec); g != w {
			t.Errorf("Get(a) = %s, want %s", g, w)
		}
		p, ok, err := s.Params("a")
		if err != nil || !ok || !bytes.Equal(p, params) {
			t.Errorf("Params(a) = %s, %v, %v; want %s", p, ok, err, params)
		}
		if _, ok, err := s.Get("nope"); ok || err != nil {
			t.Errorf("Get(nope) = ok %v, err %v; want not found, no error", ok, err)
		}
		// The stored record is a copy: changing ours does not change it.
		rec.Labels["tool_call"] = "changed"
		if got := mustGet(t, s, "a"); got.Labels["tool_call"] != "x" {
			t.Errorf("stored labels changed with the caller's map: %v", got.Labels)
		}

		for _, tc := range []struct {
			name string
			rec  api.Record
		}{
			{"same owner", newRecord("a", 1000, 1, nil)},
			{"other owner", newRecord("a", 1001, 1, nil)},
		} {
			if err := <-s.Create(tc.rec, nil); !errors.Is(err, ErrExists) {
				t.Errorf("%s: Create(duplicate a) = %v, want ErrExists", tc.name, err)
			}
		}
		if got := mustGet(t, s, "a"); got.Owner.UID != 1000 || got.CreatedAt != rec.CreatedAt {
			t.Errorf("duplicate Create changed the record: %+v", got)
		}
	})
}

func TestList(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		recs := []api.Record{
			newRecord("r1", 1000, 1, map[string]string{"tool": "grep", "run": "1"}),
			newRecord("r2", 1000, 2, map[string]string{"tool": "grep", "run": "2"}),
			newRecord("r3", 1001, 3, map[string]string{"tool": "sed", "run": "1"}),
			newRecord("r4", 1001, 4, nil),
			newRecord("r5", 0, 5, map[string]string{"we ird\"key": "va'l"}),
		}
		for _, r := range recs {
			mustCreate(t, s, r)
		}
		r2 := recs[1]
		r2.State = api.StateRunning
		mustTransition(t, s, api.StateStarted, r2)

		for _, tc := range []struct {
			name string
			f    ListFilter
			want string
		}{
			{"all, newest first", ListFilter{}, "r5,r4,r3,r2,r1"},
			{"limit", ListFilter{Limit: 2}, "r5,r4"},
			{"owner", ListFilter{OwnerUID: ptr(uint32(1000))}, "r2,r1"},
			{"owner root", ListFilter{OwnerUID: ptr(uint32(0))}, "r5"},
			{"state running", ListFilter{State: ptr(api.StateRunning)}, "r2"},
			{"state started", ListFilter{State: ptr(api.StateStarted)}, "r5,r4,r3,r1"},
			{"label", ListFilter{Labels: map[string]string{"tool": "grep"}}, "r2,r1"},
			{"labels all match", ListFilter{Labels: map[string]string{"tool": "grep", "run": "1"}}, "r1"},
			{"label other value", ListFilter{Labels: map[string]string{"run": "1"}}, "r3,r1"},
			{"label missing", ListFilter{Labels: map[string]string{"nope": "1"}}, ""},
			{"label odd key", ListFilter{Labels: map[string]string{"we ird\"key": "va'l"}}, "r5"},
			{"owner and label", ListFilter{OwnerUID: ptr(uint32(1001)), Labels: map[string]string{"run": "1"}}, "r3"},
			{"owner and state", ListFilter{OwnerUID: ptr(uint32(1000)), State: ptr(api.StateStarted)}, "r1"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.List(tc.f)
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				if ids(got) != tc.want {
					t.Errorf("List(%+v) = %q, want %q", tc.f, ids(got), tc.want)
				}
			})
		}
	})
}

func TestTransition(t *testing.T) {
	type step struct {
		from, to api.State
		applied  bool
		state    api.State // stored state after the step
		err      error
	}
	S, R, C, E, X := api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"forward", []step{{S, R, true, R, nil}, {R, C, true, C, nil}, {C, E, true, E, nil}, {E, X, true, X, nil}}},
		{"start failed", []step{{S, E, true, E, nil}, {E, X, true, X, nil}}},
		{"duplicate", []step{{S, R, true, R, nil}, {S, R, false, R, nil}, {R, E, true, E, nil}, {R, E, false, E, nil}}},
		{"late running after exited", []step{{S, R, true, R, nil}, {R, E, true, E, nil}, {S, R, false, E, nil}}},
		{"late canceling after exited", []step{{S, R, true, R, nil}, {R, E, true, E, nil}, {R, C, false, E, nil}}},
		{"nothing leaves cleaned", []step{{S, E, true, E, nil}, {E, X, true, X, nil}, {E, X, false, X, nil}, {S, R, false, X, nil}}},
		{"update in place", []step{{S, R, true, R, nil}, {R, R, true, R, nil}, {R, R, true, R, nil}}},
		{"catch up after a lost write", []step{{R, E, true, E, nil}}},
		{"backwards is illegal", []step{{E, R, false, S, ErrIllegal}}},
		{"skipping exited is illegal", []step{{R, X, false, S, ErrIllegal}}},
		{"cleaned to cleaned is illegal", []step{{X, X, false, S, ErrIllegal}}},
		{"unknown from is illegal", []step{{0, R, false, S, ErrIllegal}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEach(t, func(t *testing.T, s Store) {
				rec := newRecord("t", 1000, 0, nil)
				mustCreate(t, s, rec)
				for i, st := range tc.steps {
					rec.State = st.to
					rec.PID = 100 + i // marks which write is stored
					r := <-s.Transition(st.from, rec)
					if !errors.Is(r.Err, st.err) || r.Applied != st.applied {
						t.Fatalf("step %d: Transition(%s -> %s) = %+v, want applied %v, err %v", i, st.from, st.to, r, st.applied, st.err)
					}
					if r.Err == nil && r.State != st.state {
						t.Errorf("step %d: Result.State = %s, want %s", i, r.State, st.state)
					}
					got := mustGet(t, s, "t")
					if got.State != st.state {
						t.Errorf("step %d: stored state = %s, want %s", i, got.State, st.state)
					}
					if st.applied && got.PID != rec.PID {
						t.Errorf("step %d: stored pid = %d, want %d (the applied write)", i, got.PID, rec.PID)
					}
					if !st.applied && got.PID == rec.PID {
						t.Errorf("step %d: a transition that was not applied was stored", i)
					}
				}
			})
		})
	}
}

func TestTransitionUnknownID(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		rec := newRecord("ghost", 1000, 0, nil)
		rec.State = api.StateRunning
		r := <-s.Transition(api.StateStarted, rec)
		if r.Applied || r.Err != nil || r.State != 0 {
			t.Errorf("Transition(unknown id) = %+v, want not applied, state 0, no error", r)
		}
		if _, ok, _ := s.Get("ghost"); ok {
			t.Errorf("Transition(unknown id) created a record")
		}
	})
}

func TestOutput(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		rec := newRecord("o", 1000, 0, nil)
		mustCreate(t, s, rec)
		if _, ok, err := s.Output("o", Stdout); ok || err != nil {
			t.Errorf("Output before any = ok %v, err %v; want none", ok, err)
		}
		stdout := KeptOutput{Head: []byte("hello "), Tail: []byte("world\n"), TailOffset: 1000, Total: 1006}
		stderr := KeptOutput{Head: []byte("warn\n"), TailOffset: 5, Total: 5}
		binary := KeptOutput{Head: []byte{0, 1, 2, 0xff, 0}, TailOffset: 5, Total: 5}
		mustTransition(t, s, api.StateStarted, finished(rec, nil),
			Output{Stdout, stdout}, Output{Stderr, stderr})
		for _, tc := range []struct {
			stream string
			want   KeptOutput
		}{{Stdout, stdout}, {Stderr, stderr}} {
			got, ok, err := s.Output("o", tc.stream)
			if err != nil || !ok {
				t.Fatalf("Output(o, %s) = ok %v, err %v", tc.stream, ok, err)
			}
			if !keptEqual(got, tc.want) {
				t.Errorf("Output(o, %s) = %+v, want %+v", tc.stream, got, tc.want)
			}
		}

		// A duplicate exited transition does not overwrite the output.
		r := <-s.Transition(api.StateRunning, finished(rec, nil), Output{Stdout, binary})
		if r.Applied || r.Err != nil {
			t.Fatalf("duplicate exited = %+v, want not applied", r)
		}
		if got, _, _ := s.Output("o", Stdout); !keptEqual(got, stdout) {
			t.Errorf("not-applied transition overwrote stdout: %+v", got)
		}

		if err := <-s.SaveOutput("o", Output{Stdout, binary}); err != nil {
			t.Fatalf("SaveOutput: %v", err)
		}
		if got, _, _ := s.Output("o", Stdout); !keptEqual(got, binary) {
			t.Errorf("Output after SaveOutput = %+v, want %+v", got, binary)
		}
		if err := <-s.SaveOutput("nope", Output{Stdout, binary}); !errors.Is(err, ErrNotFound) {
			t.Errorf("SaveOutput(unknown id) = %v, want ErrNotFound", err)
		}
		if err := <-s.SaveOutput("o", Output{"stdin", binary}); err == nil {
			t.Errorf("SaveOutput(stream stdin) = nil, want an error")
		}
	})
}

func keptEqual(a, b KeptOutput) bool {
	return bytes.Equal(a.Head, b.Head) && bytes.Equal(a.Tail, b.Tail) && a.TailOffset == b.TailOffset && a.Total == b.Total
}

func TestUnfinished(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		now := time.Now()
		S, R, C, E, X := api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned
		for i, path := range [][]api.State{{S}, {S, R}, {S, R, C}, {S, E}, {S, E, X}} {
			last := path[len(path)-1]
			rec := newRecord(last.String(), 1000, i, nil)
			mustCreate(t, s, rec)
			for j := 1; j < len(path); j++ {
				rec.State = path[j]
				switch path[j] {
				case E:
					rec = finished(rec, nil)
				case X:
					rec = finished(rec, &now)
				}
				mustTransition(t, s, path[j-1], rec)
			}
		}
		got, err := s.Unfinished()
		if err != nil {
			t.Fatalf("Unfinished: %v", err)
		}
		if want := "started,running,canceling,exited"; ids(got) != want {
			t.Errorf("Unfinished() = %q, want %q", ids(got), want)
		}
	})
}

func TestDeleteCleanedBefore(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		now := time.Now()
		old, recent := now.Add(-2*time.Hour), now.Add(-time.Minute)
		for i, tc := range []struct {
			id      string
			cleaned *time.Time
		}{{"old", &old}, {"recent", &recent}, {"exited", nil}} {
			rec := newRecord(tc.id, 1000, i, nil)
			mustCreate(t, s, rec)
			mustTransition(t, s, api.StateStarted, finished(rec, nil), Output{Stdout, KeptOutput{Head: []byte("x"), TailOffset: 1, Total: 1}})
			if tc.cleaned != nil {
				mustTransition(t, s, api.StateExited, finished(rec, tc.cleaned))
			}
		}
		// An old record still running is never deleted.
		mustCreate(t, s, newRecord("running", 1000, -10000, nil))

		n, err := s.DeleteCleanedBefore(now.Add(-time.Hour))
		if err != nil || n != 1 {
			t.Fatalf("DeleteCleanedBefore(1h ago) = %d, %v; want 1", n, err)
		}
		if _, ok, _ := s.Get("old"); ok {
			t.Errorf("old cleaned record still there")
		}
		if _, ok, _ := s.Output("old", Stdout); ok {
			t.Errorf("output of old cleaned record still there")
		}
		for _, id := range []string{"recent", "exited", "running"} {
			if _, ok, _ := s.Get(id); !ok {
				t.Errorf("record %s deleted, want kept", id)
			}
		}
		if _, ok, _ := s.Output("recent", Stdout); !ok {
			t.Errorf("output of recent record deleted")
		}
		// The id of a deleted record may be used again.
		mustCreate(t, s, newRecord("old", 1000, 0, nil))
	})
}

func TestSweeper(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		rec := newRecord("swept", 1000, 0, nil)
		mustCreate(t, s, rec)
		mustTransition(t, s, api.StateStarted, finished(rec, nil))
		mustTransition(t, s, api.StateExited, finished(rec, ptr(time.Now())))
		keep := newRecord("kept", 1000, 1, nil)
		mustCreate(t, s, keep)

		ctx, cancel := context.WithCancel(context.Background())
		stopped := StartSweeper(ctx, s, testLogger(t), 50*time.Millisecond, 10*time.Millisecond)
		t.Cleanup(func() { cancel(); <-stopped })
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, ok, _ := s.Get("swept"); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cleaned record not swept after retention")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, ok, _ := s.Get("kept"); !ok {
			t.Errorf("sweeper deleted a record that is not cleaned")
		}
	})
}

func TestClosed(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		mustCreate(t, s, newRecord("c", 1000, 0, nil))
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := <-s.Create(newRecord("d", 1000, 0, nil), nil); !errors.Is(err, ErrClosed) {
			t.Errorf("Create after Close = %v, want ErrClosed", err)
		}
		rec := newRecord("c", 1000, 0, nil)
		rec.State = api.StateRunning
		if r := <-s.Transition(api.StateStarted, rec); !errors.Is(r.Err, ErrClosed) {
			t.Errorf("Transition after Close = %+v, want ErrClosed", r)
		}
		if err := <-s.SaveOutput("c", Output{Stream: Stdout}); !errors.Is(err, ErrClosed) {
			t.Errorf("SaveOutput after Close = %v, want ErrClosed", err)
		}
		if _, err := s.DeleteCleanedBefore(time.Now()); !errors.Is(err, ErrClosed) {
			t.Errorf("DeleteCleanedBefore after Close = %v, want ErrClosed", err)
		}
	})
}

func TestLegal(t *testing.T) {
	S, R, C, E, X := api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned
	all := []api.State{S, R, C, E, X}
	legal := map[[2]api.State]bool{
		{S, S}: true, {S, R}: true, {S, E}: true,
		{R, R}: true, {R, C}: true, {R, E}: true,
		{C, C}: true, {C, E}: true,
		{E, E}: true, {E, X}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := Legal(from, to); got != legal[[2]api.State{from, to}] {
				t.Errorf("Legal(%s, %s) = %v, want %v", from, to, got, !got)
			}
		}
	}
}

func TestKeptOutputRead(t *testing.T) {
	// "0123456789" written, "0123" and "89" kept, "4567" dropped.
	trunc := KeptOutput{Head: []byte("0123"), Tail: []byte("89"), TailOffset: 8, Total: 10}
	// "012345" written, all kept: head "012", tail "345".
	whole := KeptOutput{Head: []byte("012"), Tail: []byte("345"), TailOffset: 3, Total: 6}
	for _, tc := range []struct {
		name          string
		k             KeptOutput
		offset, limit int64
		data          string
		start         int64
		gap           bool
	}{
		{"all", trunc, 0, 0, "0123", 0, false},
		{"head limit", trunc, 1, 2, "12", 1, false},
		{"in the gap", trunc, 5, 0, "89", 8, true},
		{"at the gap start", trunc, 4, 1, "8", 8, true},
		{"tail", trunc, 9, 10, "9", 9, false},
		{"at end", trunc, 10, 0, "", 10, false},
		{"past end", trunc, 99, 0, "", 10, false},
		{"negative offset", trunc, -5, 2, "01", 0, false},
		{"whole head", whole, 0, 0, "012", 0, false},
		{"whole tail", whole, 3, 0, "345", 3, false},
		{"whole tail mid", whole, 4, 1, "4", 4, false},
		{"empty", KeptOutput{}, 0, 0, "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, start, gap := tc.k.Read(tc.offset, tc.limit)
			if string(data) != tc.data || start != tc.start || gap != tc.gap {
				t.Errorf("Read(%d, %d) = %q, %d, %v; want %q, %d, %v", tc.offset, tc.limit, data, start, gap, tc.data, tc.start, tc.gap)
			}
		})
	}
	if got, want := trunc.Info(), (api.StreamInfo{TotalBytes: 10, KeptBytes: 6, Truncated: true}); got != want {
		t.Errorf("Info() = %+v, want %+v", got, want)
	}
	if got, want := whole.Info(), (api.StreamInfo{TotalBytes: 6, KeptBytes: 6}); got != want {
		t.Errorf("Info() = %+v, want %+v", got, want)
	}
}

// TestPipelined queues a whole life without waiting between writes, as the
// loop goroutine does: writes apply in the order they were queued.
func TestPipelined(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		rec := newRecord("p", 1000, 0, nil)
		created := s.Create(rec, nil)
		rec.State = api.StateRunning
		running := s.Transition(api.StateStarted, rec)
		exited := finished(rec, nil)
		out := Output{Stdout, KeptOutput{Head: []byte("ok\n"), TailOffset: 3, Total: 3}}
		ex := s.Transition(api.StateRunning, exited, out)
		cl := s.Transition(api.StateExited, finished(rec, ptr(time.Now())))
		late := s.Transition(api.StateStarted, rec) // a late running transition
		if err := <-created; err != nil {
			t.Fatalf("Create: %v", err)
		}
		for i, ch := range []<-chan Result{running, ex, cl} {
			if r := <-ch; !r.Applied || r.Err != nil {
				t.Errorf("transition %d = %+v, want applied", i, r)
			}
		}
		if r := <-late; r.Applied || r.State != api.StateCleaned {
			t.Errorf("late transition = %+v, want not applied, state cleaned", r)
		}
		if got := mustGet(t, s, "p"); got.State != api.StateCleaned {
			t.Errorf("state = %s, want cleaned", got.State)
		}
		if got, ok, _ := s.Output("p", Stdout); !ok || string(got.Head) != "ok\n" {
			t.Errorf("output = %q, %v; want ok", got.Head, ok)
		}
	})
}
