package reactor

// Terminals (exec.start tty: true). The pty pair comes from /dev/ptmx with
// golang.org/x/sys directly rather than github.com/creack/pty: we need the
// master non-blocking in our own epoll set (creack/pty hands out an
// *os.File meant for Go's poller or blocking reads), and the slave opened
// with TIOCGPTPEER, from the master itself, instead of by its /dev/pts path
// (creack/pty's ptsname + open), which a mount namespace or a racing
// process could make name another terminal. Both need only a handful of
// ioctls (TIOCSPTLCK, TIOCGPTPEER, TIOCSWINSZ, TCGETS) that x/sys has.
//
// The master is the execution's terminal fd (terminal.fd), owned by the
// execution: the stdout stream drains it, exec.write writes to it, both
// through one epoll registration. It is closed at cleanup, which hangs up
// the terminal (SIGHUP to whatever still has it as controlling terminal).

import (
	"context"
	"os"
	"os/user"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
)

// maxTTYBuffer bounds the bytes queued for a terminal's input. A terminal
// is typed into: a client that sends more than the child reads gets
// "written" below len(data), never an unbounded buffer.
const maxTTYBuffer = 64 << 10

// terminal is an execution's pseudo-terminal. Loop goroutine only.
type terminal struct {
	fd       int // the master, non-blocking, in the loop's epoll set; -1 once closed
	size     api.TTYSize
	buf      []byte // typed, not yet taken by the terminal
	watching bool   // Writable is in the registration
	veof     byte   // the terminal's end-of-file character (usually ^D)
}

// ttyGroup is the gid of the "tty" group, looked up once (os/user reads
// /etc/group): the group login(1) and devpts give a terminal, so that
// write(1) and wall(1), setgid tty, can write to it and nobody else can.
// ok is false where the host has no such group.
var ttyGroup = sync.OnceValues(func() (gid int, ok bool) {
	g, err := user.LookupGroup("tty")
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(g.Gid)
	return n, err == nil
})

// openPty returns a new pty pair: the master non-blocking and close-on-exec
// (ours), the slave as the child's stdin, stdout and stderr, sized size.
// uid owns the slave, as login(1) would arrange, so that the child may
// change its own terminal's modes and permissions: group tty and mode 0620
// where the host has a tty group, else the caller's gid and mode 0600 (the
// caller's primary group, often shared, never gets write access to it).
func openPty(size api.TTYSize, uid, gid uint32) (master int, slave *os.File, err error) {
	master, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, nil, os.NewSyscallError("open /dev/ptmx", err)
	}
	fail := func(op string, err error) (int, *os.File, error) {
		unix.Close(master)
		return -1, nil, os.NewSyscallError(op, err)
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fail("ioctl(TIOCSPTLCK)", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return fail("ioctl(TIOCGPTPEER)", errno)
	}
	slave = os.NewFile(sfd, "pty")
	ws := &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)}
	if err := unix.IoctlSetWinsize(int(sfd), unix.TIOCSWINSZ, ws); err != nil {
		slave.Close()
		return fail("ioctl(TIOCSWINSZ)", err)
	}
	if os.Geteuid() == 0 {
		// Best effort: the terminal works without it.
		group, mode := int(gid), uint32(0o600)
		if tty, ok := ttyGroup(); ok {
			group, mode = tty, 0o620
		}
		_ = unix.Fchown(int(sfd), int(uid), group)
		_ = unix.Fchmod(int(sfd), mode)
	}
	return master, slave, nil
}

// veofOf reads the terminal's VEOF character; ^D when it cannot.
func veofOf(fd int) byte {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil || t.Cc[unix.VEOF] == 0 {
		return 4
	}
	return t.Cc[unix.VEOF]
}

// adoptTerminal takes the master of a spawned terminal child into the loop:
// the stdout stream reads it, and the terminal accepts writes. Loop
// goroutine only.
func (r *Reactor) adoptTerminal(e *execution, master int, out *stream) {
	r.watchTerminal(e, master, out, *e.params.TTYSize)
	if e.tty.fd >= 0 && len(e.params.Stdin) > 0 {
		t := e.tty
		t.buf = append(t.buf, e.params.Stdin[:min(len(e.params.Stdin), maxTTYBuffer)]...)
		r.flushTerminal(e)
	}
}

// watchTerminal makes master e's terminal, read as the stdout stream out,
// in the loop's epoll set: at spawn (adoptTerminal) and when a restarted
// corrald re-adopts a terminal execution (the fd role RolePTY). Loop
// goroutine only.
func (r *Reactor) watchTerminal(e *execution, master int, out *stream, size api.TTYSize) {
	t := &terminal{fd: master, size: size, veof: veofOf(master)}
	e.tty = t
	out.fd = master
	out.tty = true
	if err := r.loop.Add(master, eventloop.Readable, func(ev eventloop.Events) { r.terminalEvents(e, ev) }); err != nil {
		r.log.Error().Err(err).Str("exec_id", e.id).Msg("watch terminal")
		unix.Close(master)
		t.fd, out.fd = -1, -1
	}
}

// terminalEvents handles the master's readiness: output to drain, room to
// type into. Loop goroutine only.
func (r *Reactor) terminalEvents(e *execution, ev eventloop.Events) {
	if ev&eventloop.Writable != 0 {
		r.flushTerminal(e)
	}
	if ev&(eventloop.Readable|eventloop.Hangup|eventloop.Error) != 0 {
		r.drain(e, e.streams[0])
	}
}

