package scope

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The systemd backend reads a scope's cgroups directly (cheap, and works
// while D-Bus is down). Names here start with "sd" so they cannot clash with
// the cgroup backend's "cg" helpers, some of which are reused.

// sdLayout is where the cgroup hierarchies the systemd backend reads are
// mounted. An empty field means that hierarchy is not mounted.
type sdLayout struct {
	// Unified is the cgroup2 mount: /sys/fs/cgroup on a pure v2 host,
	// /sys/fs/cgroup/unified on a hybrid one. systemd keeps every unit's
	// processes there in both layouts, so cgroup.kill and cgroup.events work.
	Unified sdMount
	// V1 controller and named hierarchies (hybrid and legacy hosts).
	Systemd sdMount // name=systemd: process tracking on a legacy host
	CPUAcct sdMount
	Memory  sdMount
	Pids    sdMount
}

// sdMount is one cgroup mount: Point shows the cgroup Root of its
// filesystem (usually "/").
type sdMount struct {
	Point string
	Root  string
}

// dir returns the directory of cgroup cg (a path as systemd's ControlGroup
// property gives it) in this mount, or "" if the mount is absent or cg lies
// outside what it shows.
func (m sdMount) dir(cg string) string {
	if m.Point == "" {
		return ""
	}
	cg = path.Clean("/" + cg)
	root := path.Clean("/" + m.Root)
	rel, ok := strings.CutPrefix(cg, root)
	if root == "/" {
		rel, ok = cg, true
	}
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return ""
	}
	return filepath.Join(m.Point, rel)
}

// sdParseLayout finds the hierarchies in a /proc/self/mountinfo text.
func sdParseLayout(mountinfo []byte) sdLayout {
	var l sdLayout
	for _, mnt := range cgParseMountinfo(mountinfo) {
		m := sdMount{Point: mnt.Point, Root: mnt.Root}
		switch mnt.FSType {
		case "cgroup2":
			// Prefer the conventional places; else the first one seen.
			if l.Unified.Point == "" || m.Point == "/sys/fs/cgroup" ||
				(m.Point == "/sys/fs/cgroup/unified" && l.Unified.Point != "/sys/fs/cgroup") {
				l.Unified = m
			}
		case "cgroup":
			for _, opt := range strings.Split(mnt.SuperOpts, ",") {
				switch opt {
				case "name=systemd":
					l.Systemd = sdFirst(l.Systemd, m)
				case "cpuacct":
					l.CPUAcct = sdFirst(l.CPUAcct, m)
				case "memory":
					l.Memory = sdFirst(l.Memory, m)
				case "pids":
					l.Pids = sdFirst(l.Pids, m)
				}
			}
		}
	}
	return l
}

func sdFirst(have, m sdMount) sdMount {
	if have.Point != "" {
		return have
	}
	return m
}

// sdReadLayout reads this process's mountinfo.
func sdReadLayout() (sdLayout, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return sdLayout{}, fmt.Errorf("read mountinfo: %w", err)
	}
	l := sdParseLayout(data)
	if l.Unified.Point == "" && l.Systemd.Point == "" {
		return l, errors.New("no cgroup2 or name=systemd hierarchy mounted")
	}
	return l, nil
}

// sdPaths are one scope's cgroup directories; "" where the hierarchy is not
// mounted.
type sdPaths struct {
	Unified string // cgroup2 directory (pure v2 or hybrid)
	Systemd string // v1 name=systemd directory
	CPUAcct string
	Memory  string
	Pids    string
}

func (l sdLayout) paths(cg string) sdPaths {
	return sdPaths{
		Unified: l.Unified.dir(cg),
		Systemd: l.Systemd.dir(cg),
		CPUAcct: l.CPUAcct.dir(cg),
		Memory:  l.Memory.dir(cg),
		Pids:    l.Pids.dir(cg),
	}
}

// procsDir is where the scope's member list lives: the cgroup2 directory
// when there is one, else the name=systemd one.
func (p sdPaths) procsDir() string {
	if p.Unified != "" {
		return p.Unified
	}
	return p.Systemd
}

// kill SIGKILLs every process of the scope without D-Bus. It returns
// handled=false when it could not reach the cgroup at all.
func (p sdPaths) kill() (handled bool, err error) {
	if p.Unified != "" {
		// cgroup.kill (Linux 5.14) kills the whole subtree atomically: no
		// fork can escape it, unlike a walk over cgroup.procs.
		err := cgWrite(p.Unified, "cgroup.kill", "1")
		switch {
		case err == nil:
			return true, nil
		case sdGone(err) && !sdExists(p.Unified):
			return true, nil // scope gone: nothing left to kill
		}
		// cgroup.kill missing (old kernel): walk the procs below.
	}
	dir := p.procsDir()
	if dir == "" {
		return false, nil
	}
	if !sdExists(dir) {
		return true, nil
	}
	return true, sdSignalTree(dir, unix.SIGKILL)
}

