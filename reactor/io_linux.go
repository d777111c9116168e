package reactor

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/redact"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
)

// stream is one output pipe of an execution. Loop goroutine only.
type stream struct {
	name string // "stdout" or "stderr"
	fd   int    // our read end; -1 once closed
	kept *keptOutput
	// With redact, chunks pass through red before anything keeps or sends
	// them; offsets then count the redacted stream, and raw the bytes the
	// child actually wrote (the record's total_bytes).
	red *redact.Redactor
	raw int64
	tty bool // fd is the execution's terminal (e.tty owns and closes it)
	// parked are exec.output calls with wait_ms waiting for data past
	// their offset, in arrival order (wait.go).
	parked []*parkedRead
	// spool holds what was read for a crash of corrald (adopt_spool_linux.go).
	spool *spool
	// respoolAt, when set, is when the next output tries to make s a spool
	// again (respool): its spool could not be opened or was abandoned.
	respoolAt    time.Time
	respoolFails int // respool's failures in a row (its back-off)
}

// info is the record's view of the stream: kept counts, and the bytes the
// child wrote.
func (s *stream) info() api.StreamInfo {
	in := s.kept.info()
	if s.red != nil {
		in.TotalBytes = s.raw // what the child wrote; truncated still means bytes were dropped
	}
	return in
}

// stdinPipe is the write end of a child's stdin with what is queued for it.
// Loop goroutine only.
type stdinPipe struct {
	fd         int // -1 once closed
	buf        []byte
	closeAfter bool // close once buf is written
	watching   bool // registered for Writable
	err        error
}

// adopt takes a spawned child into the loop: its pidfd (or a waiter
// goroutine), its pipes and its stdin, then moves it to running. A failed
// start goes straight to exited. Loop goroutine only.
func (r *Reactor) adopt(e *execution, sp *spawned) {
	if sp.execPending != nil {
		r.awaitExec(e, sp) // adopts once the pooled shim exec'd
		return
	}
	e.work = sp.work
	if sp.work != "" {
		w := sp.work
		e.rec.Workspace = &w
	}
	if sp.startErr != nil {
		r.toExited(e, exitResult{startErr: sp.startErr, errno: sp.errno})
		return
	}
	e.proc, e.sc, e.launched = sp.proc, sp.sc, sp.launched
	e.parked = sp.parked // the loop owns what spawn parked from here on
	if l, ok := scope.Unenforced(sp.sc); ok {
		for _, u := range []struct {
			name string
			v    int64
		}{{"memory_bytes", l.MemoryBytes}, {"tasks_max", l.TasksMax}, {"cpu_ms", l.CPUMS}} {
			if u.v > 0 {
				e.rec.Unenforced = append(e.rec.Unenforced, u.name)
			}
		}
	}
	for i, fd := range []int{sp.stdout, sp.stderr} {
		s := &stream{name: [2]string{"stdout", "stderr"}[i], fd: fd, kept: newKeptOutput(e.params.OutputLimitBytes)}
		if e.params.Redact {
			s.red = redact.New()
		}
		e.streams[i] = s
		if sp.tty >= 0 {
			// A terminal: its output is stdout; stderr stays empty, at EOF.
			if i == 0 {
				r.adoptTerminal(e, sp.tty, s)
			}
			continue
		}
		if err := r.loop.Add(fd, eventloop.Readable, func(eventloop.Events) { r.drain(e, s) }); err != nil {
			r.log.Error().Err(err).Str("exec_id", e.id).Msg("watch output pipe")
			unix.Close(fd)
			s.fd = -1
		}
	}
	if sp.stdinDone {
		// spawn wrote all of the given stdin and closed the pipe.
		e.stdin = &stdinPipe{fd: -1, closeAfter: true}
	}
	if sp.stdin >= 0 {
		e.stdin = &stdinPipe{fd: sp.stdin}
		if len(e.params.Stdin) > sp.stdinSent {
			e.stdin.buf = append([]byte(nil), e.params.Stdin[sp.stdinSent:]...)
		}
		e.stdin.closeAfter = !e.params.StdinOpen
		r.flushStdin(e)
	}
	if sp.pidfd >= 0 {
		e.pidfd = sp.pidfd
		if err := r.loop.Add(e.pidfd, eventloop.Readable, func(eventloop.Events) { r.reap(e) }); err != nil {
			r.log.Error().Err(err).Str("exec_id", e.id).Msg("watch pidfd; falling back to a waiter goroutine")
			unix.Close(e.pidfd)
			e.pidfd = -1
		}
	}
	r.startSpools(e)
	r.keepParked(e)
	if e.pidfd < 0 {
		// No pidfd: one goroutine does the Wait and posts the result.
		proc := e.proc
		go func() {
			ps, err := proc.Wait()
			r.reaper.reaped(proc.Pid)
			r.reapedWaiter.Add(1)
			r.post(func() { r.toExited(e, exitResult{ps: ps, err: err}) })
		}()
	}
	r.toRunning(e)
}

