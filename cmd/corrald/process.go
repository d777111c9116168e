package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// setNoNewPrivs sets no_new_privs on the daemon, so children inherit it and
// no setuid binary can raise a child's privileges. It is set on every
// thread: the flag is per-thread and Go forks from any of them. It returns
// the daemon.info check: "ok" or why not.
func setNoNewPrivs(log zerolog.Logger) string {
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); errno != 0 {
		log.Warn().Err(errno).Msg("cannot set no_new_privs on the daemon; children may gain privileges through setuid binaries")
		return "not set: " + errno.Error()
	}
	return "ok"
}

// raiseFileLimit lets the daemon hold the fds of many executions (two pipes
// and two pidfds each, stdin too when open): as root it raises
// RLIMIT_NOFILE to fs.nr_open (at most 1<<20). It uses x/sys's prlimit, not
// syscall.Setrlimit, so os/exec still gives children the limit the daemon
// started with.
func raiseFileLimit(log zerolog.Logger) {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil || os.Geteuid() != 0 {
		return
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return
	}
	n = min(n, 1<<20)
	lim := unix.Rlimit{Cur: n, Max: n}
	if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		log.Warn().Err(err).Uint64("wanted", n).Msg("cannot raise RLIMIT_NOFILE; the number of executions at once is bounded by the current limit (4 fds each)")
	}
}

// closeRangeCloexec marks every fd from 3 up close-on-exec
// (close_range(2), Linux >= 5.11); a variable for tests.
var closeRangeCloexec = func() error {
	return unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}

// markInheritedCloexec sets close-on-exec on every fd above stderr the
// process holds: the ones it inherited. Where close_range cannot do it
// (an older kernel, a seccomp filter that refuses it) each fd listed in
// /proc/self/fd is marked.
func markInheritedCloexec() error {
	if err := closeRangeCloexec(); err == nil {
		return nil
	}
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("close_range failed and cannot list fds: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		if fd, cerr := strconv.Atoi(n); cerr == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	if err != nil {
		return fmt.Errorf("close_range failed; list fds: %w", err)
	}
	return nil
}
