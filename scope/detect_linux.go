package scope

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"
)

// Detect describes the host. It only reads kernel state (mountinfo,
// /proc/self/cgroup, uname) and opens and closes one pidfd, so any goroutine
// may call it; it never fails, leaving unknown facts at their zero value.
func Detect() Host {
	var h Host
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		mounts := cgroupv2.ParseMountinfo(data)
		h.CgroupMode = cgroupv2.Mode(mounts)
		if m, ok := cgroupv2.FindUnified(mounts); ok {
			h.Cgroup2Mount = m.Point
		}
	}
	if data, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if own, ok := cgroupv2.ParseOwn(data); ok {
			h.OwnCgroup = own
		}
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		h.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	if fd, err := unix.PidfdOpen(os.Getpid(), 0); err == nil {
		h.Pidfd = true
		unix.Close(fd)
	}
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		h.SystemdPID1 = true
	}
	return h
}
