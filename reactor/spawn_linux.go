package reactor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
)

// pipeSize is what F_SETPIPE_SZ asks for on output pipes, so a burst of
// output waits in the kernel rather than blocking the child between two
// loop wake-ups. The kernel caps it at /proc/sys/fs/pipe-max-size.
const pipeSize = 1 << 20

// spawned is what spawn hands to the loop. Either startErr is set and
// nothing runs, or proc runs in sc with the parent ends of its pipes.
type spawned struct {
	proc     *os.Process
	pidfd    int // -1: use the waiter goroutine
	sc       scope.Scope
	stdout   int
	stderr   int
	stdin    int // -1: the child's stdin is /dev/null
	tty      int // the terminal's master (tty: true; stdout, stderr and stdin are -1), or -1
	work     string
	launched time.Time // when the command was let run (placed.launched, or the pooled dispatch)
	startErr error
	errno    string
}

// spawn starts e's child. It runs on the caller's goroutine, never on the
// loop: it reads the user database, creates the scope (a D-Bus round trip
// under systemd) and forks.
//
// created is the store's answer for e's created record: spawn makes the
// workspace and the pipes while the store commits, and waits for it before
// anything that starts a process (the fork, or a pooled shim). If the
// store failed, spawn undoes what it made and returns the store's error:
// nothing was started. A failed start is not an error (spawned.startErr).
func (r *Reactor) spawn(e *execution, ra runAs, created <-chan error) (sp *spawned, storeErr error) {
	durable := false
	defer func() {
		if !durable {
			// Returned before the wait below (a failed start): the record
			// must still be durable before the failed start is told, as
			// before any child.
			if err := <-created; err != nil {
				sp.closeFds()
				if sp.work != "" {
					_ = removeWorkspace(sp.work)
				}
				sp, storeErr = nil, err
			}
		}
	}()
	sp = &spawned{pidfd: -1, stdout: -1, stderr: -1, stdin: -1, tty: -1}
	p := e.params
	fail := func(err error) *spawned {
		sp.startErr = err
		var errno syscall.Errno
		var xerr *shim.ExecError
		switch {
		case errors.As(err, &xerr):
			sp.errno = xerr.Errno
		case errors.As(err, &errno):
			sp.errno = unix.ErrnoName(errno)
		}
		return sp
	}

	// Working directory: the request's, or a fresh workspace.
	dir := p.Cwd
	if dir == "" && r.cfg.StateDir != "" {
		w, err := makeWorkspace(r.cfg.StateDir, e.id, ra)
		if err != nil {
			return fail(fmt.Errorf("create workspace: %w", err)), nil
		}
		sp.work, dir = w, w
	}
	if dir == "" {
		dir = "/"
	}
	env := childEnv(p.Env, ra)
	// A root run checks cwd and argv[0] here, for clear errors. Anyone
	// else's are checked by the shim after it became the user: checking as
	// root would let a caller learn whether a path exists in a directory
	// it cannot search (ENOENT against EACCES).
	asUser := ra.uid != 0
	path := p.Argv[0]
	if !asUser {
		if fi, err := os.Stat(dir); err != nil {
			// The message names dir once: keep only the PathError's reason.
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fail(fmt.Errorf("cwd %s: %w", dir, err)), nil
		} else if !fi.IsDir() {
			return fail(fmt.Errorf("cwd %s: %w", dir, syscall.ENOTDIR)), nil
		}
		var err error
		if path, err = lookPath(p.Argv[0], dir, envValue(env, "PATH")); err != nil {
			return fail(err), nil
		}
	}

	// Pipes: the child's ends are blocking; ours are non-blocking and go
	// into the epoll set. All are CLOEXEC so no other child inherits them.
	var child []*os.File
	closeChild := func() {
		for _, f := range child {
			f.Close()
		}
	}
	var stdin, outW, errW *os.File
	if p.TTY {
		// A terminal instead: its slave is the child's stdin, stdout and
		// stderr (and, below, its controlling terminal).
		master, slave, err := openPty(*p.TTYSize, ra.uid, ra.gid)
		if err != nil {
			return fail(fmt.Errorf("open terminal: %w", err)), nil
		}
		sp.tty = master
		child = append(child, slave)
		stdin, outW, errW = slave, slave, slave
	} else {
		outR, w, err := outputPipe()
		if err != nil {
			return fail(err), nil
		}
		errR, w2, err := outputPipe()
		if err != nil {
			unix.Close(outR)
			w.Close()
			return fail(err), nil
		}
		outW, errW = w, w2
		child = append(child, outW, errW)
		sp.stdout, sp.stderr = outR, errR
	}
	if !p.TTY && (p.StdinOpen || len(p.Stdin) > 0) {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			closeChild()
			sp.closeFds()
			return fail(os.NewSyscallError("pipe2", err)), nil
		}
		_ = unix.SetNonblock(fds[1], true)
		stdin = os.NewFile(uintptr(fds[0]), "stdin")
		child = append(child, stdin)
		sp.stdin = fds[1]
	}

	var cred *syscall.Credential
	if os.Geteuid() == 0 || ra.uid != uint32(os.Geteuid()) || ra.gid != uint32(os.Getegid()) {
		// As root, always set the identity: it also replaces the daemon's
		// own supplementary groups with the user's.
		cred = &syscall.Credential{Uid: ra.uid, Gid: ra.gid, Groups: r.withoutSocketGroup(ra.groups)}
	}
	limits := scope.Limits{MemoryBytes: p.MemoryBytes, TasksMax: p.TasksMax, CPUMS: p.CPUMS}

	// Under a backend that places at clone or by process group, a root
	// caller's command on the host network is exec'd straight from os/exec
	// (vfork + exec) into a cgroup or session made in place; every other
	// command goes through the shim (package shim), to be held until its
	// scope holds it (scope.PlaceHeld), to enter a new network namespace,
	// or to drop to the caller's user.
	hold := r.cfg.Backend.Placement() == scope.PlaceHeld
	needShim := hold || p.Network == "none" || asUser

	// From here on processes start: the created record must be durable.
	durable = true
	if err := <-created; err != nil {
		closeChild()
		sp.closeFds()
		if sp.work != "" {
			_ = removeWorkspace(sp.work)
		}
		return nil, err
	}

	// The warm pool: a shim already in its own scope takes the command.
	if pe := r.pooled(needShim); pe != nil {
		cfg := shimConfig(p, env, dir, sp.work != "", cred)
		cfg.NewNetNS = p.Network == "none"
		cfg.Ctty = p.TTY
		if xerr, ok := r.dispatchPooled(pe, cfg, limits, stdin, outW, errW); ok {
			closeChild()
			sp.proc, sp.sc, sp.pidfd, sp.launched = pe.cmd.Process, pe.sc, pe.pidfd, pe.dispatched
			if xerr != nil {
				return fail(r.undoStart(e, sp, xerr)), nil // the shim exits right after its report
			}
			return sp, nil
		}
	}

	cmd := &exec.Cmd{
		Path:   path,
		Args:   p.Argv,
		Env:    env,
		Dir:    dir,
		Stdin:  stdin,
		Stdout: outW,
		Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true,
		},
	}
	if stdin == nil {
		cmd.Stdin = nil // /dev/null
	}
	if p.TTY && !needShim {
		// setsid, then the terminal (the child's fd 0) becomes its
		// controlling terminal.
		cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0
	}
	cmd.SysProcAttr.Credential = cred
	if p.Network == "none" {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	// The shim (corral-shim, or corrald re-executed) as the child: to hold
	// it until a backend that places after start (systemd) holds it, and
	// to do what SysProcAttr cannot (bring up lo in a new network
	// namespace before dropping to the user). A non-root user's workspace
	// sits under the root-only state directory: the shim enters it before
	// dropping privileges, which os/exec cannot (it changes the
	// credentials first, then the directory), and checks cwd and argv[0]
	// as the user.
	var (
		sh  *shim.Handle
		err error
	)
	if needShim {
		cfg := shimConfig(p, env, dir, sp.work != "", cred)
		cfg.Hold = hold
		cfg.Ctty = p.TTY
		cmd.SysProcAttr.Credential = nil // the shim drops privileges itself, last
		if sh, err = shim.Wrap(cmd, cfg); err != nil {
			closeChild()
			sp.closeFds()
			return fail(fmt.Errorf("wrap in shim: %w", err)), nil
		}
		defer sh.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pl, err := r.startPlaced(ctx, scope.Spec{ID: e.id, Argv: p.Argv, Cmd: cmd, Limits: limits}, sh)
	closeChild()
	if err != nil {
		sp.closeFds()
		return fail(err), nil
	}
	sp.proc, sp.sc, sp.pidfd, sp.launched = pl.proc, pl.sc, pl.pidfd, pl.launched
	if sh != nil {
		// Wait for the shim's exec, so that a command that cannot run is
		// a failed start, as without the shim.
		xerr, werr := sh.WaitExec(30 * time.Second)
		if werr != nil {
			xerr = &shim.ExecError{Op: "exec", Message: fmt.Sprintf("shim did not exec: %v", werr)}
		}
		if xerr != nil {
			return fail(r.undoStart(e, sp, xerr)), nil // the shim exits right after its report
		}
		return sp, nil
	}
	if p.CPUMS > 0 {
		// Backstop where no cgroup measures the tree: RLIMIT_CPU on the main
		// process (its later children inherit it).
		secs := uint64((p.CPUMS + 999) / 1000)
		lim := unix.Rlimit{Cur: secs, Max: secs + 1}
		_ = unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CPU, &lim, nil)
	}
	return sp, nil
}

