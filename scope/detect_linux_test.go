package scope

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

func TestDetect(t *testing.T) {
	h := Detect()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatalf("uname: %v", err)
	}
	if want := unix.ByteSliceToString(uts.Release[:]); h.Kernel != want {
		t.Errorf("Kernel = %q, want %q", h.Kernel, want)
	}
	if h.Cgroup2Mount != "" && !cgroupv2.IsCgroup2(h.Cgroup2Mount) {
		t.Errorf("Cgroup2Mount = %q, not a cgroup2 filesystem", h.Cgroup2Mount)
	}
	switch h.CgroupMode {
	case "v2", "hybrid":
		if h.Cgroup2Mount == "" || !strings.HasPrefix(h.OwnCgroup, "/") {
			t.Errorf("mode %q with Cgroup2Mount %q, OwnCgroup %q: want both set", h.CgroupMode, h.Cgroup2Mount, h.OwnCgroup)
		}
		if (h.CgroupMode == "v2") != (h.Cgroup2Mount == "/sys/fs/cgroup") {
			t.Errorf("mode %q with cgroup2 at %q", h.CgroupMode, h.Cgroup2Mount)
		}
	case "v1", "":
		if h.Cgroup2Mount != "" {
			t.Errorf("mode %q with cgroup2 at %q", h.CgroupMode, h.Cgroup2Mount)
		}
	default:
		t.Errorf("CgroupMode = %q, want v2, hybrid, v1 or empty", h.CgroupMode)
	}
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err == nil {
		unix.Close(fd)
	}
	if h.Pidfd != (err == nil) {
		t.Errorf("Pidfd = %v, pidfd_open error %v", h.Pidfd, err)
	}
	_, err = os.Stat("/run/systemd/system")
	if h.SystemdPID1 != (err == nil) {
		t.Errorf("SystemdPID1 = %v, stat /run/systemd/system: %v", h.SystemdPID1, err)
	}
}
