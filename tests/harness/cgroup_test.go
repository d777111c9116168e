package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/tests/testenv"
)

func TestMountScript(t *testing.T) {
	tests := []struct {
		name string
		lay  cgroupLayout
		want []string // lines, in order
	}{
		{
			name: "pure v2",
			lay:  cgroupLayout{rootIsV2: true, hierarchies: []*hierarchy{{mountpoint: "/sys/fs/cgroup", v2: true}}},
			want: []string{
				"umount -l /sys/fs/cgroup",
				"mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup",
			},
		},
		{
			name: "hybrid",
			lay: cgroupLayout{
				hierarchies: []*hierarchy{
					{mountpoint: "/sys/fs/cgroup/cpu,cpuacct", opts: "cpu,cpuacct"},
					{mountpoint: "/sys/fs/cgroup/systemd", opts: "xattr,name=systemd"},
					{mountpoint: "/sys/fs/cgroup/unified", v2: true},
				},
				symlinks: map[string]string{"cpu": "cpu,cpuacct"},
			},
			want: []string{
				"mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs /sys/fs/cgroup",
				"mkdir -p '/sys/fs/cgroup/cpu,cpuacct'",
				"mount -t cgroup -o nosuid,nodev,noexec,cpu,cpuacct cgroup '/sys/fs/cgroup/cpu,cpuacct'",
				"mkdir -p '/sys/fs/cgroup/systemd'",
				"mount -t cgroup -o nosuid,nodev,noexec,xattr,name=systemd cgroup '/sys/fs/cgroup/systemd'",
				"mkdir -p '/sys/fs/cgroup/unified'",
				"mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 '/sys/fs/cgroup/unified'",
				"ln -s 'cpu,cpuacct' '/sys/fs/cgroup/cpu'",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Split(strings.TrimSpace(tt.lay.mountScript()), "\n")
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("mountScript() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestDiscoverCgroupsHere checks discovery against this machine: every
// hierarchy found is a mounted cgroup filesystem whose parent directory
// (our own cgroup) exists.
func TestDiscoverCgroupsHere(t *testing.T) {
	lay, err := discoverCgroups()
	if err != nil {
		testenv.Skipf(t, "no cgroups to discover here: %v", err)
	}
	for _, h := range lay.hierarchies {
		if !strings.HasPrefix(h.parent, h.mountpoint) {
			t.Errorf("hierarchy %s: own cgroup %s is not under its mount point", h.mountpoint, h.parent)
		}
		if _, err := os.Stat(filepath.Join(h.parent, "cgroup.procs")); err != nil {
			t.Errorf("hierarchy %s: own cgroup: %v", h.mountpoint, err)
		}
		if h.child != h.parent {
			t.Errorf("hierarchy %s: child %s before create, want the parent", h.mountpoint, h.child)
		}
	}
}
