package scope

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/corral-dev/corral/scope/cgroupv2"
	"golang.org/x/sys/unix"
)

// The systemd backend reads a scope's cgroups directly (cheap, and works
// while D-Bus is down): the unified (cgroup2) directory through
// cgroupv2.Dir, as the cgroup backend does, and on hybrid and legacy hosts
// the v1 hierarchies systemd also places a unit in.

// hierarchies is where the cgroup hierarchies the systemd backend reads are
// mounted. A zero Mount means that hierarchy is not mounted.
type hierarchies struct {
	// Unified is the cgroup2 mount: /sys/fs/cgroup on a pure v2 host,
	// /sys/fs/cgroup/unified on a hybrid one. systemd keeps every unit's
	// processes there in both layouts, so cgroup.kill and cgroup.events work.
	Unified cgroupv2.Mount
	// V1 controller and named hierarchies (hybrid and legacy hosts).
	Systemd cgroupv2.Mount // name=systemd: process tracking on a legacy host
	CPUAcct cgroupv2.Mount
	Memory  cgroupv2.Mount
	Pids    cgroupv2.Mount
}

// parseHierarchies finds the hierarchies in a /proc/self/mountinfo text.
// Only each mount's Point and Root are kept.
func parseHierarchies(mountinfo []byte) hierarchies {
	var h hierarchies
	mounts := cgroupv2.ParseMountinfo(mountinfo)
	if m, ok := cgroupv2.FindUnified(mounts); ok {
		h.Unified = cgroupv2.Mount{Point: m.Point, Root: m.Root}
	}
	for _, mnt := range mounts {
		if mnt.FSType != "cgroup" {
			continue
		}
		m := cgroupv2.Mount{Point: mnt.Point, Root: mnt.Root}
		for _, opt := range strings.Split(mnt.SuperOpts, ",") {
			switch opt {
			case "name=systemd":
				firstMount(&h.Systemd, m)
			case "cpuacct":
				firstMount(&h.CPUAcct, m)
			case "memory":
				firstMount(&h.Memory, m)
			case "pids":
				firstMount(&h.Pids, m)
			}
		}
	}
	return h
}

// firstMount sets *have to m unless a mount was already found.
func firstMount(have *cgroupv2.Mount, m cgroupv2.Mount) {
	if have.Point == "" {
		*have = m
	}
}

// limitControllers says which controllers behind MemoryMax and TasksMax a
// host has.
type limitControllers struct {
	memory, pids bool
}

// controllers finds the memory and pids controllers: a v1 hierarchy of its
// own (hybrid and legacy hosts), or in the cgroup2 root's cgroup.controllers
// (pure v2; a hybrid host's cgroup2 has none of them).
func (h hierarchies) controllers() limitControllers {
	var unified []string
	if h.Unified.Point != "" {
		if data, err := os.ReadFile(h.Unified.Point + "/cgroup.controllers"); err == nil {
			unified = strings.Fields(string(data))
		}
	}
	has := func(m cgroupv2.Mount, name string) bool {
		return m.Point != "" || slices.Contains(unified, name)
	}
	return limitControllers{memory: has(h.Memory, "memory"), pids: has(h.Pids, "pids")}
}

// readHierarchies reads this process's mountinfo.
func readHierarchies() (hierarchies, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return hierarchies{}, fmt.Errorf("read mountinfo: %w", err)
	}
	h := parseHierarchies(data)
	if h.Unified.Point == "" && h.Systemd.Point == "" {
		return h, errors.New("no cgroup2 or name=systemd hierarchy mounted")
	}
	return h, nil
}

// unitCgroups are one scope's cgroup directories; "" where the hierarchy is
// not mounted.
type unitCgroups struct {
	Unified string // cgroup2 directory (pure v2 or hybrid)
	Systemd string // v1 name=systemd directory
	CPUAcct string
	Memory  string
	Pids    string
}

// cgroupsOf returns the directories of systemd cgroup cg (a path as the
// ControlGroup property gives it) in each hierarchy.
func (h hierarchies) cgroupsOf(cg string) unitCgroups {
	dir := func(m cgroupv2.Mount) string {
		d, err := m.Dir(cg)
		if err != nil {
			return ""
		}
		return d
	}
	return unitCgroups{
		Unified: dir(h.Unified),
		Systemd: dir(h.Systemd),
		CPUAcct: dir(h.CPUAcct),
		Memory:  dir(h.Memory),
		Pids:    dir(h.Pids),
	}
}

// procsDir is where the scope's member list lives: the cgroup2 directory
// when there is one, else the name=systemd one.
func (p unitCgroups) procsDir() string {
	if p.Unified != "" {
		return p.Unified
	}
	return p.Systemd
}

// exists reports whether the scope's member list still exists (systemd
// prunes the cgroup once the unit stops).
func (p unitCgroups) exists() bool {
	return p.procsDir() != "" && cgroupv2.Dir(p.procsDir()).Exists()
}

