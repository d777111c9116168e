package reactor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
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
	proc   *os.Process
	pidfd  int // -1: use the waiter goroutine
	sc     scope.Scope
	stdout int
	stderr int
	stdin  int // -1: the child's stdin is /dev/null, or all of it was written and closed (stdinDone)
	// stdinSent is how much of the given stdin openStdio wrote into the
	// pipe before the start; stdinDone: all of it, and the pipe's write
	// end is closed (stdin is -1).
	stdinSent int
	stdinDone bool
	tty       int // the terminal's master (tty: true; stdout, stderr and stdin are -1), or -1
	work      string
	launched  time.Time // when the command was let run (placed.launched, or the pooled dispatch)
	// execPending is the handle of a pooled shim that was given its
	// command but whose exec the loop still waits for (awaitExec); nil
	// once it exec'd, or for any other start.
	execPending *shim.Handle
	// parked are the roles spawn put in the fd store as soon as the
	// command was let run (parkSpawned), so that a crash before the loop
	// takes the child up loses nothing; the loop owns them from adopt on.
	parked   []string
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
//
// The steps, in order: planLaunch (workspace, cwd and argv[0], identity),
// openStdio (pipes or a terminal), the wait for created, startPooled (a
// warm shim takes the command) or else startInline (build the command,
// wrap it in the shim, startPlaced, wait for the exec). Each step leaves
// in sp what the loop takes over: the parent fds, the workspace, the
// process and its scope; after a failed start only the workspace, which
// the caller removes with the execution.
func (r *Reactor) spawn(e *execution, ra runAs, created <-chan error) (sp *spawned, storeErr error) {
	durable := false
	defer func() {
		if !durable {
			// Returned before the wait below (a failed start): the record
			// must still be durable before the failed start is told, as
			// before any child.
			if err := <-created; err != nil {
				sp.discard()
				sp, storeErr = nil, err
			}
		}
	}()
	sp = &spawned{pidfd: -1, stdout: -1, stderr: -1, stdin: -1, tty: -1}

	lp, err := r.planLaunch(e, ra, sp)
	if err != nil {
		return sp.fail(err), nil
	}
	stdio, err := sp.openStdio(e.params, ra)
	if err != nil {
		return sp.fail(err), nil
	}
	// Whatever follows, the child's ends go once the child (or a pooled
	// shim) has its copies, or once nothing will start.
	defer stdio.close()

	// From here on processes start: the created record must be durable.
	durable = true
	if err := <-created; err != nil {
		stdio.close()
		sp.discard()
		return nil, err
	}

	if r.startPooled(e, lp, stdio, sp) {
		return sp, nil
	}
	r.startInline(e, lp, stdio, sp)
	return sp, nil
}

