package scope

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// TestSystemdUnenforcedWithoutController: the systemd backend reports
// memory_bytes and tasks_max as unenforced on a host without the memory or
// pids controller (neither a v1 hierarchy nor in cgroup2's root), as the
// cgroup backend does, so that corralctl run --memory warns there.
func TestSystemdUnenforcedWithoutController(t *testing.T) {
	unified := func(controllers string) cgroupv2.Mount {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte(controllers), 0o644); err != nil {
			t.Fatal(err)
		}
		return cgroupv2.Mount{Point: dir, Root: "/"}
	}
	v1 := cgroupv2.Mount{Point: "/sys/fs/cgroup/x", Root: "/"}
	asked := Limits{MemoryBytes: 64 << 20, TasksMax: 100, CPUMS: 1000}
	for _, tt := range []struct {
		name string
		hier hierarchies
		want Limits
	}{
		{"pure v2 with both", hierarchies{Unified: unified("cpuset cpu io memory hugetlb pids rdma misc\n")}, Limits{}},
		{"pure v2 without memory", hierarchies{Unified: unified("cpu io pids\n")}, Limits{MemoryBytes: asked.MemoryBytes}},
		{"pure v2 without pids", hierarchies{Unified: unified("cpu memory\n")}, Limits{TasksMax: asked.TasksMax}},
		{"hybrid with v1 memory and pids", hierarchies{Unified: unified("hugetlb\n"), Memory: v1, Pids: v1, CPUAcct: v1}, Limits{}},
		{"hybrid without v1 memory or pids", hierarchies{Unified: unified("hugetlb\n"), CPUAcct: v1},
			Limits{MemoryBytes: asked.MemoryBytes, TasksMax: asked.TasksMax}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &systemdBackend{hier: tt.hier, controllers: tt.hier.controllers()}
			s := &systemdScope{b: b, limits: asked, paths: tt.hier.cgroupsOf("/corral.slice/corral-x.scope")}
			if got, ok := Unenforced(s); !ok || got != tt.want {
				t.Errorf("Unenforced = %+v, %v, want %+v, true", got, ok, tt.want)
			}
		})
	}
}