// kill SIGKILLs every process of the scope without D-Bus: cgroup.kill on the
// unified directory, else a signal to every process listed in the
// name=systemd one. It returns handled=false when it could not reach the
// cgroup at all.
func (p unitCgroups) kill() (handled bool, err error) {
	if p.Unified != "" {
		return true, cgroupv2.Dir(p.Unified).Kill()
	}
	if p.Systemd == "" {
		return false, nil
	}
	return true, cgroupv2.Dir(p.Systemd).Signal(unix.SIGKILL)
}

// signal sends sig to every process of the scope without D-Bus.
func (p unitCgroups) signal(sig unix.Signal) error {
	if dir := p.procsDir(); dir != "" {
		return cgroupv2.Dir(dir).Signal(sig)
	}
	return nil
}

// empty reports whether no process is left. A directory that is gone (the
// unit stopped and systemd pruned it) is empty.
func (p unitCgroups) empty() (bool, error) {
	if p.Unified != "" {
		return cgroupv2.Dir(p.Unified).Empty()
	}
	if p.Systemd == "" {
		return false, errors.New("no cgroup hierarchy to look at")
	}
	// A v1 hierarchy has no cgroup.events: any pid listed below means a
	// process is left.
	populated := false
	err := cgroupv2.Dir(p.Systemd).Walk(func(d cgroupv2.Dir) error {
		if populated {
			return nil
		}
		data, err := d.Read("cgroup.procs")
		if cgroupv2.Gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		populated = len(bytes.TrimSpace(data)) > 0
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("read cgroup.procs under %s: %w", p.Systemd, err)
	}
	return !populated, nil
}

// stats reads what the kernel keeps for the scope: the unified directory's
// counters, and for each the v1 hierarchy's where the unified one has none
// (no such controller on a hybrid host). Fields it cannot read are Unknown.
func (p unitCgroups) stats() Stats { return p.statsOf(false) }

// statsOf is stats; with empty (the scope was just read unpopulated) the
// task count is 0 without reading it (pids.current). The unified
// hierarchy's memory and pids files are read only where no v1 hierarchy
// holds that controller (a controller is in one hierarchy at a time): on a
// hybrid host they do not exist, and each reading tried four opens that
// failed.
func (p unitCgroups) statsOf(empty bool) Stats {
	st := unknownStats()
	if p.Unified != "" {
		d := cgroupv2.Dir(p.Unified)
		unifiedPids := p.Pids == ""
		if cs, err := d.StatsOf(p.Memory == "", unifiedPids && !empty); err == nil {
			st = Stats(cs)
			if empty && unifiedPids {
				st.TasksPeak = d.Count("pids.peak")
			}
		}
	}
	if st.CPUUsageNS == Unknown && p.CPUAcct != "" {
		st.CPUUsageNS = v1Count(p.CPUAcct, "cpuacct.usage")
		st.CPUUserNS = v1Count(p.CPUAcct, "cpuacct.usage_user")
		st.CPUSystemNS = v1Count(p.CPUAcct, "cpuacct.usage_sys")
	}
	if st.MemoryPeak == Unknown && p.Memory != "" {
		st.MemoryPeak = v1Count(p.Memory, "memory.max_usage_in_bytes")
	}
	if st.OOMKills == Unknown && p.Memory != "" {
		if v, ok, err := (cgroupv2.At{Dir: cgroupv2.Dir(p.Memory)}).Keyed("memory.oom_control", "oom_kill"); err == nil && ok {
			st.OOMKills = v
		}
	}
	if st.Tasks == Unknown && p.Pids != "" {
		if !empty {
			st.Tasks = v1Count(p.Pids, "pids.current")
		}
		st.TasksPeak = v1Count(p.Pids, "pids.peak") // Linux 6.13+ on v1 too
	}
	if empty {
		st.Tasks = 0
	}
	return st
}

// v1Count reads a one-number file of a v1 directory, Unknown when it cannot.
func v1Count(dir, file string) int64 { return cgroupv2.Dir(dir).Count(file) }

// mergeStats combines a fresh reading with the last one: counters that only
// grow (CPU, peaks, OOM kills) keep the highest value seen, and a field the
// fresh reading lacks (the cgroup was pruned once the scope emptied) keeps
// the last value. Tasks reads 0 when the cgroup is gone.
func mergeStats(last, now Stats, gone bool) Stats {
	mx := func(a, b int64) int64 { return max(a, b) } // Unknown (-1) loses to any reading
	out := Stats{
		CPUUsageNS:  mx(last.CPUUsageNS, now.CPUUsageNS),
		CPUUserNS:   mx(last.CPUUserNS, now.CPUUserNS),
		CPUSystemNS: mx(last.CPUSystemNS, now.CPUSystemNS),
		MemoryPeak:  mx(last.MemoryPeak, now.MemoryPeak),
		TasksPeak:   mx(last.TasksPeak, now.TasksPeak),
		OOMKills:    mx(last.OOMKills, now.OOMKills),
		Tasks:       now.Tasks,
	}
	if now.Tasks != Unknown {
		// Where the kernel keeps no peak, the highest count seen stands in.
		out.TasksPeak = max(out.TasksPeak, now.Tasks)
	}
	if gone {
		out.Tasks = 0
	}
	return out
}