// execWait bounds how long the loop waits for a dispatched pooled shim to
// exec the command or report why it could not (awaitExec).
const execWait = 30 * time.Second

// awaitExec waits, in the loop's epoll set, for the pooled shim that spawn
// gave sp's command to exec it (EOF on its exec-error pipe) or to report
// why it could not, then adopts the command (adopt) or fails the start.
// spawn used to wait itself (a goroutine in poll(2), then a post to the
// loop): here the exec wakes the loop directly, one thread wake-up and one
// post fewer on the start's path, which on this 2-core host each waited
// behind the command that had just exec'd on the same CPU. A failed exec
// is undone off the loop (undoStart kills and reaps the shim and removes
// its scope: a D-Bus round trip under systemd), then adopted as a failed
// start. Loop goroutine only.
func (r *Reactor) awaitExec(e *execution, sp *spawned) {
	h := sp.execPending
	fd := h.ErrFD()
	var timer *eventloop.Timer
	watched, settled := false, false
	settle := func(rep *shim.ExecError, err error) {
		if settled {
			return
		}
		settled = true
		r.stopTimer(&timer)
		if watched {
			if err := r.loop.Remove(fd); err != nil {
				r.log.Warn().Err(err).Str("exec_id", e.id).Msg("unwatch exec-error pipe")
			}
		}
		h.Close()
		sp.execPending = nil
		if err != nil {
			rep = &shim.ExecError{Op: "exec", Message: fmt.Sprintf("pooled shim did not exec: %v", err)}
		}
		if rep == nil {
			// Exec'd: the pipe has nothing more to say.
			r.unparkRole(e, sp, RoleExec)
			r.adopt(e, sp)
			return
		}
		go func() {
			err := r.undoStart(e, sp, rep) // the shim exits right after its report
			r.post(func() { r.adopt(e, sp.fail(err)) })
		}()
	}
	if err := r.loop.Add(fd, eventloop.Readable, func(eventloop.Events) {
		rep, err := shim.ReadExecError(fd)
		if errors.Is(err, shim.ErrPending) {
			return
		}
		settle(rep, err)
	}); err != nil {
		// Wait off the loop instead, as spawn did.
		r.log.Warn().Err(err).Str("exec_id", e.id).Msg("watch exec-error pipe; waiting on a goroutine")
		go func() {
			rep, err := h.WaitExec(execWait)
			r.post(func() { settle(rep, err) })
		}()
		return
	}
	watched = true
	timer = r.loop.AfterFunc(execWait, func() {
		timer = nil
		settle(nil, shim.ErrPending)
	})
}

// reap runs when e's pidfd is readable: the main process exited. This is
// the one Wait; it does not block because the child is already a zombie.
func (r *Reactor) reap(e *execution) {
	if err := r.loop.Remove(e.pidfd); err != nil {
		r.log.Warn().Err(err).Str("exec_id", e.id).Msg("unwatch pidfd")
	}
	unix.Close(e.pidfd)
	e.pidfd = -1
	ps, err := e.proc.Wait()
	r.reaper.reaped(e.proc.Pid)
	r.reapedPidfd.Add(1)
	if e.state.Finished() {
		// Forced to exited earlier (it survived SIGKILL for KillWait);
		// reaped now, so no zombie stays behind. toExited is then stale.
		r.log.Info().Str("exec_id", e.id).Msg("late exit of main process reaped")
	}
	r.toExited(e, exitResult{ps: ps, err: err})
}

// drain reads what s holds, a bounded amount per wake-up so one chatty child
// cannot starve the others (epoll is level-triggered: the rest comes next
// round).
func (r *Reactor) drain(e *execution, s *stream) {
	rounds := 4
	if s.tty {
		rounds = 16 // a terminal gives at most a few KiB per read
	}
	for i := 0; i < rounds && s.fd >= 0; i++ {
		n, err := r.readOutput(s)
		if n > 0 {
			r.obs.Output(s.name, n)
			chunk := r.readBuf[:n]
			if s.red != nil {
				s.raw += int64(n)
				chunk = s.red.Write(chunk)
			}
			r.keep(e, s, chunk)
			if n < len(r.readBuf) && !s.tty {
				return
			}
			continue
		}
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case err == unix.EIO && s.tty:
			// The terminal's EOF: no process has its slave open any more.
		case err != nil:
			r.log.Warn().Err(err).Str("exec_id", e.id).Str("stream", s.name).Msg("read output")
		}
		// EOF (or a read error): every writer is gone.
		r.closeStream(e, s)
		r.maybeFinishCleanup(e)
		return
	}
}

// drainBeforeExit reads what e's pipes hold before the exit is recorded:
// what the main process wrote before it exited is in them, and is kept
// and sent to the followers ahead of exec.state exited (which may be sent
// from the store's answer, off the loop) and stored with the exited
// record. Without it the order was epoll's (the exit seen before a pipe
// the loop had not read yet: always with the waiter goroutine's posted
// exit). A drain is bounded (rounds of the read buffer), so a tree that
// keeps writing cannot hold the exit up; the state is not exited yet, so
// an EOF here does not finish a cleanup.
func (r *Reactor) drainBeforeExit(e *execution) {
	if e.state.Finished() {
		return
	}
	for _, s := range e.streams {
		if s != nil && s.fd >= 0 {
			r.drain(e, s)
		}
	}
}