// closeFds closes the parent ends of the pipes.
func (sp *spawned) closeFds() {
	for _, fd := range []*int{&sp.stdout, &sp.stderr, &sp.stdin, &sp.tty} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// outputPipe returns a pipe whose read end (ours) is non-blocking and large.
func outputPipe() (int, *os.File, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return -1, nil, os.NewSyscallError("pipe2", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeCapacity()); err != nil {
		_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return -1, nil, os.NewSyscallError("set nonblock", err)
	}
	return fds[0], os.NewFile(uintptr(fds[1]), "output"), nil
}

// shimConfig is what a shim needs to set up and exec the request.
func shimConfig(p api.StartParams, env []string, dir string, workspace bool, cred *syscall.Credential) shim.Config {
	cfg := shim.Config{
		Argv: p.Argv, Env: env, Dir: dir,
		LoopbackUp: p.Network == "none", NoNewPrivs: true,
		EnterDirAsRoot: workspace,
	}
	if cred != nil {
		cfg.SetCreds, cfg.UID, cfg.GID, cfg.Groups = true, cred.Uid, cred.Gid, cred.Groups
	}
	if p.CPUMS > 0 {
		secs := uint64((p.CPUMS + 999) / 1000)
		cfg.Rlimits = append(cfg.Rlimits, shim.Rlimit{Resource: unix.RLIMIT_CPU, Cur: secs, Max: secs + 1})
	}
	return cfg
}

// withoutSocketGroup drops the socket's group from a child's supplementary
// groups: a command must not reach corrald's socket through the caller's
// membership (a network "none" child asking for a host-network run, or
// any child starting work outside its own scope and limits).
func (r *Reactor) withoutSocketGroup(groups []uint32) []uint32 {
	if r.cfg.SocketGID < 0 {
		return groups
	}
	out := make([]uint32, 0, len(groups))
	for _, g := range groups {
		if int64(g) != r.cfg.SocketGID {
			out = append(out, g)
		}
	}
	return out
}

// otherNetns reports whether process pid lives in another network
// namespace than the daemon (a caller inside a network "none" execution).
func otherNetns(pid int32) bool {
	mine, err1 := os.Readlink("/proc/self/ns/net")
	theirs, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	return err1 == nil && err2 == nil && mine != theirs
}

// undoStart cleans up after a child that started but will not run the
// command (it failed to exec): it kills and reaps the child, closes its
// pidfd and pipes, and removes its scope. It returns err, for the failed
// start.
func (r *Reactor) undoStart(e *execution, sp *spawned, err error) error {
	pl := placed{proc: sp.proc, pidfd: sp.pidfd, sc: sp.sc}
	r.unstart(&pl, e.id)
	sp.proc, sp.pidfd, sp.sc = nil, -1, nil
	sp.closeFds()
	return err
}