// fail records err as sp's failed start (with its errno name, when the
// error carries one) and returns sp. It closes nothing: the caller of the
// step that failed has already let go of what the step opened.
func (sp *spawned) fail(err error) *spawned {
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

// discard undoes what spawn made before anything started, for a created
// record the store could not commit: the parent ends of the pipes and the
// workspace.
func (sp *spawned) discard() {
	sp.closeFds()
	if sp.work != "" {
		_ = removeWorkspace(sp.work)
	}
}

// launchPlan is what a request resolves to before anything is opened or
// started: where and as whom the command runs, and how it is started.
type launchPlan struct {
	dir    string   // the working directory: the request's, a workspace, or /
	path   string   // argv[0] resolved (root runs), or argv[0] as given (the shim resolves it)
	env    []string // the child's environment
	asUser bool     // a non-root user: the shim checks cwd and argv[0] as that user
	cred   *syscall.Credential
	limits scope.Limits
	// hold: the backend places after start, so the shim holds the child
	// until its scope does. needShim: the command cannot be exec'd
	// straight from os/exec (held, network none, or another user).
	hold, needShim bool
}

// planLaunch makes e's workspace (into sp.work, when the request names no
// cwd) and resolves the rest of the plan. An error is a failed start; the
// workspace, if made, stays in sp.work for the caller to remove with the
// rest of the execution.
func (r *Reactor) planLaunch(e *execution, ra runAs, sp *spawned) (launchPlan, error) {
	p := e.params
	lp := launchPlan{dir: p.Cwd, path: p.Argv[0]}
	// Working directory: the request's, or a fresh workspace.
	if lp.dir == "" && r.cfg.StateDir != "" {
		w, err := makeWorkspace(r.cfg.StateDir, e.id, ra)
		if err != nil {
			return lp, fmt.Errorf("create workspace: %w", err)
		}
		sp.work, lp.dir = w, w
	}
	if lp.dir == "" {
		lp.dir = "/"
	}
	lp.env = childEnv(p.Env, ra)
	// A root run checks cwd and argv[0] here, for clear errors. Anyone
	// else's are checked by the shim after it became the user: checking as
	// root would let a caller learn whether a path exists in a directory
	// it cannot search (ENOENT against EACCES).
	lp.asUser = ra.uid != 0
	if !lp.asUser {
		if fi, err := os.Stat(lp.dir); err != nil {
			// The message names dir once: keep only the PathError's reason.
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return lp, fmt.Errorf("cwd %s: %w", lp.dir, err)
		} else if !fi.IsDir() {
			return lp, fmt.Errorf("cwd %s: %w", lp.dir, syscall.ENOTDIR)
		}
		var err error
		if lp.path, err = lookPath(p.Argv[0], lp.dir, envValue(lp.env, "PATH")); err != nil {
			return lp, err
		}
	}

	if os.Geteuid() == 0 || ra.uid != uint32(os.Geteuid()) || ra.gid != uint32(os.Getegid()) {
		// As root, always set the identity: it also replaces the daemon's
		// own supplementary groups with the user's.
		lp.cred = &syscall.Credential{Uid: ra.uid, Gid: ra.gid, Groups: r.withoutSocketGroup(ra.groups)}
	}
	lp.limits = scope.Limits{MemoryBytes: p.MemoryBytes, TasksMax: p.TasksMax, CPUMS: p.CPUMS}

	// Under a backend that places at clone or by process group, a root
	// caller's command on the host network is exec'd straight from os/exec
	// (vfork + exec) into a cgroup or session made in place; every other
	// command goes through the shim (package shim), to be held until its
	// scope holds it (scope.PlaceHeld), to enter a new network namespace,
	// or to drop to the caller's user.
	lp.hold = r.cfg.Backend.Placement() == scope.PlaceHeld
	lp.needShim = lp.hold || p.Network == "none" || lp.asUser
	return lp, nil
}

// childStdio holds the child's ends of its stdio. spawn owns them and
// closes them (close) once the child or a pooled shim has its copies, or
// once nothing will start.
type childStdio struct {
	stdin  *os.File // nil: the child's stdin is /dev/null
	stdout *os.File
	stderr *os.File
	files  []*os.File // each file above once (a terminal's slave is all three)
}

// close closes the child's ends; a second call does nothing.
func (c *childStdio) close() {
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
}

// openStdio opens the child's stdio: output pipes (or, for tty, a
// terminal) and, when the request writes to it, a stdin pipe. The parent
// ends go into sp (sp.stdout, sp.stderr, sp.stdin, sp.tty) for the loop;
// the child's ends are returned. The child's ends are blocking; ours are
// non-blocking and go into the epoll set. All are CLOEXEC so no other
// child inherits them. On an error nothing it opened is left open.
func (sp *spawned) openStdio(p api.StartParams, ra runAs) (*childStdio, error) {
	c := &childStdio{}
	if p.TTY {
		// A terminal instead: its slave is the child's stdin, stdout and
		// stderr (and, below, its controlling terminal).
		master, slave, err := openPty(*p.TTYSize, ra.uid, ra.gid)
		if err != nil {
			return nil, fmt.Errorf("open terminal: %w", err)
		}
		sp.tty = master
		c.files = append(c.files, slave)
		c.stdin, c.stdout, c.stderr = slave, slave, slave
		return c, nil
	}
	outR, outW, err := outputPipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := outputPipe()
	if err != nil {
		unix.Close(outR)
		outW.Close()
		return nil, err
	}
	c.stdout, c.stderr = outW, errW
	c.files = append(c.files, outW, errW)
	sp.stdout, sp.stderr = outR, errR
	if p.StdinOpen || len(p.Stdin) > 0 {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			c.close()
			sp.closeFds()
			return nil, os.NewSyscallError("pipe2", err)
		}
		_ = unix.SetNonblock(fds[1], true)
		c.stdin = os.NewFile(uintptr(fds[0]), "stdin")
		c.files = append(c.files, c.stdin)
		sp.stdin = fds[1]
		// Given stdin goes into the pipe now, before anything runs, as far
		// as it fits: then a crash of corrald after the command was let
		// run cannot leave unknown how much of it was written (readopt of
		// a started record). The loop writes the rest (adopt).
		if len(p.Stdin) > 0 {
			rest, err := writeAvailable(fds[1], p.Stdin)
			if err == nil {
				sp.stdinSent = len(p.Stdin) - len(rest)
			}
			if err == nil && len(rest) == 0 && !p.StdinOpen {
				unix.Close(fds[1])
				sp.stdin = -1
				sp.stdinDone = true
			}
		}
	}
	return c, nil
}

