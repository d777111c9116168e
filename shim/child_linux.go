package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// defaultPath is searched when cfg.Env has no PATH (systemd's default).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Main runs the shim in the child and never returns: it execs the command
// or exits with ExitParentGone, ExitCannotExec or ExitNotFound. Call it
// first thing in main when len(os.Args) > 1 && os.Args[1] == Arg, before
// anything opens files or starts goroutines of its own.
func Main() {
	// no_new_privs is per thread: set it on the thread that execs, and exec
	// from that thread.
	runtime.LockOSThread()

	// Everything but stdio becomes close-on-exec, so a successful exec
	// leaves the command exactly fds 0, 1 and 2, and closes the error pipe
	// (EOF tells the parent "exec'd"). The runtime's own fds already are.
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		markAllCloexec()
	}
	errPipe := os.NewFile(childErrFD, "corral-shim-error")

	cfg, err := readConfig()
	if err != nil {
		fail(errPipe, newExecError("config", err))
	}
	if cfg.Deferred {
		host := -1
		if cfg.PreNetNS {
			host = preNetNS()
		}
		if cfg, err = receiveDispatch(); err != nil {
			var gone errParentGone
			if errors.As(err, &gone) {
				// Said on the error pipe too (exit ExitParentGone): a
				// corrald that crashed mid-dispatch parked its read end,
				// and the next one reads there that nothing ran.
				fail(errPipe, &ExecError{Op: OpParentGone, Message: "the dispatch socket closed before a command came: nothing ran"})
			}
			fail(errPipe, newExecError("dispatch", err))
		}
		if e := usePreNetNS(cfg, host); e != nil {
			fail(errPipe, e)
		}
	} else if cfg.Hold {
		if err := hold(); err != nil {
			var gone errParentGone
			if errors.As(err, &gone) {
				// As for a pooled shim: a corrald that crashed before the
				// release parked the read end, and the next one reads here
				// that nothing ran.
				fail(errPipe, &ExecError{Op: OpParentGone, Message: "the release pipe closed without a release: nothing ran"})
			}
			fail(errPipe, newExecError("hold", err))
		}
	}
	if e := setup(cfg); e != nil {
		fail(errPipe, e)
	}
	path, err := lookPath(cfg.Argv[0], pathOf(cfg.Env))
	if err != nil {
		fail(errPipe, newExecError("lookpath", fmt.Errorf("exec %q: %w", cfg.Argv[0], err)))
	}
	err = syscall.Exec(path, cfg.Argv, cfg.Env)
	fail(errPipe, newExecError("exec", fmt.Errorf("exec %q: %w", cfg.Argv[0], err)))
}

// readConfig reads the JSON Config from the sealed memfd and closes it.
func readConfig() (*Config, error) {
	f := os.NewFile(childConfigFD, "corral-shim-config")
	defer f.Close()
	// The memfd shares its offset with the parent's copy, which is at the
	// end: read from offset 0 explicitly.
	data, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if len(cfg.Argv) == 0 {
		return nil, errors.New("decode config: empty argv")
	}
	return &cfg, nil
}

type errParentGone struct{}

func (errParentGone) Error() string { return "parent closed the release pipe" }

// hold blocks until the parent writes the release byte. EOF without it
// means the parent gave up on this child (or died).
func hold() error {
	f := os.NewFile(childReleaseFD, "corral-shim-release")
	defer f.Close()
	var b [1]byte
	for {
		n, err := unix.Read(int(f.Fd()), b[:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return os.NewSyscallError("read release pipe", err)
		case n == 0:
			return errParentGone{}
		}
		return nil
	}
}

// setup does everything between the release and the exec, in the order
// whose reasons are given at each step.
func setup(cfg *Config) *ExecError {
	// First, while still root: a session leader without a controlling
	// terminal takes the one on its stdin.
	if cfg.Ctty {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			return newExecError("ctty", os.NewSyscallError("ioctl(TIOCSCTTY)", err))
		}
	}
	// Before credentials change: bringing an interface up needs
	// CAP_NET_ADMIN, raising a hard rlimit needs CAP_SYS_RESOURCE.
	if cfg.NewNetNS {
		// This thread (locked, it execs) gets a new network namespace.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return newExecError("netns", os.NewSyscallError("unshare(CLONE_NEWNET)", err))
		}
	}
	if cfg.LoopbackUp {
		if err := loopbackUp(); err != nil {
			return newExecError("loopback", fmt.Errorf("bring up lo: %w", err))
		}
	}
	for _, r := range cfg.Rlimits {
		lim := syscall.Rlimit{Cur: r.Cur, Max: r.Max}
		// syscall.Setrlimit (not unix.Setrlimit) so that the runtime does
		// not restore its saved RLIMIT_NOFILE at exec over ours.
		if err := syscall.Setrlimit(r.Resource, &lim); err != nil {
			return newExecError("setrlimit", fmt.Errorf("setrlimit %d: %w", r.Resource, err))
		}
	}
	// A workspace the daemon made for this execution may sit under a
	// directory only root can traverse: enter it while still root. Any
	// other directory is entered as the user (below), so a request cannot
	// reach a directory its user could not.
	if cfg.Dir != "" && cfg.EnterDirAsRoot {
		if e := chdir(cfg.Dir); e != nil {
			return e
		}
	}
	if cfg.SetCreds {
		if e := setThreadCreds(cfg.Groups, cfg.GID, cfg.UID); e != nil {
			return e
		}
	}
	// After setuid, so that the new user must be able to enter Dir.
	if cfg.Dir != "" && !cfg.EnterDirAsRoot {
		if e := chdir(cfg.Dir); e != nil {
			return e
		}
	}
	if cfg.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return newExecError("no_new_privs", os.NewSyscallError("prctl(PR_SET_NO_NEW_PRIVS)", err))
		}
	}
	return nil
}

