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
			var o v1OOM
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

func TestV1OOMDrain(t *testing.T) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd) })
	signal := func() {
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], 1)
		if _, err := unix.Write(efd, b[:]); err != nil {
			t.Fatal(err)
		}
	}
	gone := filepath.Join(t.TempDir(), "gone")

	// A lone signal with the cgroup gone, and nothing else within the
	// wait: settled as the removal, and never waited for again.
	o := &v1OOM{fd: efd}
	signal()
	start := time.Now()
	o.drainLocked(gone, 50*time.Millisecond)
	if o.certain || !o.settled {
		t.Errorf("lone signal: certain %v settled %v; want false, true", o.certain, o.settled)
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Errorf("drain returned after %v, want it to wait for the settling signal", took)
	}
	start = time.Now()
	o.drainLocked(gone, 2*time.Second)
	// Well under the 2s it would wait, with room for a stalled test process.
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("second drain waited %v, want no wait once settled", took)
	}

	// OOM signal and then the removal's, arriving during the wait.
	o = &v1OOM{fd: efd}
	signal()
	go func() { time.Sleep(10 * time.Millisecond); signal() }()
	o.drainLocked(gone, 2*time.Second)
	if !o.certain {
		t.Error("OOM then removal signal: not counted as an OOM")
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
