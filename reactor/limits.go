package reactor

// Enforcing cpu_ms and memory_bytes while the tree runs: the sampler and the
// counters it reads.

import (
	"os"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
)

// armSampler samples the tree's cgroup every SampleInterval to enforce
// cpu_ms and notice OOM kills while the main process still runs.
func (r *Reactor) armSampler(e *execution) {
	e.sampler = r.loop.AfterFunc(r.cfg.SampleInterval, func() {
		e.sampler = nil
		if e.state != api.StateRunning && e.state != api.StateCanceling {
			return
		}
		st := r.stats(e)
		mergeStats(&e.rec.Usage, st)
		switch {
		case st.OOMKills > 0 && e.params.MemoryBytes > 0:
			r.toCanceling(e, cancelRequest{why: api.OutcomeMemoryLimit, hard: true})
		case e.params.CPUMS > 0 && st.CPUUsageNS >= e.params.CPUMS*1e6:
			r.toCanceling(e, cancelRequest{why: api.OutcomeCPULimit, hard: true})
		}
		if !e.ending() {
			r.armSampler(e)
		}
	})
}

// stats reads the scope's counters, falling back to /proc for the main
// process when the backend cannot measure CPU.
func (r *Reactor) stats(e *execution) scope.Stats {
	st := scope.Stats{CPUUsageNS: scope.Unknown, CPUUserNS: scope.Unknown, CPUSystemNS: scope.Unknown,
		MemoryPeak: scope.Unknown, TasksPeak: scope.Unknown, Tasks: scope.Unknown, OOMKills: scope.Unknown}
	if e.sc != nil {
		if s, err := e.sc.Stats(); err == nil {
			st = s
		}
	}
	if st.CPUUsageNS < 0 && e.proc != nil && !e.state.Finished() {
		if ns, ok := procCPUTime(e.proc.Pid); ok {
			st.CPUUsageNS = ns
		}
	}
	return st
}

func mergeStats(u *api.Usage, st scope.Stats) {
	if st.CPUUserNS >= 0 {
		u.CPUUserMS = max(u.CPUUserMS, st.CPUUserNS/1e6)
	}
	if st.CPUSystemNS >= 0 {
		u.CPUSystemMS = max(u.CPUSystemMS, st.CPUSystemNS/1e6)
	}
	if st.MemoryPeak >= 0 {
		u.PeakMemoryBytes = max(u.PeakMemoryBytes, st.MemoryPeak)
	}
	if st.TasksPeak >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.TasksPeak)
	}
	if st.Tasks >= 0 {
		u.TasksPeak = max(u.TasksPeak, st.Tasks)
	}
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
