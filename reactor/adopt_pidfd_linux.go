package reactor

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The exit status of a child someone else reaped. While corrald was down
// its children were reparented (to PID 1 or a subreaper), which may have
// reaped them: wait(2) then answers ECHILD, but since Linux 6.15 the pidfd
// still tells the status (PIDFD_GET_INFO with PIDFD_INFO_EXIT, once the
// process was reaped).

// pidfdInfo is struct pidfd_info up to exit_code (PIDFD_INFO_SIZE_VER0).
type pidfdInfo struct {
	Mask      uint64
	CgroupID  uint64
	Pid, Tgid uint32
	Ppid      uint32
	Ruid      uint32
	Rgid      uint32
	Euid      uint32
	Egid      uint32
	Suid      uint32
	Sgid      uint32
	Fsuid     uint32
	Fsgid     uint32
	ExitCode  int32
}

const (
	// _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info), 64 bytes.
	pidfdGetInfo   = 0xC040FF0B
	pidfdInfoPID   = 1 << 0
	pidfdInfoExit  = 1 << 3
	pidfdInfoSize0 = 64
)

var _ [pidfdInfoSize0 - unsafe.Sizeof(pidfdInfo{})]byte // the struct is 64 bytes

// pidfdExit reads the exit status of the process behind pidfd. ok is false
// while the process has not exited and been reaped, or when the kernel
// cannot tell (no PIDFD_INFO_EXIT): err says which of the two (nil for the
// first).
func pidfdExit(pidfd int) (ws unix.WaitStatus, ok bool, err error) {
	in := pidfdInfo{Mask: pidfdInfoPID | pidfdInfoExit}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&in)))
	switch {
	case e == unix.ESRCH:
		// Gone, and no exit information kept: a kernel without
		// PIDFD_INFO_EXIT.
		return 0, false, errNoPidfdExit
	case e == unix.ENOTTY || e == unix.EINVAL:
		return 0, false, errNoPidfdExit
	case e != 0:
		return 0, false, os.NewSyscallError("ioctl PIDFD_GET_INFO", e)
	case in.Mask&pidfdInfoExit != 0:
		return unix.WaitStatus(in.ExitCode), true, nil
	}
	return 0, false, nil // alive, or a zombie nobody has reaped yet
}

var errNoPidfdExit = errors.New("the kernel does not report the exit status of a child reaped by another process (PIDFD_INFO_EXIT, Linux >= 6.15)")

// ProbePidfdExitInfo reports whether this kernel keeps the exit status of a
// reaped process for its pidfd (PIDFD_INFO_EXIT): it runs a shell that
// exits 7, reaps it, and reads the status back.
func ProbePidfdExitInfo() bool {
	var path string
	for _, p := range []string{"/bin/sh", "/usr/bin/sh", "/bin/true", "/usr/bin/true"} {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		return false
	}
	cmd := exec.Command(path, "-c", "exit 7")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return false
	}
	fd := dupPidfd(cmd.Process)
	_ = cmd.Wait()
	if fd < 0 {
		return false
	}
	defer unix.Close(fd)
	ws, ok, _ := pidfdExit(fd)
	want := 7
	if path != "/bin/sh" && path != "/usr/bin/sh" {
		want = 0 // true ignores its arguments
	}
	return ok && ws.Exited() && ws.ExitStatus() == want
}

// sameProcess reports whether the process handle of p refers to the same
// process as pidfd (pidfs gives every process one inode): a pid found again
// after a restart may belong to another process by now.
func sameProcess(p *os.Process, pidfd int) bool {
	var a, b unix.Stat_t
	if unix.Fstat(pidfd, &a) != nil {
		return false
	}
	same := false
	_ = p.WithHandle(func(h uintptr) {
		same = unix.Fstat(int(h), &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev
	})
	return same
}

// PidfdPid is the pid of the process behind pidfd, from the "Pid:" line of
// /proc/self/fdinfo/<pidfd>: 0 when it cannot be read, -1 once the process
// was reaped (the kernel then shows -1). A started record names no pid
// (corrald died before the running one): re-adoption reads it here.
func PidfdPid(pidfd int) int {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return 0
}
