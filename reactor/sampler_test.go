package reactor

import (
	"context"
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