// startPooled offers the command to the warm pool: a shim already in its
// own scope takes it. It reports whether the pool took it; then sp holds
// the pooled process and scope, with the shim's handle in sp.execPending
// (the loop waits for the exec: awaitExec), and the child's ends have been
// closed. If not, nothing changed and the caller starts inline.
func (r *Reactor) startPooled(e *execution, lp launchPlan, stdio *childStdio, sp *spawned) bool {
	pe := r.pooled(lp.needShim)
	if pe == nil {
		return false
	}
	p := e.params
	cfg := shimConfig(p, lp.env, lp.dir, sp.work != "", lp.cred)
	cfg.NewNetNS = p.Network == "none"
	cfg.Ctty = p.TTY
	// Into the fd store before the dispatch is sent, with the shim's
	// exec-error pipe (RoleExec): once it is, the command may run, in the
	// pool entry's scope, which the execution's id does not name, and a
	// restart after a crash from here on reads on that pipe whether it
	// did. Where that cannot be parked (no pidfd, a failed store, or the
	// messages still wait in the process for systemd to read them), not
	// through the pool: a crash mid-dispatch could not be told from one
	// before it.
	if r.cfg.FdStore != nil {
		sp.pidfd = pe.pidfd
		parked := pe.pidfd >= 0 && r.parkBeforeLaunch(e, sp, pe.h.ErrFD())
		if !parked {
			// Taken back before the entry's shim is killed (discard).
			r.unparkBeforeKill(e, sp)
			sp.pidfd = -1
			r.pool.discard(pe)
			return false
		}
	}
	if !r.dispatchPooled(pe, cfg, lp.limits, stdio.stdin, stdio.stdout, stdio.stderr) {
		// Nothing ran: the caller starts inline. What was parked is taken
		// back before the entry's shim is killed (discard).
		r.unparkBeforeKill(e, sp)
		sp.pidfd = -1
		r.pool.discard(pe)
		return false
	}
	// The shim has its copies (in the dispatch message).
	stdio.close()
	sp.proc, sp.sc, sp.pidfd, sp.launched = pe.cmd.Process, pe.sc, pe.pidfd, pe.dispatched
	sp.execPending = pe.h
	return true
}

