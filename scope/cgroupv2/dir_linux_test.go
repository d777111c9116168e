package cgroupv2

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
)

// writeFiles creates dir/name with content for each entry: a stand-in for a
// cgroup's interface files.
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

func TestKeyed(t *testing.T) {
	data := []byte("usage_usec 1500\nuser_usec  1000\nbad x\n")
	tests := []struct {
		key    string
		want   int64
		wantOK bool
	}{
		{"usage_usec", 1500, true},
		{"user_usec", 1000, true},
		{"bad", 0, false},
		{"missing", 0, false},
		{"usage", 0, false}, // a prefix of a key is not the key
	}
	for _, tt := range tests {
		if got, ok := Keyed(data, tt.key); got != tt.want || ok != tt.wantOK {
			t.Errorf("Keyed(%q) = %d, %v, want %d, %v", tt.key, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestStats(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  Stats
	}{
		{"every controller", map[string]string{
			"cpu.stat":      "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
			"memory.peak":   "4096\n",
			"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n",
			"pids.current":  "3\n",
			"pids.peak":     "7\n",
		}, Stats{CPUUsageNS: 1500000, CPUUserNS: 1000000, CPUSystemNS: 500000, MemoryPeak: 4096, TasksPeak: 7, Tasks: 3, OOMKills: 2}},
		{"no controllers: cpu.stat only", map[string]string{
			"cpu.stat": "usage_usec 2\nuser_usec 1\nsystem_usec 1\n",
		}, Stats{CPUUsageNS: 2000, CPUUserNS: 1000, CPUSystemNS: 1000, MemoryPeak: Unknown, TasksPeak: Unknown, Tasks: Unknown, OOMKills: Unknown}},
		{"max reads as unknown", map[string]string{
			"cpu.stat": "usage_usec 0\n", "pids.current": "max\n",
		}, Stats{CPUUsageNS: 0, CPUUserNS: Unknown, CPUSystemNS: Unknown, MemoryPeak: Unknown, TasksPeak: Unknown, Tasks: Unknown, OOMKills: Unknown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Dir(filepath.Join(t.TempDir(), "c"))
			writeFiles(t, d.Path(), tt.files)
			got, err := d.Stats()
			if err != nil || got != tt.want {
				t.Errorf("Stats = %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
	if _, err := Dir(filepath.Join(t.TempDir(), "gone")).Stats(); !Gone(err) {
		t.Errorf("Stats of a removed cgroup: error %v, want one Gone reports", err)
	}
}

func TestEmpty(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "c"))
	tests := []struct {
		name    string
		events  string // "" removes the directory
		want    bool
		wantErr bool
	}{
		{"populated", "populated 1\nfrozen 0\n", false, false},
		{"emptied", "populated 0\nfrozen 0\n", true, false},
		{"no populated key", "frozen 0\n", false, true},
		{"removed", "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.events == "" {
				if err := os.RemoveAll(d.Path()); err != nil {
					t.Fatal(err)
				}
			} else {
				writeFiles(t, d.Path(), map[string]string{"cgroup.events": tt.events})
			}
			got, err := d.Empty()
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("Empty = %v, %v, want %v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestWalkAndProcs(t *testing.T) {
	root := Dir(filepath.Join(t.TempDir(), "c"))
	writeFiles(t, root.Path(), map[string]string{"cgroup.procs": "10\n11\n"})
	writeFiles(t, root.Child("a").Path(), map[string]string{"cgroup.procs": ""})
	writeFiles(t, root.Child("a").Child("b").Path(), map[string]string{"cgroup.procs": "12\n"})
	var seen []string
	pids := 0
	err := root.Walk(func(d Dir) error {
		rel, _ := filepath.Rel(root.Path(), d.Path())
		seen = append(seen, rel)
		p, err := d.Procs()
		pids += len(p)
		return err
	})
	if err != nil {
		t.Fatalf("Walk = %v", err)
	}
	if want := []string{".", "a", "a/b"}; len(seen) != 3 || seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Errorf("Walk visited %v, want %v (parents first)", seen, want)
	}
	if pids != 3 {
		t.Errorf("Procs over the tree found %d pids, want 3", pids)
	}
}

func TestRemoveTreeMissing(t *testing.T) {
	if err := Dir(filepath.Join(t.TempDir(), "gone")).RemoveTree(); err != nil {
		t.Errorf("RemoveTree(missing) = %v, want nil", err)
	}
}

// TestThreads counts cgroup.threads of a cgroup and of its children; a
// cgroup whose cgroup.stat says it has no descendants is not walked.
func TestThreads(t *testing.T) {
	leaf := t.TempDir()
	writeFiles(t, leaf, map[string]string{
		"cgroup.stat":    "nr_descendants 0\nnr_dying_descendants 0\n",
		"cgroup.threads": "10\n11\n",
	})
	// A directory that would be counted if the leaf were walked.
	writeFiles(t, filepath.Join(leaf, "stray"), map[string]string{"cgroup.threads": "12\n"})
	if n, err := Dir(leaf).Threads(); err != nil || n != 2 {
		t.Errorf("Threads of a leaf = %d, %v; want 2", n, err)
	}
	parent := t.TempDir()
	writeFiles(t, parent, map[string]string{
		"cgroup.stat":    "nr_descendants 1\nnr_dying_descendants 0\n",
		"cgroup.threads": "20\n",
	})
	writeFiles(t, filepath.Join(parent, "child"), map[string]string{"cgroup.threads": "21\n22\n"})
	if n, err := Dir(parent).Threads(); err != nil || n != 3 {
		t.Errorf("Threads of a parent = %d, %v; want 3", n, err)
	}
	noStat := t.TempDir() // an older kernel's layout: walked
	writeFiles(t, noStat, map[string]string{"cgroup.threads": "30\n"})
	writeFiles(t, filepath.Join(noStat, "child"), map[string]string{"cgroup.threads": "31\n"})
	if n, err := Dir(noStat).Threads(); err != nil || n != 2 {
		t.Errorf("Threads without cgroup.stat = %d, %v; want 2", n, err)
	}
}

// TestRemoveTreeNested removes a real cgroup with a child and a grandchild
// (root and a writable cgroup2 hierarchy needed), and a childless one.
func TestRemoveTreeNested(t *testing.T) {
	var mount string
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if IsCgroup2(p) {
			mount = p
			break
		}
	}
	testenv.SkipRoot(t, "makes cgroups")
	if mount == "" {
		testenv.Skip(t, "no cgroup2 hierarchy")
	}
	base := Dir(filepath.Join(mount, fmt.Sprintf("corral-cgroupv2-test-%d", os.Getpid())))
	deep := base.Child("a").Child("b")
	if err := os.MkdirAll(string(deep), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Rmdir(string(deep))
		_ = unix.Rmdir(string(base.Child("a")))
		_ = unix.Rmdir(string(base))
	})
	if err := base.RemoveTree(); err != nil {
		t.Fatalf("RemoveTree = %v", err)
	}
	if base.Exists() {
		t.Errorf("%s still there", base)
	}
	if err := os.Mkdir(string(base), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := base.RemoveTree(); err != nil || base.Exists() {
		t.Errorf("RemoveTree of a childless cgroup = %v, exists %v", err, base.Exists())
	}
}

// testMount is a writable cgroup2 hierarchy of this host, or "" (then the
// test skips): root needed.
func testMount(t testing.TB) string {
	testenv.SkipRoot(t, "makes cgroups")
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if IsCgroup2(p) {
			return p
		}
	}
	testenv.Skip(t, "no cgroup2 hierarchy")
	return ""
}

// TestReadIsReadFile: Read gives what os.ReadFile gives, for a real
// cgroup's interface files and for a regular file longer than Read's first
// buffer, and the same error for a file that is not there (Gone,
// os.ErrNotExist, the same message).
func TestReadIsReadFile(t *testing.T) {
	big := t.TempDir()
	long := make([]byte, 70000)
	for i := range long {
		long[i] = byte('a' + i%26)
	}
	writeFiles(t, big, map[string]string{"long": string(long), "empty": ""})
	for _, name := range []string{"long", "empty"} {
		got, err := Dir(big).Read(name)
		want, _ := os.ReadFile(filepath.Join(big, name))
		if err != nil || string(got) != string(want) {
			t.Errorf("Read(%s) = %d bytes, %v; want %d bytes", name, len(got), err, len(want))
		}
	}
	_, err := Dir(big).Read("missing")
	_, werr := os.ReadFile(filepath.Join(big, "missing"))
	if !Gone(err) || !errors.Is(err, os.ErrNotExist) || err.Error() != werr.Error() {
		t.Errorf("Read(missing) = %v; want %v (gone, not exist)", err, werr)
	}

	mount := testMount(t)
	d := Dir(filepath.Join(mount, fmt.Sprintf("corral-cgroupv2-read-%d", os.Getpid())))
	if err := os.Mkdir(string(d), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(string(d)) })
	for _, name := range []string{"cgroup.stat", "cpu.stat", "cgroup.events", "cgroup.threads", "cgroup.procs", "cgroup.controllers"} {
		got, err := d.Read(name)
		want, werr := os.ReadFile(filepath.Join(string(d), name))
		if err != nil || werr != nil || string(got) != string(want) {
			t.Errorf("Read(%s) = %q, %v; os.ReadFile = %q, %v", name, got, err, want, werr)
		}
	}
}

// BenchmarkRead: Read against os.ReadFile of a cgroup's cgroup.stat.
func BenchmarkRead(b *testing.B) {
	mount := testMount(b)
	d := Dir(filepath.Join(mount, fmt.Sprintf("corral-cgroupv2-bench-%d", os.Getpid())))
	if err := os.Mkdir(string(d), 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Rmdir(string(d)) })
	b.Run("Read", func(b *testing.B) {
		for b.Loop() {
			if _, err := d.Read("cgroup.stat"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("os.ReadFile", func(b *testing.B) {
		path := filepath.Join(string(d), "cgroup.stat")
		for b.Loop() {
			if _, err := os.ReadFile(path); err != nil {
				b.Fatal(err)
			}
		}
	})
}
