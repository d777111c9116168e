package scope

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

const cgtHybridMountinfo = `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime shared:9 master:1 - cgroup2 cgroup2 rw
`

const cgtV2Mountinfo = `25 22 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
90 25 0:22 /user.slice /mnt/my\040cg rw - cgroup2 cgroup2 rw
`

func TestCgParseMountinfo(t *testing.T) {
	tests := []struct {
		name      string
		info      string
		mode      string
		mount     string
		mountRoot string
	}{
		{"hybrid", cgtHybridMountinfo, "hybrid", "/sys/fs/cgroup/unified", "/"},
		{"pure v2", cgtV2Mountinfo, "v2", "/sys/fs/cgroup", "/"},
		{"v1 only", "31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "v1", "", ""},
		{"none", "22 1 0:21 / /sys rw - sysfs sysfs rw\nbroken line\n", "", "", ""},
		{"v2 elsewhere only", "90 25 0:22 / /cg rw - cgroup2 none rw\n", "v2", "/cg", "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mounts := cgParseMountinfo([]byte(tc.info))
			if got := cgModeOf(mounts); got != tc.mode {
				t.Errorf("cgModeOf = %q, want %q", got, tc.mode)
			}
			m, ok := cgPickCgroup2(mounts)
			if m.Point != tc.mount || m.Root != tc.mountRoot || ok != (tc.mount != "") {
				t.Errorf("cgPickCgroup2 = %+v, %v, want point %q root %q", m, ok, tc.mount, tc.mountRoot)
			}
		})
	}
	// Escaped mount points are decoded.
	mounts := cgParseMountinfo([]byte(cgtV2Mountinfo))
	if len(mounts) != 2 || mounts[1].Point != "/mnt/my cg" || mounts[1].Root != "/user.slice" {
		t.Errorf("cgParseMountinfo = %+v, want second mount /mnt/my cg rooted at /user.slice", mounts)
	}
}

