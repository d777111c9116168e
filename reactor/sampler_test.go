package reactor

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
)

// prunedBackend is the pgroup backend with counters that vanish with the
// tree, as under systemd: a scope whose last process exited is stopped and
// its cgroup pruned within milliseconds, usually before the reactor reaps
// the main process. While the tree lives its scope reports peakTasks.
type prunedBackend struct{ scope.Backend }

const peakTasks = 7

func (b prunedBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return prunedScope{sc}, nil
}

type prunedScope struct{ scope.Scope }

func (s prunedScope) Stats() (scope.Stats, error) {
	st := scope.Stats{CPUUsageNS: scope.Unknown, CPUUserNS: scope.Unknown, CPUSystemNS: scope.Unknown,
		MemoryPeak: scope.Unknown, TasksPeak: scope.Unknown, Tasks: scope.Unknown, OOMKills: scope.Unknown}
	if empty, err := s.Empty(); err == nil && !empty {
		st.TasksPeak, st.Tasks = peakTasks, 1
	}
	return st, nil
}

// The usage of a tree that ends as a whole is read while it runs, not only
// once it ended: with no limit to enforce, the readings start soon after
// the start, so a 300 ms command's peak is kept although its counters are
// gone by the time its main process is reaped (tests/systemd
// TestForkBombStopsAtTasksMax/terminal lost it that way).
func TestUsageIsReadWhileTheTreeRuns(t *testing.T) {
	tr := newTestReactor(t, func(c *Config) { c.Backend = prunedBackend{scope.NewPgroup()} })
	rec := tr.run(api.StartParams{Argv: []string{"sleep", "0.3"}})
	if outcome(rec) != api.OutcomeExited {
		t.Fatalf("outcome %v, want exited", outcome(rec))
	}
	if rec.Usage.TasksPeak != peakTasks {
		t.Errorf("tasks_peak = %d, want %d (read while the tree ran)", rec.Usage.TasksPeak, peakTasks)
	}
}

// The readings space out: soon after the start, then 4x longer each, up
// to SampleInterval with a limit to enforce and to a second without.
func TestSampleDelaySpacesOut(t *testing.T) {
	r := &Reactor{cfg: Config{SampleInterval: 100 * time.Millisecond}}
	plain := &execution{}
	limited := &execution{params: api.StartParams{CPUMS: 500}}
	for _, tc := range []struct {
		e    *execution
		n    int
		want time.Duration
	}{
		{plain, 0, firstSample}, {plain, 1, 4 * firstSample}, {plain, 2, 16 * firstSample},
		{plain, 3, 64 * firstSample}, {plain, 4, time.Second}, {plain, 40, time.Second},
		{limited, 0, firstSample}, {limited, 2, 80 * time.Millisecond}, {limited, 3, 100 * time.Millisecond},
		{limited, 40, 100 * time.Millisecond},
	} {
		if got := r.sampleDelay(tc.e, tc.n); got != tc.want {
			t.Errorf("sampleDelay(cpu_ms %d, %d) = %v, want %v", tc.e.params.CPUMS, tc.n, got, tc.want)
		}
	}
}

// readingBackend is the pgroup backend with scopes that count their
// readings. A scope whose command's last argument ($0 of sh -c) is
// "measures" reports a task count; every other one reports nothing, as the
// pgroup backend does.
type readingBackend struct {
	scope.Backend
	mu     sync.Mutex
	scopes map[string]*readingScope // by execution id
}

func (b *readingBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	rs := &readingScope{Scope: sc, measures: spec.Argv[len(spec.Argv)-1] == "measures"}
	b.mu.Lock()
	b.scopes[spec.ID] = rs
	b.mu.Unlock()
	return rs, nil
}

func (b *readingBackend) readings(id string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rs := b.scopes[id]; rs != nil {
		return rs.n.Load()
	}
	return 0
}

type readingScope struct {
	scope.Scope
	measures bool
	n        atomic.Int64
}

func (s *readingScope) Stats() (scope.Stats, error) {
	s.n.Add(1)
	st := scope.Stats{CPUUsageNS: scope.Unknown, CPUUserNS: scope.Unknown, CPUSystemNS: scope.Unknown,
		MemoryPeak: scope.Unknown, TasksPeak: scope.Unknown, Tasks: scope.Unknown, OOMKills: scope.Unknown}
	if s.measures {
		st.Tasks = 1
	}
	return st, nil
}