// keep appends chunk to s's kept output and sends it to e's followers.
// chunk may alias the loop's read buffer: notify encodes before it returns.
func (r *Reactor) keep(e *execution, s *stream, chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	off := s.kept.total
	s.kept.write(chunk)
	e.sawOutput()
	if s.spool.working() {
		s.spool.write(chunk, s.kept)
		if !s.spool.working() {
			r.log.Warn().Err(s.spool.err).Str("exec_id", e.id).Str("stream", s.name).
				Msg("spool: abandoned; a crash of corrald would lose what is read from now on")
			s.respoolAt = time.Now().Add(respoolEvery)
		}
	} else if !s.respoolAt.IsZero() {
		r.respool(e, s) // from the kept output, which has chunk
	}
	if len(e.followers) > 0 {
		note := api.OutputNotification{ID: e.id, Stream: s.name, Offset: off, Data: chunk}
		for f := range e.followers {
			f.notify(api.NotifyOutput, note)
		}
	}
	r.wakeParked(e, s)
}

func (r *Reactor) closeStream(e *execution, s *stream) {
	if s.fd < 0 {
		return
	}
	if s.red != nil {
		r.keep(e, s, s.red.Flush()) // what was held back at EOF
	}
	if s.tty {
		r.closeTerminal(e) // hangs up the terminal
	} else {
		if err := r.loop.Remove(s.fd); err != nil {
			r.log.Debug().Err(err).Str("exec_id", e.id).Msg("unwatch output pipe")
		}
		unix.Close(s.fd)
	}
	s.fd = -1
	r.wakeParked(e, s) // EOF
}

// writeStdin queues data for the child's stdin. Loop goroutine only.
func (r *Reactor) writeStdin(e *execution, data []byte, closeIt bool) (int, error) {
	if e.tty != nil {
		return r.writeTerminal(e, data, closeIt)
	}
	in := e.stdin
	switch {
	case e.params.TTY:
		return 0, api.Errorf(api.CodeInvalidParams, "id: execution is still starting; retry")
	case in == nil:
		return 0, api.Errorf(api.CodeInvalidParams, "id: execution was not started with stdin_open")
	case in.err != nil:
		return 0, api.Errorf(api.CodeInvalidParams, "stdin: %v", in.err)
	case in.fd < 0 || in.closeAfter:
		if len(data) == 0 && closeIt {
			return 0, nil // closing twice is fine
		}
		return 0, api.Errorf(api.CodeInvalidParams, "stdin: already closed")
	case len(in.buf)+len(data) > maxStdinBuffer:
		return 0, api.Errorf(api.CodeInvalidParams, "data: %d bytes already queued for stdin; retry later", len(in.buf))
	}
	in.buf = append(in.buf, data...)
	in.closeAfter = closeIt
	r.flushStdin(e)
	return len(data), nil
}

// writeAvailable writes as much of buf to the non-blocking fd as it takes
// now and returns the rest. err is a write error (an errno) other than
// EINTR and EAGAIN. Both stdin and a terminal are written through it.
func writeAvailable(fd int, buf []byte) ([]byte, error) {
	for len(buf) > 0 {
		n, err := unix.Write(fd, buf)
		if n > 0 {
			buf = buf[n:]
		}
		switch {
		case err == unix.EINTR:
		case err == unix.EAGAIN, err == nil && n == 0:
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
	return buf, nil
}

// flushStdin writes what it can without blocking; the rest waits for the
// pipe to become writable.
func (r *Reactor) flushStdin(e *execution) {
	in := e.stdin
	if in.fd < 0 {
		return
	}
	var err error
	if in.buf, err = writeAvailable(in.fd, in.buf); err != nil {
		in.err = fmt.Errorf("write: %w", err)
		in.buf = nil
		r.closeStdin(e)
		return
	}
	if len(in.buf) > 0 {
		// The pipe is full: go on when it is writable.
		if !in.watching {
			if aerr := r.loop.Add(in.fd, eventloop.Writable, func(eventloop.Events) { r.flushStdin(e) }); aerr == nil {
				in.watching = true
			}
		}
		return
	}
	if in.closeAfter {
		r.closeStdin(e)
	} else if in.watching {
		_ = r.loop.Remove(in.fd)
		in.watching = false
	}
}

func (r *Reactor) closeStdin(e *execution) {
	in := e.stdin
	if in.fd < 0 {
		return
	}
	if in.watching {
		_ = r.loop.Remove(in.fd)
		in.watching = false
	}
	unix.Close(in.fd)
	in.fd = -1
	in.closeAfter = true
	r.unparkFds(e, RoleStdin) // a stored copy would keep the child's stdin open
}