// startInline starts the command in a scope of its own: it builds the
// command, wraps it in the shim when the plan needs one, starts and places
// it (startPlaced) and waits for the shim's exec. The outcome is in sp: the
// process and scope, or a failed start with nothing of the child left (its
// parent fds closed too). It closes the child's ends in stdio before it
// returns, right after the start (the child has its copies then).
func (r *Reactor) startInline(e *execution, lp launchPlan, stdio *childStdio, sp *spawned) {
	p := e.params
	cmd := lp.command(p, stdio)
	// The shim (corral-shim, or corrald re-executed) as the child: to hold
	// it until a backend that places after start (systemd) holds it, and
	// to do what SysProcAttr cannot (bring up lo in a new network
	// namespace before dropping to the user). A non-root user's workspace
	// sits under the root-only state directory: the shim enters it before
	// dropping privileges, which os/exec cannot (it changes the
	// credentials first, then the directory), and checks cwd and argv[0]
	// as the user.
	var sh *shim.Handle
	if lp.needShim {
		cfg := shimConfig(p, lp.env, lp.dir, sp.work != "", lp.cred)
		cfg.Hold = lp.hold
		cfg.Ctty = p.TTY
		cmd.SysProcAttr.Credential = nil // the shim drops privileges itself, last
		var err error
		if sh, err = shim.Wrap(cmd, cfg); err != nil {
			stdio.close()
			sp.closeFds()
			sp.fail(fmt.Errorf("wrap in shim: %w", err))
			return
		}
		defer sh.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A held shim is parked in its scope, right before its release, with
	// its exec-error pipe (RoleExec): a restart after a crash from there
	// on reads on that pipe whether the shim was released and exec'd the
	// command (EOF), or was not and ran nothing (shim.OpParentGone).
	// Where that cannot be parked (no pidfd, a failed store, or the
	// messages still wait in the process for systemd to read them), the
	// shim is not released: a crash after the release could not be told
	// from one before it. The start fails instead.
	var release *releaseHooks
	if sh != nil && r.cfg.FdStore != nil {
		release = &releaseHooks{
			before: func(pl *placed) error {
				sp.pidfd = pl.pidfd
				parked := pl.pidfd >= 0 && r.parkBeforeLaunch(e, sp, sh.ErrFD())
				sp.pidfd = -1
				if !parked {
					return errNotParked
				}
				return nil
			},
			// Before the held shim is aborted and killed (unstart).
			undo: func() { r.unparkBeforeKill(e, sp) },
		}
	}
	pl, err := r.startPlaced(ctx, scope.Spec{ID: e.id, Argv: p.Argv, Cmd: cmd, Limits: lp.limits}, sh, release)
	stdio.close()
	if err != nil {
		r.unparkSpawned(e, sp) // already taken back by startPlaced (undo) when parked
		sp.closeFds()
		sp.fail(err)
		return
	}
	sp.proc, sp.sc, sp.pidfd, sp.launched = pl.proc, pl.sc, pl.pidfd, pl.launched
	if len(sp.parked) == 0 {
		// Not parked before a release (no held shim): into the fd store
		// now that the command runs, not once the loop takes it up, which
		// under load comes late.
		r.parkSpawned(e, sp, -1)
	}
	if sh != nil {
		r.waitShimExec(e, sh, sp)
		return
	}
	if p.CPUMS > 0 {
		// Backstop where no cgroup measures the tree: RLIMIT_CPU on the main
		// process (its later children inherit it).
		secs := uint64((p.CPUMS + 999) / 1000)
		lim := unix.Rlimit{Cur: secs, Max: secs + 1}
		_ = unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CPU, &lim, nil)
	}
}

// command builds the os/exec command for the plan, its stdio the child's
// ends in stdio, in a session of its own. It opens nothing.
func (lp launchPlan) command(p api.StartParams, stdio *childStdio) *exec.Cmd {
	cmd := &exec.Cmd{
		Path:   lp.path,
		Args:   p.Argv,
		Env:    lp.env,
		Dir:    lp.dir,
		Stdout: stdio.stdout,
		Stderr: stdio.stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true,
		},
	}
	if stdio.stdin != nil {
		cmd.Stdin = stdio.stdin // else nil: /dev/null
	}
	if p.TTY && !lp.needShim {
		// setsid, then the terminal (the child's fd 0) becomes its
		// controlling terminal.
		cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0
	}
	cmd.SysProcAttr.Credential = lp.cred
	if p.Network == "none" {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
	}
	return cmd
}