// sdSignalTree sends sig to every process listed in dir's cgroup.procs
// and its child cgroups, a few rounds so that fresh forks are caught too.
// Without a freezer this is best effort against a fork bomb; cgroup.kill
// is the real answer where the kernel has it.
func sdSignalTree(dir string, sig unix.Signal) error {
	const rounds = 5
	for range rounds {
		found := 0
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if sdGone(err) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			data, err := cgRead(p, "cgroup.procs")
			if err != nil {
				if sdGone(err) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(data)) {
				pid, err := strconv.Atoi(f)
				if err != nil || pid <= 0 {
					continue
				}
				found++
				if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
					return fmt.Errorf("kill %d: %w", pid, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("signal processes of %s: %w", dir, err)
		}
		if found == 0 || sig != unix.SIGKILL {
			return nil
		}
	}
	return nil
}

// empty reports whether no process is left. A directory that is gone (the
// unit stopped and systemd pruned it) is empty.
func (p sdPaths) empty() (bool, error) {
	if p.Unified != "" {
		data, err := cgRead(p.Unified, "cgroup.events")
		if sdGone(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("read cgroup.events: %w", err)
		}
		n, ok := cgKeyed(data, "populated")
		if !ok {
			return false, fmt.Errorf("parse %s/cgroup.events: no populated line", p.Unified)
		}
		return n == 0, nil
	}
	if p.Systemd == "" {
		return false, errors.New("no cgroup hierarchy to look at")
	}
	populated := false
	err := filepath.WalkDir(p.Systemd, func(q string, d os.DirEntry, err error) error {
		if err != nil {
			if sdGone(err) {
				return nil
			}
			return err
		}
		if !d.IsDir() || populated {
			return nil
		}
		data, err := cgRead(q, "cgroup.procs")
		if sdGone(err) {
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

// stats reads what the kernel keeps for the scope; fields it cannot read are
// Unknown.
func (p sdPaths) stats() Stats {
	st := Stats{
		CPUUsageNS: Unknown, CPUUserNS: Unknown, CPUSystemNS: Unknown,
		MemoryPeak: Unknown, TasksPeak: Unknown, Tasks: Unknown, OOMKills: Unknown,
	}
	// CPU: cgroup2's cpu.stat exists in every cgroup2 directory (also on a
	// hybrid host, without the cpu controller); cpuacct is the v1 fallback.
	if data, err := sdReadIn(p.Unified, "cpu.stat"); err == nil {
		if v, ok := cgKeyed(data, "usage_usec"); ok {
			st.CPUUsageNS = v * 1000
		}
		if v, ok := cgKeyed(data, "user_usec"); ok {
			st.CPUUserNS = v * 1000
		}
		if v, ok := cgKeyed(data, "system_usec"); ok {
			st.CPUSystemNS = v * 1000
		}
	} else if p.CPUAcct != "" {
		st.CPUUsageNS = sdInt(p.CPUAcct, "cpuacct.usage")
		st.CPUUserNS = sdInt(p.CPUAcct, "cpuacct.usage_user")
		st.CPUSystemNS = sdInt(p.CPUAcct, "cpuacct.usage_sys")
	}
	// Memory: the v2 memory controller when it is enabled for the scope,
	// else v1's.
	if v := sdInt(p.Unified, "memory.peak"); v != Unknown {
		st.MemoryPeak = v
	} else if p.Memory != "" {
		st.MemoryPeak = sdInt(p.Memory, "memory.max_usage_in_bytes")
	}
	if data, err := sdReadIn(p.Unified, "memory.events"); err == nil {
		if v, ok := cgKeyed(data, "oom_kill"); ok {
			st.OOMKills = v
		}
	} else if data, err := sdReadIn(p.Memory, "memory.oom_control"); err == nil {
		if v, ok := cgKeyed(data, "oom_kill"); ok {
			st.OOMKills = v
		}
	}
	// Tasks: v2 pids when enabled, else v1 pids.
	if v := sdInt(p.Unified, "pids.current"); v != Unknown {
		st.Tasks = v
		st.TasksPeak = sdInt(p.Unified, "pids.peak")
	} else if p.Pids != "" {
		st.Tasks = sdInt(p.Pids, "pids.current")
		st.TasksPeak = sdInt(p.Pids, "pids.peak") // Linux 6.13+ on v1 too
	}
	return st
}

// sdReadIn reads file in dir; dir "" reads as not existing.
func sdReadIn(dir, file string) ([]byte, error) {
	if dir == "" {
		return nil, os.ErrNotExist
	}
	return cgRead(dir, file)
}

// sdInt reads a one-number file, Unknown when it cannot.
func sdInt(dir, file string) int64 {
	if dir == "" {
		return Unknown
	}
	v, err := cgReadInt(dir, file)
	if err != nil || v < 0 {
		return Unknown
	}
	return v
}

// sdGone reports whether err means the cgroup file is gone: ENOENT once
// the directory is removed, ENODEV while it is being removed.
func sdGone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV)
}

func sdExists(dir string) bool {
	_, err := os.Stat(dir)
	return err == nil
}

// sdMerge combines a fresh reading with the last one: counters that only grow
// (CPU, peaks, OOM kills) keep the highest value seen, and a field the fresh
// reading lacks (the cgroup was pruned once the scope emptied) keeps the
// last value. Tasks reads 0 when the cgroup is gone.
func sdMerge(last, now Stats, gone bool) Stats {
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
