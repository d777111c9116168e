package scope

import (
	"os"

	"golang.org/x/sys/unix"
)

// Detect describes the host. It only reads kernel state (mountinfo,
// /proc/self/cgroup, uname) and opens and closes one pidfd, so any goroutine
// may call it; it never fails, leaving unknown facts at their zero value.
func Detect() Host {
	var h Host
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		mounts := cgParseMountinfo(data)
		h.CgroupMode = cgModeOf(mounts)
		if m, ok := cgPickCgroup2(mounts); ok {
			h.Cgroup2Mount = m.Point
		}
	}
	if data, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if own, ok := cgParseOwn(data); ok {
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