// The sampler stops once a reading measured nothing and no limit is to be
// enforced (a process-group scope without cpu_ms or memory_bytes): it
// would re-arm once a second for as long as the command runs, for
// readings that are all Unknown. A scope that measures, or an execution
// with a limit, keeps being sampled. The three run side by side on one
// reactor; the one that measures nothing must have been read once by the
// time the others were read four times (without the stop it is read on
// the same schedule as the one that measures).
func TestSamplerStopsWhenNothingIsMeasured(t *testing.T) {
	b := &readingBackend{Backend: scope.NewPgroup(), scopes: map[string]*readingScope{}}
	tr := newTestReactor(t, func(c *Config) { c.Backend = b })
	// Started first: its readings are never behind the others'.
	nothing := tr.start(api.StartParams{Argv: []string{"sh", "-c", "exec sleep 30", "nothing"}})
	measures := tr.start(api.StartParams{Argv: []string{"sh", "-c", "exec sleep 30", "measures"}})
	limited := tr.start(api.StartParams{Argv: []string{"sh", "-c", "exec sleep 30", "limited"}, CPUMS: 60000})
	for _, rec := range []api.Record{nothing, measures, limited} {
		defer tr.Cancel(context.Background(), root, api.CancelParams{ID: rec.ID})
	}

	const want = 4 // 5, 25, 105 ms after the start, then 205 (limited) or 425 ms
	deadline := time.Now().Add(20 * time.Second)
	for b.readings(measures.ID) < want || b.readings(limited.ID) < want {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: the scope that measures was read %d times, the limited one %d, want %d each",
				b.readings(measures.ID), b.readings(limited.ID), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := b.readings(nothing.ID); n != 1 {
		t.Errorf("the scope that measures nothing was read %d times while the others were read %d, want once", n, want)
	}
	var armed [3]bool
	if err := tr.onLoop(t.Context(), func() {
		for i, rec := range []api.Record{nothing, measures, limited} {
			armed[i] = tr.execs[rec.ID].sampler != nil
		}
	}); err != nil {
		t.Fatal(err)
	}
	if armed != [3]bool{false, true, true} {
		t.Errorf("sampler armed (measures nothing, measures, limited) = %v, want [false true true]", armed)
	}
}

// oomBackend is the pgroup backend with scopes that, like the systemd
// scope on a v1 memory hierarchy, may not know at the exit whether the tree
// was OOM-killed (scope.OOMSettler): until the test decides, OOMUndecided
// returns a channel; once decided with oom, Stats counts an OOM kill.
type oomBackend struct {
	scope.Backend
	scopes chan *oomScope
}

func (b oomBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	s := &oomScope{Scope: sc, asked: make(chan struct{}), decided: make(chan struct{})}
	b.scopes <- s
	return s, nil
}

type oomScope struct {
	scope.Scope
	askOnce sync.Once
	asked   chan struct{} // closed at the first OOMUndecided
	decided chan struct{}
	oom     atomic.Bool
}

func (s *oomScope) OOMUndecided() <-chan struct{} {
	s.askOnce.Do(func() { close(s.asked) })
	select {
	case <-s.decided:
		return nil
	default:
		return s.decided
	}
}

func (s *oomScope) decide(oom bool) {
	s.oom.Store(oom)
	close(s.decided)
}

func (s *oomScope) Stats() (scope.Stats, error) {
	st, err := s.Scope.Stats()
	if s.oom.Load() {
		st.OOMKills = 1
	}
	return st, err
}

// An exit whose scope has not decided yet whether it saw an OOM kill waits
// for it off the loop goroutine (the v1 OOM path polled the eventfd for up
// to 30 ms inside Stats and Empty, on the loop): meanwhile the loop answers
// (exec.get finds the execution still running) and once the scope decided,
// the outcome follows its count: memory_limit with an OOM kill. A scope
// that never decides holds the exit back only for oomSettleBound (here
// shortened; the other cases lengthen it so that only the decision ends
// their wait, however loaded the host).
func TestExitWaitsOffTheLoopForTheOOMCount(t *testing.T) {
	b := oomBackend{Backend: scope.NewPgroup(), scopes: make(chan *oomScope, 1)}
	tr := newTestReactor(t, func(c *Config) { c.Backend = b })
	for _, tc := range []struct {
		name   string
		bound  time.Duration // oomSettleBound
		decide func(*oomScope)
		want   api.Outcome
	}{
		// An hour: only the scope's decision ends these waits.
		{"oom", time.Hour, func(s *oomScope) { s.decide(true) }, api.OutcomeMemoryLimit},
		{"no oom", time.Hour, func(s *oomScope) { s.decide(false) }, api.OutcomeExited},
		{"never decided", 100 * time.Millisecond, nil, api.OutcomeExited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tr.onLoop(t.Context(), func() { tr.oomSettle = tc.bound }); err != nil {
				t.Fatal(err)
			}
			rec := tr.start(api.StartParams{Argv: []string{"true"}, MemoryBytes: 64 << 20})
			s := <-b.scopes
			select {
			case <-s.asked:
			case <-time.After(10 * time.Second):
				t.Fatal("the exit did not ask the scope whether its OOM count is decided within 10 s")
			}
			if tc.decide != nil {
				got, err := tr.Get(t.Context(), root, api.IDParams{ID: rec.ID})
				if err != nil {
					t.Fatalf("Get while the OOM count is undecided: %v", err)
				}
				if got.State != api.StateRunning {
					t.Errorf("state %v while the OOM count is undecided, want running (the exit waits)", got.State)
				}
				tc.decide(s)
			}
			if rec := tr.wait(rec.ID); outcome(rec) != tc.want {
				t.Errorf("outcome %v, want %v", outcome(rec), tc.want)
			}
		})
	}
}
