package reactor

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// exitFacts is everything known when an execution reaches exited that
// decides its outcome. decideOutcome reads nothing else, so the decision is
// tested without a child, a scope or root (outcome_test.go).
type exitFacts struct {
	startErr error       // the command never ran
	cancel   api.Outcome // why corral was ending it (e.cancel), or ""
	oomKills int64       // OOM kills seen in the scope; <= 0: none or unknown
	status   exitStatus  // what the one Wait returned; zero when there was none
	waitErr  error       // the Wait failed
	forced   string      // reached exited without a Wait: why
	limits   api.StartParams
	// timeoutMS is the wall limit in force: limits.TimeoutMS unless
	// exec.update moved the deadline.
	timeoutMS int64
}

// exitStatus is the decoded wait status of the main process.
type exitStatus struct {
	exited   bool // exited by itself; code is set
	code     int
	signaled bool // killed by signal
	signal   unix.Signal
	cpuMS    int64 // user+system CPU of the main process and the children it waited for
}

// waitStatus decodes ps.
func waitStatus(ps *os.ProcessState) exitStatus {
	ws, _ := ps.Sys().(syscall.WaitStatus)
	return decodeStatus(ws, rusageCPU(ps))
}

// decodeStatus decodes a wait status, with the CPU time the main process
// used (for the cpu_limit rule).
func decodeStatus(ws syscall.WaitStatus, cpuMS int64) exitStatus {
	st := exitStatus{cpuMS: cpuMS}
	switch {
	case ws.Exited():
		st.exited, st.code = true, ws.ExitStatus()
	case ws.Signaled():
		st.signaled, st.signal = true, unix.Signal(ws.Signal())
	}
	return st
}

// decideOutcome is the one place an execution's outcome is decided, with
// the error text the record shows. In order of precedence:
//
//   - the command never ran: start_failed;
//   - corral was ending it (timeout, idle_timeout, cancelled, cpu_limit,
//     memory_limit): that;
//   - the scope saw an OOM kill: memory_limit;
//   - it exited by itself: exited;
//   - it was killed by SIGXCPU, or by SIGKILL after using cpu_ms, with
//     cpu_ms set: cpu_limit (the RLIMIT_CPU backstop fired);
//   - anything else (a signal, no status at all): signaled.
func decideOutcome(f exitFacts) (api.Outcome, string) {
	var outcome api.Outcome
	var errText string
	switch {
	case f.startErr != nil:
		outcome, errText = api.OutcomeStartFailed, f.startErr.Error()
	case f.cancel != "":
		outcome = f.cancel
	case f.oomKills > 0:
		outcome = api.OutcomeMemoryLimit
	case f.status.exited:
		outcome = api.OutcomeExited
	case f.status.signaled && f.limits.CPUMS > 0 &&
		(f.status.signal == unix.SIGXCPU || f.status.signal == unix.SIGKILL && f.status.cpuMS >= f.limits.CPUMS):
		// The RLIMIT_CPU backstop fired (SIGXCPU at the soft limit,
		// SIGKILL at the hard one).
		outcome = api.OutcomeCPULimit
	default:
		outcome = api.OutcomeSignaled
	}
	if f.waitErr != nil {
		errText = fmt.Sprintf("wait: %v", f.waitErr)
	}
	if f.forced != "" {
		errText = f.forced
	}
	if errText == "" {
		errText = limitError(outcome, f.timeoutMS, f.limits)
	}
	return outcome, errText
}

// rusageCPU is the CPU time in ms that the main process used, with the
// children it waited for.
func rusageCPU(ps *os.ProcessState) int64 {
	return (ps.UserTime() + ps.SystemTime()).Milliseconds()
}
