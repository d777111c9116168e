package reactor

// Enforcing cpu_ms and memory_bytes while the tree runs: the sampler and the
// counters it reads.

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
)

// The sampler reads the tree's counters while it runs: to enforce cpu_ms
// and notice OOM kills every SampleInterval, and, for any execution with a
// scope, to keep its usage. Readings start soon after the start and space
// out (firstSample, then 4x longer each, up to the cap): under systemd a
// tree that ends as a whole (a terminal's hang-up kills a shell's
// background jobs with it; a short fork burst) has its cgroup pruned within
// milliseconds of emptying, before the reaped main process reaches
// toExited's final reading, and a peak the kernel kept (pids.peak,
// memory.peak) is lost unless an earlier reading took it.
const (
	firstSample = 5 * time.Millisecond
	// usageSampleCap spaces the readings of an execution without cpu_ms
	// or memory_bytes: they only keep its usage, so a long-running tree
	// costs one reading a second. Where a reading measured nothing to keep
	// (the process-group backend) and no limit is enforced, the sampler stops.
	usageSampleCap = time.Second
)

// armSampler arms e's next reading; n readings were taken so far.
func (r *Reactor) armSampler(e *execution, n int) {
	e.sampler = r.loop.AfterFunc(r.sampleDelay(e, n), func() {
		e.sampler = nil
		if e.state != api.StateRunning && e.state != api.StateCanceling {
			return
		}
		st, read := r.readStats(e)
		kept := mergeStats(&e.rec.Usage, st)
		switch {
		case st.OOMKills > 0 && e.params.MemoryBytes > 0:
			r.toCanceling(e, cancelRequest{why: api.OutcomeMemoryLimit, hard: true})
		case e.params.CPUMS > 0 && st.CPUUsageNS >= e.params.CPUMS*1e6:
			r.toCanceling(e, cancelRequest{why: api.OutcomeCPULimit, hard: true})
		}
		if e.ending() {
			return
		}
		if read && !kept && !limited(e) {
			// The scope answered and measures nothing that is kept (the
			// process-group backend: every field Unknown), and there is
			// no limit to enforce: a later reading would measure nothing
			// either. toExited still takes its final reading.
			return
		}
		r.armSampler(e, n+1)
	})
}

// oomSettleBound bounds toExited's wait for a scope that has not decided
// whether it saw an OOM kill (the systemd scope decides within 30 ms); past
// it the outcome is decided with the count as it stands.
const oomSettleBound = time.Second

// deferExit reports whether toExited must wait for e's scope to decide
// whether the tree was OOM-killed (scope.OOMSettler): on a v1 memory
// hierarchy a lone notification read once the cgroup is gone takes a short
// wait to tell an OOM from the cgroup's removal, and the outcome depends on
// it (memory_limit or not). The wait is off the loop goroutine, which must
// not block: a goroutine waits (at most oomSettleBound) and posts toExited
// again. Once per execution; meanwhile e stays running (or canceling), as
// it would have until its pidfd's turn came.
func (r *Reactor) deferExit(e *execution, res exitResult) bool {
	if e.exitDeferred || e.state.Finished() || e.params.MemoryBytes <= 0 || res.ps == nil && res.status == nil {
		return false
	}
	s, ok := e.sc.(scope.OOMSettler)
	if !ok {
		return false
	}
	decided := s.OOMUndecided()
	if decided == nil {
		return false
	}
	e.exitDeferred = true
	r.log.Debug().Str("exec_id", e.id).Msg("exit: waiting for the scope to tell whether it saw an OOM kill")
	bound := oomSettleBound
	if r.oomSettle > 0 {
		bound = r.oomSettle
	}
	go func() {
		t := time.NewTimer(bound)
		defer t.Stop()
		select {
		case <-decided:
		case <-t.C:
		}
		r.post(func() { r.toExited(e, res) })
	}()
	return true
}

// limited reports whether e has a limit the sampler enforces.
func limited(e *execution) bool { return e.params.CPUMS > 0 || e.params.MemoryBytes > 0 }

// sampleDelay is how long after the n-th reading the next one comes.
func (r *Reactor) sampleDelay(e *execution, n int) time.Duration {
	limit := max(r.cfg.SampleInterval, usageSampleCap)
	if limited(e) {
		limit = r.cfg.SampleInterval
	}
	d := firstSample
	for range n {
		if d >= limit {
			break
		}
		d *= 4
	}
	return min(d, limit)
}

// needsSampler reports whether e's tree has counters to read while it runs.
func needsSampler(e *execution) bool {
	return e.sc != nil || limited(e)
}

// stats reads the scope's counters, falling back to /proc for the main
// process when the backend cannot measure CPU.
func (r *Reactor) stats(e *execution) scope.Stats {
	st, _ := r.readStats(e)
	return st
}

// readStats is stats; read reports whether e has a scope and it answered
// (a failed reading may succeed later).
func (r *Reactor) readStats(e *execution) (st scope.Stats, read bool) {
	st = scope.Stats{CPUUsageNS: scope.Unknown, CPUUserNS: scope.Unknown, CPUSystemNS: scope.Unknown,
		MemoryPeak: scope.Unknown, TasksPeak: scope.Unknown, Tasks: scope.Unknown, OOMKills: scope.Unknown}
	if e.sc != nil {
		if s, err := e.sc.Stats(); err == nil {
			st, read = s, true
		}
	}
	if st.CPUUsageNS < 0 && e.proc != nil && !e.state.Finished() {
		if ns, ok := procCPUTime(e.proc.Pid); ok {
			st.CPUUsageNS = ns
		}
	}
	return st, read
}

// exitStats is stats at the main process's exit. Where the scope can tell
// (scope.ExitStatser) it reads the scope's emptiness first and counts no
// tasks in an empty one; empty reports that reading, for the cleanup that
// follows (startCleanup), false when the scope was not read empty.
func (r *Reactor) exitStats(e *execution) (st scope.Stats, empty bool) {
	x, ok := e.sc.(scope.ExitStatser)
	if !ok {
		return r.stats(e), false
	}
	s, empty, err := x.ExitStats()
	if err != nil {
		return r.stats(e), false
	}
	return s, empty
}

// mergeStats keeps what st measured of the usage in u. It reports whether
// st had any of it: CPUUsageNS (the /proc fallback included) and OOMKills
// only serve the limits and are not kept.
func mergeStats(u *api.Usage, st scope.Stats) (kept bool) {
	if st.CPUUserNS >= 0 {
		u.CPUUserMS = max(u.CPUUserMS, st.CPUUserNS/1e6)
		kept = true
	}
	if st.CPUSystemNS >= 0 {
		u.CPUSystemMS = max(u.CPUSystemMS, st.CPUSystemNS/1e6)
		kept = true
	}
	if st.MemoryPeak >= 0 {
		u.PeakMemoryBytes = max(u.PeakMemoryBytes, st.MemoryPeak)
		kept = true
	}
	if st.TasksPeak >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.TasksPeak)
		kept = true
	}
	if st.Tasks >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.Tasks)
		kept = true
	}
	return kept
}

// procCPUTime reads utime+stime of pid and its waited-for children from
// /proc, in ns; the fallback CPU measure without a cgroup.
func procCPUTime(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// Fields after ")": state(0) ... utime(11) stime(12) cutime(13) cstime(14).
	if len(f) < 15 {
		return 0, false
	}
	var ticks int64
	for _, j := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseInt(f[j], 10, 64)
		ticks += v
	}
	const clkTck = 100 // USER_HZ on Linux
	return ticks * (1e9 / clkTck), true
}
