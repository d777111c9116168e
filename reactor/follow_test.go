package reactor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
)

// writtenStore keeps the record each transition asked the store to write,
// by state.
type writtenStore struct {
	store.Store
	mu      sync.Mutex
	written map[api.State]api.Record
}

func (s *writtenStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	s.mu.Lock()
	s.written[rec.State] = rec
	s.mu.Unlock()
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestStateNotificationIsTheStoredRecord: a live exec.state notification
// carries exactly the record the store was asked to write for that state,
// encoded once (the store's own JSON, sent on as it is): its params are the
// bytes json.Marshal(api.StateNotification{Record: rec}) gives for that
// record, for exited and for cleaned.
func TestStateNotificationIsTheStoredRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   store.Store
	}{{"memory", store.NewMemory()}, {"sqlite", openSQLite(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			ws := &writtenStore{Store: tc.st, written: make(map[api.State]api.Record)}
			tr := newTestReactor(t, func(c *Config) { c.Store = ws })
			// Labels with characters encoding/json escapes (HTML, U+2028),
			// so that a second encoding with other options would differ.
			rec, err := tr.Start(context.Background(), root, api.StartParams{
				Argv: []string{"sh", "-c", "read x; echo '<b>&</b>'"}, StdinOpen: true,
				Labels: map[string]string{"tool": "a<b>&c\u2028d"}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var (
				mu   sync.Mutex
				live []json.RawMessage
				once sync.Once
			)
			wrote := make(chan error, 1)
			final, err := tr.Follow(ctx, root, api.FollowParams{ID: rec.ID}, func(method string, params any) bool {
				if method != api.NotifyState {
					return true
				}
				// The first (the current record, sent by Follow itself) means
				// the follow is registered: let the child end.
				once.Do(func() {
					go func() {
						_, err := tr.Write(ctx, root, api.WriteParams{ID: rec.ID, Data: []byte("go\n"), Close: true})
						wrote <- err
					}()
				})
				if raw, ok := params.(json.RawMessage); ok {
					mu.Lock()
					live = append(live, append(json.RawMessage(nil), raw...))
					mu.Unlock()
				}
				return true
			})
			if err != nil || final.State != api.StateCleaned {
				t.Fatalf("Follow = %v, %v", final.State, err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("write to the child's stdin: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			seen := map[api.State]bool{}
			for _, raw := range live {
				var n api.StateNotification
				if err := json.Unmarshal(raw, &n); err != nil {
					t.Fatalf("exec.state params %s: %v", raw, err)
				}
				ws.mu.Lock()
				stored, ok := ws.written[n.Record.State]
				ws.mu.Unlock()
				if !ok {
					t.Errorf("notified state %s, which the store was never asked to write", n.Record.State)
					continue
				}
				want, err := json.Marshal(api.StateNotification{Record: stored})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(raw, want) {
					t.Errorf("exec.state %s params\n got %s\nwant %s (the record written to the store)", n.Record.State, raw, want)
				}
				seen[n.Record.State] = true
			}
			if !seen[api.StateExited] || !seen[api.StateCleaned] {
				t.Errorf("live notifications carrying the stored JSON: %v, want exited and cleaned", seen)
			}
			if o := final.Outcome; o == nil || *o != api.OutcomeExited {
				t.Errorf("final outcome %v, want exited", o)
			}
		})
	}
}

// TestStateParamsIsTheMarshalledNotification: stateParams around a record's
// JSON is what encoding/json makes of the notification itself.
func TestStateParamsIsTheMarshalledNotification(t *testing.T) {
	now := time.Date(2026, 12, 1, 14, 0, 0, 123456789, time.UTC)
	code := 0
	out := api.OutcomeExited
	rec := api.Record{ID: "x<&>", State: api.StateExited, Argv: []string{"echo", "\u2028</script>"},
		Labels: map[string]string{"k": "v&"}, CreatedAt: now, ExitedAt: &now, ExitCode: &code, Outcome: &out}
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(api.StateNotification{Record: rec})
	if err != nil {
		t.Fatal(err)
	}
	if got := stateParams(js); !bytes.Equal(got, want) {
		t.Errorf("stateParams\n got %s\nwant %s", got, want)
	}
}

// openSQLite opens a SQLite store in a temporary directory, closed at the
// end of the test (after the reactor's shutdown: cleanups run last first).
func openSQLite(t *testing.T) *store.SQLite {
	t.Helper()
	s, err := store.Open(t.TempDir(), zerolog.Nop())
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// streamsStore keeps the streams whose kept output each transition carried,
// by id and state.
type streamsStore struct {
	store.Store
	mu      sync.Mutex
	streams map[string]map[api.State][]string
}

func (s *streamsStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	s.mu.Lock()
	if s.streams[rec.ID] == nil {
		s.streams[rec.ID] = make(map[api.State][]string)
	}
	for _, o := range outs {
		s.streams[rec.ID][rec.State] = append(s.streams[rec.ID][rec.State], o.Stream)
	}
	s.mu.Unlock()
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestQuietStreamWritesNoOutputRow: the exit path's commits carry the kept
// output of the streams that carried bytes only, and exec.output of a stream
// that carried none answers from the store (no row) what an empty row gave:
// empty, at EOF, total 0, from any offset.
func TestQuietStreamWritesNoOutputRow(t *testing.T) {
	writeExitsAtOnce(t) // both exit-path commits, exited not held for cleaned
	st := &streamsStore{Store: openSQLite(t), streams: make(map[string]map[api.State][]string)}
	tr := newTestReactor(t, func(c *Config) { c.Store = st })
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "echo out"}})
	st.mu.Lock()
	got := st.streams[rec.ID]
	st.mu.Unlock()
	for _, state := range []api.State{api.StateExited, api.StateCleaned} {
		if s := got[state]; len(s) != 1 || s[0] != store.Stdout {
			t.Errorf("%s transition carried the output of %v, want [stdout] only (stderr carried no byte)", state, s)
		}
	}
	if k, ok, err := st.Output(rec.ID, store.Stdout); err != nil || !ok || string(k.Head) != "out\n" {
		t.Errorf("stored stdout = %q, %v, %v; want %q", k.Head, ok, err, "out\n")
	}
	if _, ok, err := st.Output(rec.ID, store.Stderr); err != nil || ok {
		t.Errorf("stored stderr: ok %v, err %v; want no row", ok, err)
	}
	// Cleaned and durable: exec.output is answered from the store.
	for _, off := range []int64{0, 5} {
		res, err := tr.Output(context.Background(), root, api.OutputParams{ID: rec.ID, Stream: store.Stderr, Offset: off})
		if err != nil {
			t.Fatalf("exec.output stderr from %d: %v", off, err)
		}
		if len(res.Data) != 0 || !res.EOF || res.TotalBytes != 0 || res.Gap || res.NextOffset != 0 {
			t.Errorf("exec.output stderr from %d = %+v, want empty at EOF, total 0, next_offset 0", off, res)
		}
	}
}

// TestWaitAnswerIsTheStoredRecord: an exec.wait answered at cleaned gets,
// beside the record, the JSON the store wrote for it (what ipc then sends
// as the answer, EncodedWaiter): exactly json.Marshal of the cleaned record
// the store was asked to write, and of the record Wait returns.
func TestWaitAnswerIsTheStoredRecord(t *testing.T) {
	ws := &writtenStore{Store: openSQLite(t), written: make(map[api.State]api.Record)}
	tr := newTestReactor(t, func(c *Config) { c.Store = ws })
	rec, err := tr.Start(context.Background(), root, api.StartParams{
		Argv: []string{"sh", "-c", "read x"}, StdinOpen: true, Labels: map[string]string{"k": "<&>"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Let the child end only once the wait is registered, so that it is
	// answered at cleaned (an execution already cleaned is answered from
	// memory or the store, without JSON).
	answered := tr.waitEncodedRegistered(ctx, t, rec.ID)
	if _, err := tr.Write(ctx, root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatalf("close the child's stdin: %v", err)
	}
	a := <-answered
	if a.err != nil || a.rec.State != api.StateCleaned {
		t.Fatalf("WaitEncoded = %v, %v", a.rec.State, a.err)
	}
	ws.mu.Lock()
	stored := ws.written[api.StateCleaned]
	ws.mu.Unlock()
	for what, r := range map[string]api.Record{"the record written to the store": stored, "the record returned": a.rec} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.js, want) {
			t.Errorf("WaitEncoded's JSON\n got %s\nwant %s (%s)", a.js, want, what)
		}
	}
	// Once cleaned, a wait is answered at once, with the same JSON while
	// the record is among those that just left memory (recent.go).
	if got, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: rec.ID}); err != nil || got.State != api.StateCleaned || !bytes.Equal(js, a.js) {
		t.Errorf("WaitEncoded after cleaned = %v, JSON %q, %v; want cleaned, the stored JSON %s", got.State, js, err, a.js)
	}
}

// TestWaitAfterCleanedIsTheStoredRecord: exec.wait for a command that was
// cleaned and left memory before the wait came is answered from the
// records that just left memory: the JSON the store wrote for the cleaned
// record, the same record as the store's; another uid's wait finds
// nothing, as it would in the store; once the entry is older than
// recentTTL the store answers (without JSON: ipc encodes).
func TestWaitAfterCleanedIsTheStoredRecord(t *testing.T) {
	ws := &writtenStore{Store: openSQLite(t), written: make(map[api.State]api.Record)}
	tr := newTestReactor(t, func(c *Config) { c.Store = ws })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := tr.Start(ctx, root, api.StartParams{Argv: []string{"true"}, Labels: map[string]string{"k": "<&>"}})
	if err != nil {
		t.Fatal(err)
	}
	// Until it has left memory: cleaned, durable and dropped.
	for gone := false; !gone; {
		if err := tr.onLoop(ctx, func() { _, in := tr.execs[rec.ID]; gone = !in }); err != nil {
			t.Fatal(err)
		}
		if !gone {
			time.Sleep(time.Millisecond)
		}
	}
	got, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: rec.ID})
	if err != nil || got.State != api.StateCleaned {
		t.Fatalf("WaitEncoded after it left memory = %v, %v; want cleaned", got.State, err)
	}
	ws.mu.Lock()
	written := ws.written[api.StateCleaned]
	ws.mu.Unlock()
	fromStore, ok, err := ws.Get(rec.ID)
	if err != nil || !ok {
		t.Fatalf("store Get %s = %v, %v", rec.ID, ok, err)
	}
	for what, r := range map[string]api.Record{"the record written to the store": written, "the store's record": fromStore, "the record returned": got} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(js, want) {
			t.Errorf("WaitEncoded's JSON\n got %s\nwant %s (%s)", js, want, what)
		}
	}
	other := testCaller(4242)
	if got, _, err := tr.WaitEncoded(ctx, other, api.WaitParams{ID: rec.ID}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("another uid's WaitEncoded = %v, %v; want not found", got.State, err)
	}
	// Older than recentTTL: the store answers.
	kept := false
	if err := tr.onLoop(ctx, func() {
		d, ok := tr.recent.byID[rec.ID]
		if kept = ok; ok {
			old := d.rec.CleanedAt.Add(-recentTTL)
			d.rec.CleanedAt = &old
			tr.recent.byID[rec.ID] = d
		}
	}); err != nil {
		t.Fatal(err)
	}
	if !kept {
		t.Fatalf("%s is not among the records that just left memory", rec.ID)
	}
	if got, js, err := tr.WaitEncoded(ctx, root, api.WaitParams{ID: rec.ID}); err != nil || got.State != api.StateCleaned || js != nil || got.CleanedAt == nil || !got.CleanedAt.Equal(*fromStore.CleanedAt) {
		t.Errorf("WaitEncoded of an old entry = %v, JSON %q, %v; want the store's cleaned record, no JSON", got.State, js, err)
	}
}