// waitShimExec waits for the started shim's exec, so that a command that
// cannot run is a failed start, as without the shim. On a failed exec it
// undoes the start (process, pidfd, scope and parent fds in sp). The
// caller still closes sh.
func (r *Reactor) waitShimExec(e *execution, sh *shim.Handle, sp *spawned) {
	xerr, werr := sh.WaitExec(30 * time.Second)
	if werr != nil {
		xerr = &shim.ExecError{Op: "exec", Message: fmt.Sprintf("shim did not exec: %v", werr)}
	}
	if xerr != nil {
		sp.fail(r.undoStart(e, sp, xerr)) // the shim exits right after its report
		return
	}
	// Exec'd: the pipe has nothing more to say.
	r.unparkRole(e, sp, RoleExec)
}

// errNotParked fails a held start whose fds could not be parked in the fd
// store before its release (see startInline): nothing ran.
var errNotParked = errors.New("fd store: the execution's fds could not be parked with systemd before the command was let run (systemd slow to read, or the store failed), so it was not started: a crash of corrald could not have told whether it ran")

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

// otherNetns reports whether caller lives in another network namespace
// than the daemon (a caller inside a network "none" execution). It decides
// on caller.Netns, the namespace resolved when its connection was accepted
// (ipc, peerns), never on /proc/<caller.PID>: that pid may have been
// reused by another process since. It fails closed: a caller whose
// namespace is unknown (it could not be resolved at accept, or was never
// resolved though the caller has a pid), or a daemon that cannot read its
// own, counts as in another one, so no failed read gives a caller the
// host's network; err then says why. An in-process caller (no peer: pid 0,
// nothing resolved) is in the daemon's.
func otherNetns(caller api.Owner) (bool, error) {
	if caller.Netns == nil && caller.PID == 0 {
		return false, nil
	}
	mine, err := selfNetns.get()
	if err != nil {
		return true, err
	}
	switch {
	case caller.Netns == nil:
		return true, errNetnsUnresolved
	case caller.Netns.Err != nil:
		return true, caller.Netns.Err
	}
	return caller.Netns.Ino != mine, nil
}

// errNetnsUnresolved is otherNetns's answer for a caller with a pid whose
// namespace nothing resolved.
var errNetnsUnresolved = errors.New("the caller's network namespace was not resolved at accept")

// selfNetns is the daemon's own network namespace (its inode): corrald
// never changes it (a shim enters a new one in its own process), so it is
// read once it could be read. A failed read is not kept: the next call
// reads again.
var selfNetns = netnsCache{read: peerns.Self}

// netnsCache keeps the first successful result of read. Any goroutine.
type netnsCache struct {
	read func() (uint64, error)
	ns   atomic.Pointer[uint64]
}

func (c *netnsCache) get() (uint64, error) {
	if ns := c.ns.Load(); ns != nil {
		return *ns, nil
	}
	ns, err := c.read()
	if err != nil {
		return 0, fmt.Errorf("read the daemon's network namespace: %w", err)
	}
	c.ns.Store(&ns)
	return ns, nil
}

// undoStart cleans up after a child that started but will not run the
// command (it failed to exec): it kills and reaps the child, closes its
// pidfd and pipes, and removes its scope. It returns err, for the failed
// start.
func (r *Reactor) undoStart(e *execution, sp *spawned, err error) error {
	r.unparkBeforeKill(e, sp)
	pl := placed{proc: sp.proc, pidfd: sp.pidfd, sc: sp.sc}
	r.unstart(&pl, e.id)
	sp.proc, sp.pidfd, sp.sc = nil, -1, nil
	sp.closeFds()
	return err
}
