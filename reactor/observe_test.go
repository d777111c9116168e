package reactor

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// recordingObserver keeps what it is told; the loop goroutine calls it, the
// test reads it.
type recordingObserver struct {
	mu      sync.Mutex
	moves   []string // "from>to" per transition
	tp      []string
	out     map[string]int
	commits int
}

func (o *recordingObserver) Transition(t Transition) {
	o.mu.Lock()
	defer o.mu.Unlock()
	from := "new"
	if t.From != 0 {
		from = t.From.String()
	}
	o.moves = append(o.moves, from+">"+t.Record.State.String())
	o.tp = append(o.tp, t.Traceparent)
}

func (o *recordingObserver) Output(stream string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.out[stream] += n
}

func (o *recordingObserver) StoreCommit(d time.Duration, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ok && d >= 0 {
		o.commits++
	}
}

// TestObserverSeesLifecycle: the observer hears every transition of an
// execution in order, with its traceparent, the bytes read from each
// stream and one store commit per durable write.
func TestObserverSeesLifecycle(t *testing.T) {
	writeExitsAtOnce(t)
	obs := &recordingObserver{out: map[string]int{}}
	tr := newTestReactor(t, func(c *Config) { c.Observer = obs })
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "printf hello; printf ab >&2"}, Traceparent: tp})
	if outcome(rec) != api.OutcomeExited {
		t.Fatalf("outcome = %s", outcome(rec))
	}
	// The cleaned record's commit is observed on the loop after its
	// waiter was answered from the store's writer: wait for it, bounded.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		obs.mu.Lock()
		n := obs.commits
		obs.mu.Unlock()
		if n >= 3 {
			break
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	want := "new>started started>running running>exited exited>cleaned"
	if got := strings.Join(obs.moves, " "); got != want {
		t.Errorf("transitions = %q, want %q", got, want)
	}
	for i, got := range obs.tp {
		if got != tp {
			t.Errorf("transition %d: traceparent %q, want %q", i, got, tp)
		}
	}
	if obs.out["stdout"] != 5 || obs.out["stderr"] != 2 {
		t.Errorf("output = %v, want stdout 5, stderr 2", obs.out)
	}
	// running, exited and cleaned are written through persist (the created
	// record is written by Start itself); the exited record is not held
	// here (writeExitsAtOnce), so each of the three is its own commit.
	if obs.commits != 3 {
		t.Errorf("store commits = %d, want 3", obs.commits)
	}
}

func TestTraceparentValidated(t *testing.T) {
	for _, tt := range []struct {
		tp string
		ok bool
	}{
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future", true},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", false},
		{"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", false},
		{"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false},
		{"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", false},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", false},
	} {
		p := api.StartParams{Argv: []string{"true"}, Traceparent: tt.tp}
		err := normalize(&p, api.Defaults{})
		if (err == nil) != tt.ok {
			t.Errorf("normalize(traceparent %q) = %v, want ok %t", tt.tp, err, tt.ok)
		}
	}
}