// TestStartAnswerIsTheStoredRecord: exec.start's answer comes with the JSON
// the store wrote for the running record (what ipc sends, EncodedStarter):
// exactly json.Marshal of that record and of the record returned; a second
// start with the same idempotency key is answered from memory, without JSON.
func TestStartAnswerIsTheStoredRecord(t *testing.T) {
	ws := &writtenStore{Store: openSQLite(t), written: make(map[api.State]api.Record)}
	tr := newTestReactor(t, func(c *Config) { c.Store = ws })
	p := api.StartParams{ID: "start-json", Argv: []string{"sh", "-c", "read x"}, StdinOpen: true, Labels: map[string]string{"k": "<&>"}}
	rec, js, err := tr.StartEncoded(context.Background(), root, p)
	if err != nil || rec.State != api.StateRunning {
		t.Fatalf("StartEncoded = %v, %v; want running", rec.State, err)
	}
	ws.mu.Lock()
	stored := ws.written[api.StateRunning]
	ws.mu.Unlock()
	for what, r := range map[string]api.Record{"the record written to the store": stored, "the record returned": rec} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(js, want) {
			t.Errorf("StartEncoded's JSON\n got %s\nwant %s (%s)", js, want, what)
		}
	}
	again, js2, err := tr.StartEncoded(context.Background(), root, p)
	if err != nil || again.ID != rec.ID || js2 != nil {
		t.Errorf("second StartEncoded with the key = %s, JSON %q, %v; want the same execution, no JSON", again.ID, js2, err)
	}
	if _, err := tr.Write(context.Background(), root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
		t.Fatalf("close the child's stdin: %v", err)
	}
	tr.wait(rec.ID)
}