// setThreadCreds sets the supplementary groups, then the gid, then the
// uid (after setuid the others may no longer change) of the calling
// thread, the one that execs (Main locked it): an exec keeps the calling
// thread's credentials, real, effective, saved and filesystem ids alike,
// and ends every other thread, and all that runs as the user before it
// (chdir, lookPath's access checks, the exec's own) runs on this thread.
// Raw syscalls, not syscall.Setgroups, Setgid and Setuid: those change
// every thread of the process (the runtime stops the world and signals
// each thread, once per call), which in a waiting shim cost 0.3-0.4 ms of
// a pooled start under systemd, for threads the exec ends anyway.
func setThreadCreds(groups []uint32, gid, uid uint32) *ExecError {
	gs := make([]int, len(groups))
	for i, g := range groups {
		gs[i] = int(g)
	}
	// unix.Setgroups is the raw, per-thread syscall.
	if err := unix.Setgroups(gs); err != nil {
		return newExecError("setgroups", fmt.Errorf("setgroups: %w", err))
	}
	if _, _, errno := unix.RawSyscall(sysSetgid, uintptr(gid), 0, 0); errno != 0 {
		return newExecError("setgid", fmt.Errorf("setgid %d: %w", gid, errno))
	}
	if _, _, errno := unix.RawSyscall(sysSetuid, uintptr(uid), 0, 0); errno != 0 {
		return newExecError("setuid", fmt.Errorf("setuid %d: %w", uid, errno))
	}
	return nil
}

// chdir enters dir, reporting `chdir "dir": <reason>`.
func chdir(dir string) *ExecError {
	if err := unix.Chdir(dir); err != nil {
		return newExecError("chdir", fmt.Errorf("chdir %q: %w", dir, err))
	}
	return nil
}

// loopbackUp sets IFF_UP on "lo" of the current network namespace with
// SIOCSIFFLAGS, without the ip binary.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return os.NewSyscallError("ioctl(SIOCGIFFLAGS)", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return os.NewSyscallError("ioctl(SIOCSIFFLAGS)", err)
	}
	return nil
}

// pathOf returns the PATH of env, or defaultPath.
func pathOf(env []string) string {
	path, found := "", false
	for _, kv := range env {
		// The last definition wins, as getenv(3) would see after execve.
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path, found = v, true
		}
	}
	if !found {
		return defaultPath
	}
	return path
}

// lookPath finds file in path like execvp(3): a name with a slash is used
// as is; otherwise the first executable regular file in path wins, and an
// empty path element means the current directory. The error is ENOENT when
// nothing matched, or the error of the last candidate that exists but is
// not executable (EACCES), as execvp reports it.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil // exec reports its own error
	}
	var last error = unix.ENOENT
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if dir == "." {
			p = "./" + file
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			last = unix.EACCES
			continue
		}
		// Checked with the effective ids, which SetCreds already changed.
		if err := unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, unix.AT_EACCESS); err != nil {
			last = err
			continue
		}
		return p, nil
	}
	return "", last
}

// fail reports e on the error pipe and exits with its code.
func fail(errPipe *os.File, e *ExecError) {
	e.Message = truncate(e.Message, maxReport/2)
	data, err := json.Marshal(e)
	if err == nil && len(data) <= maxReport {
		// One write below PIPE_BUF is atomic: the parent reads it whole.
		errPipe.Write(data)
	}
	os.Exit(e.ExitCode())
}

// markAllCloexec is the fallback for kernels without close_range(2)
// (before 5.11): mark each open fd >= 3 close-on-exec.
func markAllCloexec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err != nil || fd < 3 {
			continue
		}
		unix.CloseOnExec(fd)
	}
}
