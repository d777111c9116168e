package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// A pooled shim is started before any request exists: it is placed in its
// scope and then waits, with no command and no stdio, until the daemon
// dispatches one to it. The dispatch carries the Config as JSON and the
// command's stdin, stdout and stderr as SCM_RIGHTS over a SOCK_SEQPACKET
// socket (fd childReleaseFD in the shim). The exec-error pipe works as for
// a wrapped shim.

// maxDispatch bounds the Config message a pooled shim accepts.
const maxDispatch = 1 << 20

// WrapPooled rewrites cmd to start a pooled shim and returns its Handle.
// The caller starts cmd, calls CloseChildEnds, places the shim in its scope
// (Scope.Started; Release is a no-op for a pooled shim), and later calls
// Dispatch once. cmd's Stdin, Stdout and Stderr should be nil (/dev/null):
// the command's come with the dispatch.
func WrapPooled(cmd *exec.Cmd) (*Handle, error) { return wrapPooled(cmd, false) }

// WrapPooledNetNS is WrapPooled for a shim that makes a new network
// namespace, with lo up, while it waits (Config.PreNetNS): a dispatch for
// network "none" (NewNetNS) then skips the unshare and the loopback set-up,
// about a millisecond of kernel work; any other dispatch costs a setns back
// and a namespace made for nothing.
func WrapPooledNetNS(cmd *exec.Cmd) (*Handle, error) { return wrapPooled(cmd, true) }

func wrapPooled(cmd *exec.Cmd, preNetNS bool) (*Handle, error) {
	if cmd.Process != nil {
		return nil, errors.New("shim: wrap pooled: command already started")
	}
	if len(cmd.ExtraFiles) != 0 {
		return nil, errors.New("shim: wrap pooled: command has ExtraFiles")
	}
	// Held: it runs nothing until Dispatch; a backend's Release is a no-op.
	h := &Handle{errR: -1, held: true, pooled: true}
	ok := false
	defer func() {
		if !ok {
			h.Close()
		}
	}()
	var err error
	if h.config, err = writeConfig(Config{Argv: []string{"(pooled)"}, Deferred: true, PreNetNS: preNetNS}); err != nil {
		return nil, err
	}
	if err := h.openErrPipe(); err != nil {
		return nil, err
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shim: dispatch socket: %w", os.NewSyscallError("socketpair", err))
	}
	h.dispatch = os.NewFile(uintptr(sp[0]), "corral-shim-dispatch")
	h.releaseR = os.NewFile(uintptr(sp[1]), "corral-shim-dispatch-child")
	runShim(cmd, h)
	ok = true
	return h, nil
}

// Dispatch hands a pooled shim its command: cfg (Hold and Deferred are
// ignored) and the command's stdio, which the shim dup2s onto 0, 1 and 2.
// The caller keeps ownership of the files and closes them afterwards. Then
// wait for the exec with WaitExec. Once only.
func (h *Handle) Dispatch(cfg Config, stdin, stdout, stderr *os.File) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if h.dispatch == nil {
		return errors.New("shim: dispatch: not a pooled shim, or already dispatched")
	}
	cfg.Hold, cfg.Deferred = false, false
	data, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("shim: dispatch: encode config: %w", err)
	}
	if len(data) > maxDispatch {
		return fmt.Errorf("shim: dispatch: config of %d bytes is over %d", len(data), maxDispatch)
	}
	rights := unix.UnixRights(int(stdin.Fd()), int(stdout.Fd()), int(stderr.Fd()))
	d := h.dispatch
	h.dispatch = nil
	defer d.Close()
	if err := unix.Sendmsg(int(d.Fd()), data, rights, nil, 0); err != nil {
		return fmt.Errorf("shim: dispatch: %w", os.NewSyscallError("sendmsg", err))
	}
	return nil
}

// receiveDispatch waits for the daemon's dispatch on fd childReleaseFD:
// the Config and the three stdio fds, which it moves onto 0, 1 and 2.
func receiveDispatch() (*Config, error) {
	buf := make([]byte, maxDispatch)
	oob := make([]byte, unix.CmsgSpace(3*4))
	var n, oobn int
	for {
		var err error
		n, oobn, _, _, err = unix.Recvmsg(childReleaseFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, os.NewSyscallError("recvmsg", err)
		}
		break
	}
	unix.Close(childReleaseFD)
	if n == 0 {
		return nil, errParentGone{}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("dispatch: want one control message with the stdio fds: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 3 {
		return nil, fmt.Errorf("dispatch: want 3 fds, got %d: %v", len(fds), err)
	}
	for i, fd := range fds {
		// dup3 without O_CLOEXEC: these are the command's stdio.
		if err := unix.Dup3(fd, i, 0); err != nil {
			return nil, fmt.Errorf("dispatch: dup3 fd %d: %w", i, err)
		}
		if fd > 2 {
			unix.Close(fd)
		}
	}
	var cfg Config
	if err := json.Unmarshal(buf[:n], &cfg); err != nil {
		return nil, fmt.Errorf("dispatch: decode config: %w", err)
	}
	if len(cfg.Argv) == 0 {
		return nil, errors.New("dispatch: empty argv")
	}
	return &cfg, nil
}

// preNetNS enters a new network namespace with lo up, on the calling
// (locked, exec-ing) thread, and returns an fd of the namespace it left, or
// -1 when it stayed where it was (it could not make one: the dispatch then
// does as without PreNetNS).
func preNetNS() int {
	host, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		unix.Close(host)
		return -1
	}
	if err := loopbackUp(); err != nil {
		if unix.Setns(host, unix.CLONE_NEWNET) != nil {
			// Neither here nor back: no dispatch may run in this one.
			os.Exit(ExitCannotExec)
		}
		unix.Close(host)
		return -1
	}
	return host
}

// usePreNetNS fits cfg to the namespace preNetNS made (host is its fd of
// the namespace left, or -1 when none was made): a network "none" command
// keeps it, as made, any other goes back to the host's.
func usePreNetNS(cfg *Config, host int) *ExecError {
	if host < 0 {
		return nil
	}
	defer unix.Close(host)
	if cfg.NewNetNS {
		cfg.NewNetNS, cfg.LoopbackUp = false, false // made, lo up, while it waited
		return nil
	}
	if err := unix.Setns(host, unix.CLONE_NEWNET); err != nil {
		return newExecError("netns", os.NewSyscallError("setns to the host network namespace", err))
	}
	return nil
}
