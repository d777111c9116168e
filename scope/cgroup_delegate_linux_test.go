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

// cgtFakeFS plays a cgroup tree for enableControllers. A cgroup that holds
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

func TestEnableControllers(t *testing.T) {
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
			got := slices.Sorted(maps.Keys(enableControllers(fs, own, tc.base, 42, zerolog.Nop())))
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
