package scope

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

const hybridMountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
31 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
32 26 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
33 26 0:31 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,pids
`

const v2Mountinfo = `25 30 0:23 / /sys rw shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
40 26 0:24 /some/where /mnt/other\040dir rw shared:9 - cgroup2 cgroup2 rw
`

func TestParseHierarchies(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want hierarchies
	}{
		{"hybrid", hybridMountinfo, hierarchies{
			Unified: cgroupv2.Mount{Point: "/sys/fs/cgroup/unified", Root: "/"},
			Systemd: cgroupv2.Mount{Point: "/sys/fs/cgroup/systemd", Root: "/"},
			CPUAcct: cgroupv2.Mount{Point: "/sys/fs/cgroup/cpu,cpuacct", Root: "/"},
			Memory:  cgroupv2.Mount{Point: "/sys/fs/cgroup/memory", Root: "/"},
			Pids:    cgroupv2.Mount{Point: "/sys/fs/cgroup/pids", Root: "/"},
		}},
		{"v2 prefers /sys/fs/cgroup", v2Mountinfo, hierarchies{Unified: cgroupv2.Mount{Point: "/sys/fs/cgroup", Root: "/"}}},
		{"nothing", "garbage line\n", hierarchies{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseHierarchies([]byte(tt.in)); got != tt.want {
				t.Errorf("parseHierarchies = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestUnitName(t *testing.T) {
	tests := []struct {
		id      string
		want    string
		wantErr bool
	}{
		{"0193c0de-7f00-7abc-8def-0123456789ab", "corral-0193c0de-7f00-7abc-8def-0123456789ab.scope", false},
		{"my_key.v1:2", "corral-my_key.v1:2.scope", false},
		{"", "", true},
		{"a/b", "", true},
		{"with space", "", true},
		{"at@sign", "", true},
		{strings.Repeat("x", 250), "", true},
	}
	for _, tt := range tests {
		got, err := unitName(tt.id)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("unitName(%q) = %q, %v; want %q, error %v", tt.id, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestUnitDescription(t *testing.T) {
	if got, want := unitDescription("x", []string{"sh", "-c", "true"}), "corral x: sh -c true"; got != want {
		t.Errorf("unitDescription = %q, want %q", got, want)
	}
	long := unitDescription("x", []string{strings.Repeat("é", 300)})
	if len(long) > 203 || !strings.HasSuffix(long, "...") || !strings.HasPrefix(long, "corral x: éé") {
		t.Errorf("long description = %q (%d bytes), want it cut near 200 bytes with ...", long, len(long))
	}
	if !strings.HasSuffix(strings.TrimSuffix(long, "..."), "é") {
		t.Errorf("long description %q split a UTF-8 sequence", long)
	}
}

// writeFiles creates dir/name with content for each entry.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUnitCgroupsStatsV2(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "corral-x.scope")
	writeFiles(t, dir, map[string]string{
		"cpu.stat":       "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
		"memory.peak":    "4096\n",
		"memory.events":  "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n",
		"pids.current":   "3\n",
		"pids.peak":      "7\n",
		"cgroup.events":  "populated 1\nfrozen 0\n",
		"cgroup.procs":   "",
		"memory.current": "1024\n",
	})
	p := unitCgroups{Unified: dir}
	want := Stats{CPUUsageNS: 1500000, CPUUserNS: 1000000, CPUSystemNS: 500000, MemoryPeak: 4096, TasksPeak: 7, Tasks: 3, OOMKills: 2}
	if got := p.stats(); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	if empty, err := p.empty(); empty || err != nil {
		t.Errorf("empty = %v, %v; want false (populated 1)", empty, err)
	}
	writeFiles(t, dir, map[string]string{"cgroup.events": "populated 0\nfrozen 0\n"})
	if empty, err := p.empty(); !empty || err != nil {
		t.Errorf("empty = %v, %v; want true (populated 0)", empty, err)
	}
	if empty, err := (unitCgroups{Unified: dir + "-gone"}).empty(); !empty || err != nil {
		t.Errorf("empty of a pruned cgroup = %v, %v; want true", empty, err)
	}
}

func TestUnitCgroupsStatsHybrid(t *testing.T) {
	root := t.TempDir()
	p := unitCgroups{
		Unified: filepath.Join(root, "unified", "s"),
		Systemd: filepath.Join(root, "systemd", "s"),
		CPUAcct: filepath.Join(root, "cpuacct", "s"),
		Memory:  filepath.Join(root, "memory", "s"),
		Pids:    filepath.Join(root, "pids", "s"),
	}
	// The unified hierarchy of a hybrid host has no controllers: only
	// cgroup.events and the core cpu.stat. Leave cpu.stat out to exercise
	// the cpuacct fallback.
	writeFiles(t, p.Unified, map[string]string{"cgroup.events": "populated 1\n"})
	writeFiles(t, p.CPUAcct, map[string]string{"cpuacct.usage": "900\n", "cpuacct.usage_user": "600\n", "cpuacct.usage_sys": "300\n"})
	writeFiles(t, p.Memory, map[string]string{
		"memory.max_usage_in_bytes": "8192\n",
		"memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
	})
	writeFiles(t, p.Pids, map[string]string{"pids.current": "4\n"})
	want := Stats{CPUUsageNS: 900, CPUUserNS: 600, CPUSystemNS: 300, MemoryPeak: 8192, TasksPeak: Unknown, Tasks: 4, OOMKills: 1}
	if got := p.stats(); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

// The counters of a scope just read empty (ExitStats, Empty) count no task
// without reading a task count, and on a hybrid host the memory and pids
// counters come from the v1 hierarchies that hold those controllers, not
// from files of the unified one.
func TestUnitCgroupsStatsOfEmpty(t *testing.T) {
	v2 := filepath.Join(t.TempDir(), "corral-x.scope")
	writeFiles(t, v2, map[string]string{
		"cpu.stat":      "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
		"memory.peak":   "4096\n",
		"memory.events": "oom_kill 0\n",
		"pids.current":  "3\n", // stale: the test's; the kernel's would say 0
		"pids.peak":     "7\n",
	})
	p := unitCgroups{Unified: v2}
	want := Stats{CPUUsageNS: 1500000, CPUUserNS: 1000000, CPUSystemNS: 500000, MemoryPeak: 4096, TasksPeak: 7, Tasks: 0, OOMKills: 0}
	if got := p.statsOf(true); got != want {
		t.Errorf("v2 statsOf(empty) = %+v, want %+v", got, want)
	}
	if got := p.statsOf(false); got.Tasks != 3 {
		t.Errorf("v2 statsOf(not empty).Tasks = %d, want 3", got.Tasks)
	}

	root := t.TempDir()
	h := unitCgroups{
		Unified: filepath.Join(root, "unified", "s"),
		Memory:  filepath.Join(root, "memory", "s"),
		Pids:    filepath.Join(root, "pids", "s"),
	}
	writeFiles(t, h.Unified, map[string]string{
		"cpu.stat":    "usage_usec 2\nuser_usec 1\nsystem_usec 1\n",
		"memory.peak": "99999\n", // not the scope's: memory is a v1 controller here
		"pids.peak":   "99\n",
	})
	writeFiles(t, h.Memory, map[string]string{"memory.max_usage_in_bytes": "8192\n", "memory.oom_control": "oom_kill 1\n"})
	writeFiles(t, h.Pids, map[string]string{"pids.current": "4\n", "pids.peak": "6\n"})
	want = Stats{CPUUsageNS: 2000, CPUUserNS: 1000, CPUSystemNS: 1000, MemoryPeak: 8192, TasksPeak: 6, Tasks: 0, OOMKills: 1}
	if got := h.statsOf(true); got != want {
		t.Errorf("hybrid statsOf(empty) = %+v, want %+v", got, want)
	}
	want.Tasks = 4
	if got := h.statsOf(false); got != want {
		t.Errorf("hybrid statsOf(not empty) = %+v, want %+v", got, want)
	}
}

func TestUnitCgroupsEmptyLegacy(t *testing.T) {
	root := t.TempDir()
	p := unitCgroups{Systemd: filepath.Join(root, "s")}
	writeFiles(t, p.Systemd, map[string]string{"cgroup.procs": ""})
	writeFiles(t, filepath.Join(p.Systemd, "child"), map[string]string{"cgroup.procs": "123\n"})
	if empty, err := p.empty(); empty || err != nil {
		t.Errorf("empty = %v, %v; want false (a child cgroup has a process)", empty, err)
	}
	writeFiles(t, filepath.Join(p.Systemd, "child"), map[string]string{"cgroup.procs": ""})
	if empty, err := p.empty(); !empty || err != nil {
		t.Errorf("empty = %v, %v; want true", empty, err)
	}
}

func TestMergeStats(t *testing.T) {
	last := Stats{CPUUsageNS: 100, CPUUserNS: 60, CPUSystemNS: 40, MemoryPeak: 50, TasksPeak: 5, Tasks: 5, OOMKills: 1}
	tests := []struct {
		name string
		now  Stats
		gone bool
		want Stats
	}{
		{"grows", Stats{200, 120, 80, 70, 6, 2, 1}, false, Stats{200, 120, 80, 70, 6, 2, 1}},
		{"pruned keeps last", unknownStats(), true, Stats{100, 60, 40, 50, 5, 0, 1}},
		{"no kernel peak: highest count", Stats{200, 120, 80, 70, Unknown, 9, 1}, false, Stats{200, 120, 80, 70, 9, 9, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mergeStats(last, tt.now, tt.gone); got != tt.want {
				t.Errorf("mergeStats = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestV1OOMCount(t *testing.T) {
	type step struct {
		n      uint64
		exists bool
	}
	tests := []struct {
		name          string
		steps         []step
		wantCertain   bool
		wantAmbiguous bool
	}{
		{"signal while the cgroup exists is an OOM", []step{{1, true}}, true, false},
		{"two signals once gone include an OOM", []step{{2, false}}, true, false},
		{"OOM then removal, read apart", []step{{1, true}, {1, false}}, true, false},
		{"lone signal once gone is ambiguous", []step{{1, false}}, false, true},
		{"ambiguity settled by the removal signal", []step{{1, false}, {1, false}}, true, false},
		{"nothing read", []step{{0, false}}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newV1OOM(-1, nil)
			var amb bool
			for _, s := range tt.steps {
				amb = o.countLocked(s.n, s.exists)
			}
			if o.certain != tt.wantCertain || amb != tt.wantAmbiguous {
				t.Errorf("certain %v, ambiguous %v; want %v, %v", o.certain, amb, tt.wantCertain, tt.wantAmbiguous)
			}
		})
	}
}

// oomEventfd is a non-blocking eventfd standing in for a v1 OOM
// notification, and signal one notification on it.
func oomEventfd(t *testing.T) (efd int, signal func()) {
	t.Helper()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	return efd, func() {
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], 1)
		if _, err := unix.Write(efd, b[:]); err != nil {
			t.Fatal(err)
		}
	}
}

// drainLocked reads what is pending and never waits: a lone signal with the
// cgroup gone is left ambiguous (runOOM settles it), the next one makes it
// an OOM.
func TestV1OOMDrain(t *testing.T) {
	efd, signal := oomEventfd(t)
	t.Cleanup(func() { unix.Close(efd) })
	gone := filepath.Join(t.TempDir(), "gone")

	o := newV1OOM(efd, nil)
	o.wait = time.Hour // were it waited for, the test would hang
	signal()
	if !o.drainLocked(gone) || o.certain || o.settled {
		t.Fatalf("lone signal once gone: certain %v settled %v, want ambiguous", o.certain, o.settled)
	}
	if !o.drainLocked(gone) {
		t.Fatal("nothing more read: no longer ambiguous")
	}
	select {
	case <-o.decided:
		t.Fatal("decided while ambiguous")
	default:
	}
	signal() // the removal's, after the OOM's
	if o.drainLocked(gone) || !o.certain {
		t.Fatalf("OOM then removal signal: certain %v, want an OOM", o.certain)
	}
	select {
	case <-o.decided:
	default:
		t.Fatal("decided not closed once certain")
	}
}

// The settling wait of a lone signal read once the cgroup is gone is
// runOOM's, on its goroutine: Stats and OOMUndecided, which the reactor
// calls on its loop goroutine, return at once, without the scope's lock
// held by a wait (before, Stats polled the eventfd for up to 30 ms under
// it). OOMUndecided's channel closes when the removal's signal comes (an
// OOM), or at the end of the wait (none).
func TestV1OOMSettlesOffTheCaller(t *testing.T) {
	for _, tc := range []struct {
		name    string
		removal bool // the second signal comes: the lone one was an OOM
	}{{"oom", true}, {"no oom", false}} {
		t.Run(tc.name, func(t *testing.T) {
			efd, signal := oomEventfd(t)
			o := newV1OOM(efd, os.NewFile(uintptr(efd), "oom-eventfd"))
			o.wait = time.Hour // ended below, by the signal or by hand
			s := &systemdScope{state: unitRunning, paths: unitCgroups{Memory: filepath.Join(t.TempDir(), "gone")}, oom: o, last: unknownStats()}
			w := &cgroupWatch{}
			if !w.adopt(o.file) {
				t.Fatal("adopt refused")
			}
			w.runOOM(o, s)
			t.Cleanup(w.stop)

			signal()
			answered := make(chan (<-chan struct{}), 1)
			go func() {
				if _, err := s.Stats(); err != nil {
					t.Errorf("Stats: %v", err)
				}
				answered <- s.OOMUndecided()
			}()
			var decided <-chan struct{}
			select {
			case decided = <-answered:
			case <-time.After(10 * time.Second):
				t.Fatal("Stats and OOMUndecided did not return within 10 s: they wait for the settling signal")
			}
			if decided == nil {
				t.Fatal("OOMUndecided = nil with a lone signal read once the cgroup is gone, want a channel")
			}
			if tc.removal {
				signal()
			} else {
				// The end of the wait, now.
				o.file.SetReadDeadline(time.Now())
			}
			select {
			case <-decided:
			case <-time.After(10 * time.Second):
				t.Fatal("not decided within 10 s")
			}
			st, _ := s.Stats()
			if got := st.OOMKills > 0; got != tc.removal {
				t.Errorf("OOMKills = %d once decided, want an OOM: %v", st.OOMKills, tc.removal)
			}
			if s.OOMUndecided() != nil {
				t.Error("OOMUndecided != nil once decided")
			}
		})
	}
}

// A dash nests a slice in the one its prefix names, as systemd places it.
func TestSlicePath(t *testing.T) {
	for slice, want := range map[string]string{
		"corral.slice":             "/corral.slice",
		"corral-pool4.slice":       "/corral.slice/corral-pool4.slice",
		"a-b-c.slice":              "/a.slice/a-b.slice/a-b-c.slice",
		"-.slice":                  "",
		"system-corral\\x2d.slice": "/system.slice/system-corral\\x2d.slice",
		"bad--name.slice":          "/bad--name.slice",
	} {
		if got := slicePath(slice); got != want {
			t.Errorf("slicePath(%q) = %q, want %q", slice, got, want)
		}
	}
}