// writeTerminal queues data (and, with closeIt, the terminal's VEOF
// character) for the terminal's input: what fits in its bounded buffer is
// accepted and counted in the answer. Closing does not close the terminal:
// it types end-of-file, which a program reading the terminal sees as EOF
// (after a partial line, the first VEOF ends the line: close again).
// Loop goroutine only.
func (r *Reactor) writeTerminal(e *execution, data []byte, closeIt bool) (int, error) {
	t := e.tty
	if t.fd < 0 {
		return 0, api.Errorf(api.CodeInvalidParams, "stdin: the terminal is closed")
	}
	n := min(len(data), maxTTYBuffer-len(t.buf))
	t.buf = append(t.buf, data[:n]...)
	if closeIt && n == len(data) && len(t.buf) < maxTTYBuffer {
		t.buf = append(t.buf, t.veof)
	}
	r.flushTerminal(e)
	return n, nil
}

// flushTerminal writes what the terminal takes without blocking; the rest
// waits for it to become writable. Loop goroutine only.
func (r *Reactor) flushTerminal(e *execution) {
	t := e.tty
	if t.fd >= 0 {
		var err error
		if t.buf, err = writeAvailable(t.fd, t.buf); err != nil {
			// EIO: no process has the terminal open any more.
			r.log.Debug().Err(err).Str("exec_id", e.id).Msg("write terminal")
			t.buf = nil
		}
	}
	want := len(t.buf) > 0 && t.fd >= 0
	if want != t.watching && t.fd >= 0 {
		ev := eventloop.Readable
		if want {
			ev |= eventloop.Writable
		}
		if err := r.loop.Modify(t.fd, ev); err == nil {
			t.watching = want
		}
	}
	if len(t.buf) == 0 {
		t.buf = nil // do not keep a large backing array
	}
}

// closeTerminal closes the master (the stdout stream's fd): the terminal is
// hung up. Loop goroutine only; closeStream calls it.
func (r *Reactor) closeTerminal(e *execution) {
	t := e.tty
	if t == nil || t.fd < 0 {
		return
	}
	if err := r.loop.Remove(t.fd); err != nil {
		r.log.Debug().Err(err).Str("exec_id", e.id).Msg("unwatch terminal")
	}
	unix.Close(t.fd)
	t.fd = -1
	t.buf = nil
	// What a terminal's output came to when it closed: with the record's
	// error ("cleanup forced") it tells a hang-up at EOF from one at
	// cleanup (tests/drill once found a terminal's last line missing).
	if out := e.streams[0]; out != nil {
		r.log.Debug().Str("exec_id", e.id).Int64("output_bytes", out.kept.total).Str("state", e.state.String()).Msg("terminal closed")
	}
}

// Resize implements exec.resize: TIOCSWINSZ on the terminal; the kernel
// sends SIGWINCH to its foreground process group.
func (r *Reactor) Resize(ctx context.Context, caller api.Owner, p api.ResizeParams) (rec api.Record, err error) {
	if p.ID == "" {
		return rec, api.Errorf(api.CodeInvalidParams, "id: required")
	}
	if err := checkTTYSize(api.TTYSize{Rows: p.Rows, Cols: p.Cols}, "rows, cols"); err != nil {
		return rec, err
	}
	err = r.orStored(ctx, func() error {
		e, err := r.lookup(caller, p.ID)
		if err != nil {
			return err
		}
		if !e.params.TTY {
			return api.Errorf(api.CodeInvalidParams, "id: execution %s has no terminal (start it with tty: true)", e.id)
		}
		if e.tty == nil || e.tty.fd < 0 {
			if e.state.Finished() {
				return api.Errorf(api.CodeInvalidParams, "id: execution %s has exited; its terminal is closed", e.id)
			}
			return api.Errorf(api.CodeInvalidParams, "id: execution %s is still starting; retry", e.id)
		}
		ws := &unix.Winsize{Row: uint16(p.Rows), Col: uint16(p.Cols)}
		if err := unix.IoctlSetWinsize(e.tty.fd, unix.TIOCSWINSZ, ws); err != nil {
			return &api.Error{Code: api.CodeInternal, Message: "resize terminal failed", Err: os.NewSyscallError("ioctl(TIOCSWINSZ)", err)}
		}
		e.tty.size = api.TTYSize{Rows: p.Rows, Cols: p.Cols}
		sz := e.tty.size
		e.rec.TTYSize = &sz
		rec = r.snapshot(e)
		return nil
	}, func() error {
		stored, err := r.stored(caller, p.ID)
		if err != nil {
			return err
		}
		if !stored.TTY {
			return api.Errorf(api.CodeInvalidParams, "id: execution %s has no terminal (start it with tty: true)", p.ID)
		}
		return api.Errorf(api.CodeInvalidParams, "id: execution %s has exited; its terminal is closed", p.ID)
	})
	return rec, err
}

// checkTTYSize validates a terminal size; field names it in the error.
func checkTTYSize(sz api.TTYSize, field string) error {
	if sz.Rows <= 0 || sz.Cols <= 0 {
		return api.Errorf(api.CodeInvalidParams, "%s: rows and cols must be positive (got %dx%d)", field, sz.Rows, sz.Cols)
	}
	if sz.Rows > api.MaxTTYDim || sz.Cols > api.MaxTTYDim {
		return api.Errorf(api.CodeInvalidParams, "%s: rows and cols must be at most %d (got %dx%d)", field, api.MaxTTYDim, sz.Rows, sz.Cols)
	}
	return nil
}
