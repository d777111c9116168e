// Package shim is corral's child-side launcher. corrald starts it
// (cmd/corral-shim, pinned with UseBinary, or corrald itself re-executed)
// whenever a child must be held before it runs anything of the
// caller's (so that a systemd scope can be created around it first), or
// needs set-up that os/exec's SysProcAttr cannot do (bringing up the
// loopback interface of a new network namespace, rlimits, no_new_privs, a
// PATH lookup with the child's own environment).
//
// Parent side: Wrap rewrites an *exec.Cmd so that it starts the shim, and
// returns a Handle holding the parent's ends of the shim's pipes. Child side:
// the main of cmd/corral-shim and of cmd/corrald calls Main first thing when
// os.Args[1] == Arg; Main reads
// its Config, waits for Release when held, does the set-up and execs the
// command. A failure before exec is reported as an ExecError on the error
// pipe, and the shim exits with ExitNotFound or ExitCannotExec.
package shim

import (
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Arg is the os.Args[1] that makes corrald run as the shim.
const Arg = "__corral-shim"

// Exit codes of the shim when it does not reach exec. They follow the shell
// (and corralctl) conventions.
const (
	// ExitParentGone: the release pipe reached EOF without a byte, so the
	// parent closed the Handle (or died) instead of releasing. Nothing of the
	// caller's ran.
	ExitParentGone = 125
	// ExitCannotExec: set-up or exec failed for a reason other than "not
	// found" (EACCES, ENOEXEC, a bad cwd, setuid failure, ...).
	ExitCannotExec = 126
	// ExitNotFound: the command was not found (ENOENT from the PATH lookup
	// or from exec).
	ExitNotFound = 127
)

// Rlimit is one resource limit the shim sets before exec.
type Rlimit struct {
	Resource int    `json:"resource"` // unix.RLIMIT_*
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// Config is what the shim does in the child. It travels to the child as JSON
// in a sealed memfd.
type Config struct {
	// Argv is the command; Argv[0] is looked up in the PATH of Env (not of
	// the daemon) unless it contains a slash. Required.
	Argv []string `json:"argv"`
	// Env is the command's whole environment, exactly; nil means empty. The
	// daemon's environment never reaches the command.
	Env []string `json:"env"`
	// Dir is the working directory; "" keeps the shim's (the daemon's cwd,
	// or cmd.Dir if the caller set it before Wrap).
	Dir string `json:"dir,omitempty"`
	// Hold makes the shim wait for Handle.Release before doing anything.
	Hold bool `json:"hold,omitempty"`
	// LoopbackUp brings up "lo" in the shim's network namespace. Use it with
	// SysProcAttr.Cloneflags |= CLONE_NEWNET, where lo starts down.
	LoopbackUp bool `json:"loopback_up,omitempty"`
	// Rlimits are set in order, before credentials change.
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// SetCreds makes the shim call setgroups(Groups), setgid(GID) and
	// setuid(UID), in that order, before chdir(Dir) and the PATH lookup, so
	// that both are checked with the new credentials.
	SetCreds bool     `json:"set_creds,omitempty"`
	UID      uint32   `json:"uid,omitempty"`
	GID      uint32   `json:"gid,omitempty"`
	Groups   []uint32 `json:"groups,omitempty"`
	// NoNewPrivs sets PR_SET_NO_NEW_PRIVS for the command (setuid binaries
	// and file capabilities no longer raise privileges).
	NoNewPrivs bool `json:"no_new_privs,omitempty"`
	// EnterDirAsRoot enters Dir before the credentials change (a workspace
	// the daemon created under a root-only directory). Otherwise Dir is
	// entered as the new user.
	EnterDirAsRoot bool `json:"enter_dir_as_root,omitempty"`
	// NewNetNS makes the shim unshare a new network namespace itself (a
	// pooled shim was cloned before the request said network "none").
	NewNetNS bool `json:"new_netns,omitempty"`
	// Deferred marks a pooled shim's placeholder config: the real one comes
	// with the dispatch (WrapPooled).
	Deferred bool `json:"deferred,omitempty"`
	// PreNetNS, in a pooled shim's placeholder config (WrapPooledNetNS),
	// makes the shim enter a new network namespace with lo up while it
	// waits, off the request's path; a dispatch with NewNetNS then finds
	// it made, one without returns to the shim's first network namespace
	// (setns) before anything else.
	PreNetNS bool `json:"pre_netns,omitempty"`
	// Ctty makes the terminal on fd 0 the shim's controlling terminal
	// (TIOCSCTTY) before anything else; the shim must lead its session
	// (SysProcAttr.Setsid, as every corral child has). The command
	// inherits it.
	Ctty bool `json:"ctty,omitempty"`
}

// ExecError is the shim's report of a failure before or at exec.
type ExecError struct {
	// Op is the step that failed: "config", "hold", "loopback", "setrlimit",
	// "setgroups", "setgid", "setuid", "chdir", "no_new_privs", "lookpath"
	// or "exec"; OpParentGone for a pooled shim whose parent died before
	// it dispatched a command.
	Op string `json:"op"`
	// Errno names the errno ("ENOENT", "EACCES", ...); "" if none applies.
	Errno string `json:"errno,omitempty"`
	// Message is human-readable and safe to show to the client, for
	// example `exec "foo": no such file or directory`.
	Message string `json:"message"`
}

func (e *ExecError) Error() string { return e.Message }

// Unwrap returns the syscall.Errno named by Errno, so that
// errors.Is(err, unix.ENOENT) works on an *ExecError.
func (e *ExecError) Unwrap() error {
	if e.Errno == "" {
		return nil
	}
	if n, ok := errnoByName()[e.Errno]; ok {
		return n
	}
	return nil
}

// errnoByName maps errno names back to numbers (x/sys only maps numbers to
// names).
var errnoByName = sync.OnceValue(func() map[string]syscall.Errno {
	m := make(map[string]syscall.Errno)
	for n := syscall.Errno(1); n < 4096; n++ {
		if name := unix.ErrnoName(n); name != "" {
			if _, dup := m[name]; !dup {
				m[name] = n
			}
		}
	}
	return m
})

// NotFound reports whether the command itself was not found (exit 127), as
// opposed to, say, a missing working directory (126).
func (e *ExecError) NotFound() bool {
	return e.Errno == "ENOENT" && (e.Op == "lookpath" || e.Op == "exec")
}

// OpParentGone is the Op of the report a pooled shim leaves on its error
// pipe when its dispatch socket reached EOF with no command: its parent
// died (or gave it up) before dispatching, and nothing of the caller's
// ran. A restarted corrald that was handed that pipe's read end reads it
// to tell such a start from one whose command was exec'd (EOF, no report).
const OpParentGone = "parent-gone"

// ExitCode is the exit status the shim used for this error.
func (e *ExecError) ExitCode() int {
	if e.Op == OpParentGone {
		return ExitParentGone
	}
	if e.NotFound() {
		return ExitNotFound
	}
	return ExitCannotExec
}

// newExecError builds an ExecError for op from err, naming its errno.
func newExecError(op string, err error) *ExecError {
	e := &ExecError{Op: op, Message: err.Error()}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		e.Errno = unix.ErrnoName(errno)
	}
	return e
}

// ErrPending is returned by ReadExecError when the shim has neither reported
// an error nor exec'd (or exited) yet.
var ErrPending = errors.New("shim: exec result pending")

// maxReport bounds an encoded ExecError so that it is written with one
// atomic write (below PIPE_BUF) and read with one read.
const maxReport = 4000

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
