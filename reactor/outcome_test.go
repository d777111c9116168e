package reactor

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// TestDecideOutcome covers every rule of decideOutcome and their
// precedence, with no child, scope or root.
func TestDecideOutcome(t *testing.T) {
	limits := api.StartParams{TimeoutMS: 1000, CPUMS: 500, MemoryBytes: 1 << 20}
	exited := func(code int) exitStatus { return exitStatus{exited: true, code: code} }
	killed := func(sig unix.Signal, cpuMS int64) exitStatus {
		return exitStatus{signaled: true, signal: sig, cpuMS: cpuMS}
	}
	for _, tt := range []struct {
		name    string
		f       exitFacts
		want    api.Outcome
		wantErr string
	}{
		{"exit 0", exitFacts{status: exited(0)}, api.OutcomeExited, ""},
		{"exit 3 is still exited", exitFacts{status: exited(3)}, api.OutcomeExited, ""},
		{"killed by a signal", exitFacts{status: killed(unix.SIGSEGV, 0)}, api.OutcomeSignaled, ""},
		{"no status at all", exitFacts{}, api.OutcomeSignaled, ""},
		{"start failed wins over everything",
			exitFacts{startErr: errors.New("exec \"nope\": no such file"), cancel: api.OutcomeCancelled, oomKills: 1},
			api.OutcomeStartFailed, "exec \"nope\": no such file"},
		{"timeout", exitFacts{cancel: api.OutcomeTimeout, status: killed(unix.SIGTERM, 0), limits: limits, timeoutMS: 1000},
			api.OutcomeTimeout, "timed out after 1000 ms"},
		{"timeout after exec.update moved the deadline", exitFacts{cancel: api.OutcomeTimeout, status: killed(unix.SIGTERM, 0), limits: limits, timeoutMS: 2500},
			api.OutcomeTimeout, "timed out after 2500 ms"},
		{"idle timeout", exitFacts{cancel: api.OutcomeIdleTimeout, status: exited(0), limits: api.StartParams{IdleTimeoutMS: 300}},
			api.OutcomeIdleTimeout, "no output for 300 ms (idle_timeout_ms)"},
		{"cancel wins over an exit of its own", exitFacts{cancel: api.OutcomeCancelled, status: exited(0)},
			api.OutcomeCancelled, ""},
		{"cancel wins over an OOM kill", exitFacts{cancel: api.OutcomeCancelled, oomKills: 2, status: killed(unix.SIGKILL, 0)},
			api.OutcomeCancelled, ""},
		{"OOM kill seen in the scope", exitFacts{oomKills: 1, status: killed(unix.SIGKILL, 0), limits: limits},
			api.OutcomeMemoryLimit, "the tree was OOM-killed (memory_bytes 1048576)"},
		{"OOM kill though the main process exited", exitFacts{oomKills: 1, status: exited(1), limits: limits},
			api.OutcomeMemoryLimit, "the tree was OOM-killed (memory_bytes 1048576)"},
		{"unknown OOM count is no OOM", exitFacts{oomKills: -1, status: exited(0)}, api.OutcomeExited, ""},
		{"sampler ended it for cpu", exitFacts{cancel: api.OutcomeCPULimit, status: killed(unix.SIGKILL, 0), limits: limits},
			api.OutcomeCPULimit, "CPU time of the tree passed cpu_ms 500"},
		{"RLIMIT_CPU soft limit: SIGXCPU", exitFacts{status: killed(unix.SIGXCPU, 0), limits: limits},
			api.OutcomeCPULimit, "CPU time of the tree passed cpu_ms 500"},
		{"RLIMIT_CPU hard limit: SIGKILL after cpu_ms", exitFacts{status: killed(unix.SIGKILL, 500), limits: limits},
			api.OutcomeCPULimit, "CPU time of the tree passed cpu_ms 500"},
		{"SIGKILL before cpu_ms is a signal", exitFacts{status: killed(unix.SIGKILL, 499), limits: limits},
			api.OutcomeSignaled, ""},
		{"SIGXCPU without cpu_ms is a signal", exitFacts{status: killed(unix.SIGXCPU, 0)},
			api.OutcomeSignaled, ""},
		{"wait failed", exitFacts{waitErr: errors.New("ECHILD")}, api.OutcomeSignaled, "wait: ECHILD"},
		{"forced after SIGKILL, keeps the cancel", exitFacts{cancel: api.OutcomeTimeout, forced: "main process 7 did not exit", limits: limits},
			api.OutcomeTimeout, "main process 7 did not exit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, gotErr := decideOutcome(tt.f)
			if got != tt.want || gotErr != tt.wantErr {
				t.Errorf("decideOutcome(%+v) = %q, %q; want %q, %q", tt.f, got, gotErr, tt.want, tt.wantErr)
			}
		})
	}
}