func TestCgOwnDir(t *testing.T) {
	tests := []struct {
		name    string
		mount   cgMount
		cgroup  string // /proc/self/cgroup text
		want    string
		wantErr bool
	}{
		{"root", cgMount{Root: "/", Point: "/sys/fs/cgroup/unified"}, "1:cpu:/\n0::/\n", "/sys/fs/cgroup/unified", false},
		{"service", cgMount{Root: "/", Point: "/sys/fs/cgroup"}, "0::/system.slice/corrald.service\n", "/sys/fs/cgroup/system.slice/corrald.service", false},
		{"subtree mount", cgMount{Root: "/user.slice", Point: "/mnt/cg"}, "0::/user.slice/a.scope\n", "/mnt/cg/a.scope", false},
		{"outside subtree mount", cgMount{Root: "/user.slice", Point: "/mnt/cg"}, "0::/user.slicex/a\n", "", true},
		{"outside namespace", cgMount{Root: "/", Point: "/sys/fs/cgroup"}, "0::/../../x\n", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			own, ok := cgParseOwn([]byte(tc.cgroup))
			if !ok {
				t.Fatalf("cgParseOwn(%q) found no 0:: line", tc.cgroup)
			}
			got, err := cgOwnDir(tc.mount, own)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("cgOwnDir(%+v, %q) = %q, %v, want %q, error %v", tc.mount, own, got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, ok := cgParseOwn([]byte("1:cpu:/\n")); ok {
		t.Errorf("cgParseOwn of a v1-only file found a 0:: line")
	}
}

// cgtFakeFS plays a cgroup tree for cgEnableControllers. A cgroup that holds
// processes (procs) refuses to enable controllers for children with EBUSY,
// like a non-root cgroup on a pure v2 host.
type cgtFakeFS struct {
	root    string
	ctrl    map[string][]string // dir -> cgroup.controllers
	subtree map[string][]string // dir -> cgroup.subtree_control
	procs   map[string][]string // dir -> pids
}

func (f *cgtFakeFS) Read(dir, name string) ([]byte, error) {
	var v []string
	var ok bool
	switch name {
	case "cgroup.controllers":
		v, ok = f.ctrl[dir]
	case "cgroup.subtree_control":
		v, ok = f.subtree[dir]
	}
	if !ok {
		return nil, os.ErrNotExist
	}
	return []byte(strings.Join(v, " ") + "\n"), nil
}

func (f *cgtFakeFS) Write(dir, name, value string) error {
	switch name {
	case "cgroup.subtree_control":
		c := strings.TrimPrefix(value, "+")
		if !slices.Contains(f.ctrl[dir], c) {
			return unix.ENOENT
		}
		if dir != f.root && len(f.procs[dir]) > 0 {
			return unix.EBUSY
		}
		f.subtree[dir] = append(f.subtree[dir], c)
		for child := range f.ctrl {
			if filepath.Dir(child) == dir {
				f.ctrl[child] = append(f.ctrl[child], c)
			}
		}
		return nil
	case "cgroup.procs":
		for d, ps := range f.procs {
			f.procs[d] = slices.DeleteFunc(ps, func(p string) bool { return p == value })
		}
		f.procs[dir] = append(f.procs[dir], value)
		return nil
	}
	return os.ErrPermission
}

func (f *cgtFakeFS) Mkdir(dir string) error {
	if _, ok := f.ctrl[dir]; !ok {
		f.ctrl[dir] = slices.Clone(f.subtree[filepath.Dir(dir)])
		f.subtree[dir] = nil
	}
	return nil
}

func TestCgEnableControllers(t *testing.T) {
	const own = "/cg/system.slice/corrald.service"
	tests := []struct {
		name      string
		offered   []string // controllers of the daemon's own cgroup
		ownProcs  []string // processes in the daemon's own cgroup
		base      string
		want      []string
		wantProcs map[string][]string // where processes end up (nil: unchecked)
	}{
		{
			name:    "pure v2, daemon alone in its cgroup: moves to supervisor",
			offered: []string{"cpu", "io", "memory", "pids"}, ownProcs: []string{"42"},
			base: own + "/corral", want: []string{"cpu", "memory", "pids"},
			wantProcs: map[string][]string{own: {}, own + "/supervisor": {"42"}},
		},
		{
			name:    "another process shares the cgroup: controllers stay off",
			offered: []string{"memory", "pids"}, ownProcs: []string{"42", "43"},
			base: own + "/corral", want: nil,
		},
		{
			name: "no controllers offered", offered: nil, ownProcs: []string{"42"},
			base: own + "/corral", want: nil,
			wantProcs: map[string][]string{own: {"42"}},
		},
		{
			name: "only pids offered", offered: []string{"pids"}, ownProcs: []string{"42"},
			base: own + "/corral", want: []string{"pids"},
		},
		{
			name: "nested base", offered: []string{"memory"}, ownProcs: []string{"42"},
			base: own + "/a/b", want: []string{"memory"},
		},
		{
			name: "base outside own subtree: touches base only", offered: []string{"memory"}, ownProcs: []string{"42"},
			base: "/cg/elsewhere", want: []string{"memory"},
			wantProcs: map[string][]string{own: {"42"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &cgtFakeFS{
				root:    "/cg",
				ctrl:    map[string][]string{own: slices.Clone(tc.offered)},
				subtree: map[string][]string{own: nil},
				procs:   map[string][]string{own: slices.Clone(tc.ownProcs)},
			}
			// The base chain exists (NewCgroup made it), empty of processes.
			for d := tc.base; d != own && d != "/cg" && d != "/"; d = filepath.Dir(d) {
				fs.ctrl[d], fs.subtree[d] = nil, nil
			}
			if !strings.HasPrefix(tc.base, own) {
				fs.ctrl[tc.base] = []string{"memory"} // offered by its own parent
			}
			got := slices.Sorted(maps.Keys(cgEnableControllers(fs, own, tc.base, 42, zerolog.Nop())))
			if !slices.Equal(got, tc.want) {
				t.Errorf("controllers for scopes = %v, want %v", got, tc.want)
			}
			for dir, want := range tc.wantProcs {
				if got := fs.procs[dir]; !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Errorf("processes in %s = %v, want %v", dir, got, want)
				}
			}
		})
	}
}

func TestCgRemoveTreeMissing(t *testing.T) {
	if err := cgRemoveTree(filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Errorf("cgRemoveTree(missing) = %v, want nil", err)
	}
}
