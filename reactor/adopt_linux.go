package reactor

// Re-adoption: a corrald that starts after a handover (the previous image
// exec'd this one, same pid) or after a crash (systemd restarted it and
// passed back the fd store) takes over the executions the previous image
// ran, instead of recording them lost. What it needs and where it comes
// from:
//
//   - the record and the exec.start params: the store;
//   - the pidfd, the output read ends and the stdin write end: passed fds
//     named "<id>.<role>" (the fd store, or the handover's own list);
//   - the kept output: the spool files (adopt_spool_linux.go), written as
//     the output was read (crash) or at the handover; of an exited record,
//     the store's copy where a stream has no spool, or an abandoned one
//     (the exited record carries it then: recordOutputs);
//   - deadlines: absolute, from started_at + timeout_ms in the record;
//   - what only memory held (a pending cancel's outcome, stdin still
//     queued): the handover's state, absent after a crash.
//
// The exit status: a child of this process (handover) is waited for as
// always. A child reparented while corrald was down (crash) is someone
// else's to reap; its pidfd still turns readable when it exits, and once
// it is reaped the kernel tells its status (PIDFD_INFO_EXIT). Where it
// cannot, the execution ends lost and its error says why.

import (
	"context"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/redact"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
)

// Adoptee is one execution to take over at start.
type Adoptee struct {
	Record api.Record
	Params api.StartParams
	// Fds are the execution's passed fds by role. The reactor owns them
	// from New on (it closes those it does not use).
	Fds map[string]int
	// Handover is the state a handover wrote for it; nil after a crash.
	Handover *HandoverExec
	// stored is the store's kept output of an exited record, by stream
	// (nil: none), read by prepareAdoptions off the loop.
	stored [2]*store.KeptOutput
}

// HandoverExec is what of an execution only the previous image's memory
// held.
type HandoverExec struct {
	Pending    api.Outcome `json:"pending,omitempty"`
	Hard       bool        `json:"hard,omitempty"`
	Stdin      []byte      `json:"stdin,omitempty"`
	StdinClose bool        `json:"stdin_close,omitempty"`
	Raw        [2]int64    `json:"raw"` // bytes the child wrote, per stream, when redacting
	Spooled    bool        `json:"spooled"`
}

// LostNoPidfdExit is the error of an adopted execution whose main process
// was reaped by someone else on a kernel that does not keep its status.
const LostNoPidfdExit = "corrald restarted while the execution ran; its main process exited meanwhile and was reaped by another process, and this kernel does not keep the exit status for its pidfd (PIDFD_INFO_EXIT, Linux >= 6.15)"

// prepareAdoptions builds the executions of cfg.Adopt before the loop runs:
// their scopes (a D-Bus round trip under systemd: not on the loop) and their
// processes. It returns the pids to register as main processes.
func (r *Reactor) prepareAdoptions() []int {
	var pids []int
	ad, _ := r.cfg.Backend.(scope.Adopter)
	for i := range r.cfg.Adopt {
		a := &r.cfg.Adopt[i]
		rec := a.Record
		e := &execution{
			id: rec.ID, owner: rec.Owner, params: a.Params,
			state: rec.State, rec: rec, pidfd: -1, committed: rec.State,
			waiters:   make(map[chan waitAnswer]struct{}),
			followers: make(map[*follower]struct{}),
		}
		if rec.Workspace != nil {
			e.work = *rec.Workspace
		}
		if rec.State == api.StateExited {
			// The exited record carries the kept output where a spool
			// did not keep it (recordOutputs); readopt chooses.
			for i, name := range []string{RoleStdout, RoleStderr} {
				k, ok, err := r.store.Output(rec.ID, name)
				if err != nil {
					r.log.Warn().Err(err).Str("exec_id", rec.ID).Str("stream", name).Msg("adopt: read the stored output")
				}
				if ok {
					a.stored[i] = &k
				}
			}
		}
		if rec.State == api.StateStarted {
			// corrald died after the command was let run (spawn had parked
			// its fds) but before the running record: that record names
			// the pid and the scope; here they come from the pidfd and the
			// backend (StartedScope).
			rec.PID, rec.Scope = StartedScope(r.cfg.Backend, rec, a.Fds)
			a.Record.PID, a.Record.Scope = rec.PID, rec.Scope
			e.rec.PID, e.rec.Scope = rec.PID, rec.Scope
		}
		if rec.Scope != "" && ad != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			sc, err := ad.Adopt(ctx, rec.Scope, scope.Limits{MemoryBytes: a.Params.MemoryBytes, TasksMax: a.Params.TasksMax, CPUMS: a.Params.CPUMS})
			cancel()
			if err != nil {
				r.log.Warn().Err(err).Str("exec_id", rec.ID).Str("scope", rec.Scope).Msg("adopt: cannot take over the scope; the tree cannot be killed as a whole")
			}
			e.sc = sc
		}
		if fd, ok := a.Fds[RolePidfd]; ok && rec.PID > 0 {
			// The pid may be another process's by now: trust it only if it
			// is the one behind the pidfd.
			if p, err := os.FindProcess(rec.PID); err == nil && sameProcess(p, fd) {
				e.proc = p
				pids = append(pids, rec.PID)
			}
		}
		r.execs[e.id] = e
		r.running++
		r.perUID[e.owner.UID]++
		r.total.Add(1)
		r.adopted++
	}
	r.runningAt.Store(int64(r.running))
	return pids
}

// Sync returns once the loop has run everything posted before it: after
// New, the re-adoption of cfg.Adopt (the daemon says READY=1 after it).
func (r *Reactor) Sync(ctx context.Context) error { return r.onLoop(ctx, func() {}) }

// readoptAll takes every prepared execution into the loop. Loop goroutine;
// the first thing the loop runs.
func (r *Reactor) readoptAll() {
	for i := range r.cfg.Adopt {
		a := &r.cfg.Adopt[i]
		if e := r.execs[a.Record.ID]; e != nil {
			r.readopt(e, a)
		}
	}
	r.cfg.Adopt = nil
}

// readopt takes e over: pipes, stdin, pidfd, timers, then carries on from
// the state its record is in. Loop goroutine only.
func (r *Reactor) readopt(e *execution, a *Adoptee) {
	fds := a.Fds
	ho := a.Handover
	// The roles passed back, for the audit line: one missing says where
	// an adopted execution's output or exit went.
	roles := make([]string, 0, len(fds))
	for role := range fds {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	take := func(role string) int {
		fd, ok := fds[role]
		if !ok {
			return -1
		}
		delete(fds, role)
		return fd
	}
	e.rec.Adopted++
	// An exited record came from the store: durable.
	e.exitDurable = a.Record.State == api.StateExited
	if r.cfg.FdStore != nil {
		// Still in the store from before; which of them exactly the
		// earlier image did not say, so all roles of its kind.
		e.parked = []string{RolePidfd, RoleStdout, RoleStderr, RoleStdin}
		if e.params.TTY {
			e.parked = []string{RolePidfd, RoleStderr, RolePTY}
		}
	}
	for i, role := range []string{RoleStdout, RoleStderr} {
		s := &stream{name: role, fd: take(role)}
		if e.params.TTY && i == 0 {
			// The terminal's output is the stdout stream (watched below).
			s.fd = take(RolePTY)
		}
		st := [2]api.StreamInfo{e.rec.Stdout, e.rec.Stderr}[i]
		s.kept = newKeptOutput(e.params.OutputLimitBytes)
		spooled := false
		path := ""
		if r.cfg.StateDir != "" {
			var err error
			path = spoolPath(r.cfg.StateDir, e.id, role)
			if s.kept, spooled, err = readSpool(path, e.params.OutputLimitBytes); err != nil {
				r.log.Warn().Err(err).Str("exec_id", e.id).Msg("adopt: kept output")
			}
		}
		ok, fromStore := spooled, false
		if k := a.stored[i]; k != nil && preferStored(k.Total, spooled, s.kept) {
			s.kept, ok, spooled = keptFromStore(*k, e.params.OutputLimitBytes, st.Truncated), true, false
			fromStore = true
		}
		if spooled && r.spooling() && s.fd >= 0 {
			var err error
			if s.spool, err = reopenSpool(path, s.kept); err != nil {
				r.log.Warn().Err(err).Str("exec_id", e.id).Msg("adopt: reopen spool")
			}
		}
		if !ok {
			// Nothing kept survived: the counts of the record are all that
			// is known of what was read before.
			s.kept.total = st.TotalBytes
		}
		if e.params.Redact {
			s.red = redact.New()
			s.raw = s.kept.total
			switch {
			case ho != nil && ho.Raw[i] > 0:
				s.raw = ho.Raw[i]
			case fromStore:
				// The exited record counts what the child wrote (raw) up
				// to the same moment as the stored output.
				s.raw = st.TotalBytes
			}
		}
		if s.spool == nil && s.fd >= 0 && r.spooling() {
			s.spool = r.openSpool(e, s)
		}
		e.streams[i] = s
		if e.params.TTY && i == 0 && s.fd >= 0 {
			_ = unix.SetNonblock(s.fd, true)
			size := api.TTYSize{Rows: api.DefaultTTYRows, Cols: api.DefaultTTYCols}
			if e.rec.TTYSize != nil {
				size = *e.rec.TTYSize
			} else if e.params.TTYSize != nil {
				size = *e.params.TTYSize
			}
			r.watchTerminal(e, s.fd, s, size)
			if ho != nil && len(ho.Stdin) > 0 && e.tty != nil {
				e.tty.buf = append(e.tty.buf, ho.Stdin...)
				r.flushTerminal(e)
			}
			continue
		}
		if s.fd >= 0 {
			_ = unix.SetNonblock(s.fd, true)
			if err := r.loop.Add(s.fd, eventloop.Readable, func(eventloop.Events) { r.drain(e, s) }); err != nil {
				r.log.Error().Err(err).Str("exec_id", e.id).Msg("adopt: watch output pipe")
				unix.Close(s.fd)
				s.fd = -1
			}
		}
	}
	if !e.params.TTY && (e.params.StdinOpen || len(e.params.Stdin) > 0) {
		e.stdin = &stdinPipe{fd: take(RoleStdin)}
		switch {
		case e.stdin.fd < 0:
			e.stdin.closeAfter = true
		case ho != nil:
			e.stdin.buf, e.stdin.closeAfter = ho.Stdin, ho.StdinClose
			_ = unix.SetNonblock(e.stdin.fd, true)
			r.flushStdin(e)
		case !e.params.StdinOpen:
			// Given stdin whose writing a crash interrupted: how much got
			// through is unknown; end it rather than write it twice.
			r.closeStdin(e)
		default:
			_ = unix.SetNonblock(e.stdin.fd, true)
		}
	}
	pidfd := take(RolePidfd)
	if ho == nil && pidfd >= 0 && !e.state.Finished() && !e.params.TTY {
		for _, s := range e.streams {
			if s != nil && s.fd < 0 {
				// After a crash (a handover passes only the open ones): the
				// pidfd is parked after the pipes, so only a store
				// that dropped one (full?) comes here.
				r.log.Warn().Str("exec_id", e.id).Str("stream", s.name).Msg("adopt: the output pipe was not passed back; what the command writes to it is lost (and may kill it with SIGPIPE)")
			}
		}
	}
	for role, fd := range fds { // roles this version does not know
		r.log.Warn().Str("exec_id", e.id).Str("role", role).Msg("adopt: closing a passed fd of unknown role")
		unix.Close(fd)
	}
	ev := r.audit(e, "adopted").Stringer("state", e.state).Int("adopted", e.rec.Adopted).
		Bool("handover", ho != nil).Strs("roles", roles).Int64("stdout_bytes", e.streams[0].kept.total)
	ev.Msg("execution adopted")

	from := e.state
	switch e.state {
	case api.StateExited:
		// Exited before the restart; only the cleanup was left.
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		r.persist(e, e.state, r.snapshot(e), nil)
		r.startCleanup(e, false)
		return
	case api.StateRunning, api.StateCanceling:
	case api.StateStarted:
		// The command was let run and its fds parked (parkSpawned), but
		// corrald died before its running record: taken over as running
		// below once its pidfd is watched.
		if pidfd < 0 {
			r.toExited(e, exitResult{lost: "corrald restarted while the execution was starting"})
			return
		}
	default:
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		r.toExited(e, exitResult{lost: "corrald restarted while the execution was starting"})
		return
	}
	if pidfd < 0 {
		r.toExited(e, exitResult{lost: "corrald restarted while the execution ran and its pidfd was not passed back"})
		return
	}
	e.pidfd = pidfd
	if err := r.loop.Add(e.pidfd, eventloop.Readable, func(eventloop.Events) { r.reapAdopted(e, time.Now()) }); err != nil {
		r.log.Error().Err(err).Str("exec_id", e.id).Msg("adopt: watch pidfd")
		r.toExited(e, exitResult{lost: fmt.Sprintf("adopt: cannot watch the pidfd: %v", err)})
		return
	}
	if from == api.StateStarted {
		r.toRunningAdopted(e)
	}
	r.persist(e, from, r.snapshot(e), nil)
	if e.state == api.StateCanceling {
		r.resumeCanceling(e, cancelRequest{why: r.pendingOutcome(e, ho), hard: true, reason: e.rec.CancelReason})
		return
	}
	// Running: the deadline is absolute; one that passed while corrald was
	// down fires now. The idle limit counts from the adoption (when the
	// last byte came is not stored).
	switch {
	case e.rec.Deadline != nil:
		e.deadline = *e.rec.Deadline
	case e.rec.StartedAt != nil:
		e.deadline = e.rec.StartedAt.Add(time.Duration(e.params.TimeoutMS) * time.Millisecond)
	default:
		e.deadline = time.Now().Add(time.Duration(e.params.TimeoutMS) * time.Millisecond)
	}
	r.armDeadline(e)
	r.armIdle(e)
	if needsSampler(e) {
		r.armSampler(e, 0)
	}
}

// preferStored reports whether a stream's kept output is taken from the
// exited record's copy, of stored bytes, rather than from its spool, sp
// (spooled: there is one to go on with). The store's copy is the whole of
// what was read before the record; the spool wins where it counts more
// (output read after the record, the pipes being drained a bounded time
// before it), even abandoned: its bytes are served with the record saying
// truncated, where the store's copy would say whole what misses bytes. An
// abandoned spool that counts no more gives way to the store's copy.
func preferStored(stored int64, spooled bool, sp *keptOutput) bool {
	return !spooled || stored > sp.total || sp.lost && stored >= sp.total
}

// keptFromStore is the kept output of a stream keeping limit bytes as the
// store gave it back; truncated is what the record says of the stream (a
// kept output that missed bytes, keptOutput.lost, is not told by the
// store's counts).
func keptFromStore(ko store.KeptOutput, limit int64, truncated bool) *keptOutput {
	k := newKeptOutput(limit)
	k.write(ko.Head)
	k.total = max(k.total, ko.TailOffset)
	k.write(ko.Tail)
	k.total = max(k.total, ko.Total)
	k.lost = truncated && !k.truncated()
	return k
}

// StartedScope is the pid and the scope of a started record's execution
// whose pidfd came back (fds[RolePidfd]): the pid behind the pidfd (0 once
// it was reaped), and the scope the backend names for it (scope.ScopeOf:
// the pid's own while it lives, else the one made for the record's id),
// or the record's own when it names them.
func StartedScope(b scope.Backend, rec api.Record, fds map[string]int) (pid int, name string) {
	pid, name = rec.PID, rec.Scope
	if fd, ok := fds[RolePidfd]; ok && pid <= 0 {
		if pid = PidfdPid(fd); pid < 0 {
			pid = 0
		}
	}
	if so, ok := b.(scope.ScopeOf); ok && name == "" {
		name = so.ScopeOf(rec.ID, pid)
	}
	return pid, name
}

// pendingOutcome is the outcome an execution that was canceling when
// corrald restarted will have: the handover's, else the one its canceling
// record says, else (a record written before cancel_outcome) the likeliest
// from the record.
func (r *Reactor) pendingOutcome(e *execution, ho *HandoverExec) api.Outcome {
	switch {
	case ho != nil && ho.Pending != "":
		return ho.Pending
	case e.rec.CancelOutcome != "":
		return e.rec.CancelOutcome
	case e.rec.CancelReason != "":
		return api.OutcomeCancelled
	case e.rec.StartedAt != nil && time.Since(*e.rec.StartedAt) >= time.Duration(e.params.TimeoutMS)*time.Millisecond:
		return api.OutcomeTimeout
	case e.params.CPUMS > 0 && e.rec.Usage.CPUUserMS+e.rec.Usage.CPUSystemMS >= e.params.CPUMS:
		return api.OutcomeCPULimit
	}
	return api.OutcomeCancelled
}

// killAdopted ends a canceling adopted execution at once: its grace ran
// while corrald was down.
func (r *Reactor) killAdopted(e *execution) {
	if e.proc != nil {
		r.killTree(e)
		return
	}
	r.killScope(e) // a failure is retried by the cleanup, as killTree's
}

// reapAdopted runs when an adopted execution's pidfd is readable. A child
// of this process is waited for; one reparented while corrald was down
// (ECHILD) has its status read from the pidfd once its new parent reaped
// it. Loop goroutine only.
func (r *Reactor) reapAdopted(e *execution, since time.Time) {
	if e.pidfd < 0 || e.state.Finished() {
		return
	}
	if since.IsZero() {
		since = time.Now()
	}
	_ = r.loop.Remove(e.pidfd)
	if e.proc != nil {
		ps, err := e.proc.Wait()
		if err == nil {
			r.reaper.reaped(e.proc.Pid)
			r.reapedPidfd.Add(1)
			unix.Close(e.pidfd)
			e.pidfd = -1
			r.toExited(e, exitResult{ps: ps})
			return
		}
		r.reaper.reaped(e.proc.Pid)
	}
	ws, ok, err := r.pidfdExit(e.pidfd)
	switch {
	case ok:
		unix.Close(e.pidfd)
		e.pidfd = -1
		sws := syscall.WaitStatus(ws)
		r.toExited(e, exitResult{status: &sws})
	case err != nil:
		unix.Close(e.pidfd)
		e.pidfd = -1
		r.toExited(e, exitResult{lost: LostNoPidfdExit})
	case time.Since(since) > r.cfg.KillWait:
		unix.Close(e.pidfd)
		e.pidfd = -1
		r.toExited(e, exitResult{lost: fmt.Sprintf("corrald restarted while the execution ran; its main process exited and was not reaped by its new parent within %v, so its exit status is unknown", r.cfg.KillWait)})
	default:
		// Exited but not reaped yet by its new parent (PID 1, a
		// subreaper): look again shortly.
		r.loop.AfterFunc(10*time.Millisecond, func() { r.reapAdopted(e, since) })
	}
}

// pidfdExit is pidfdExit unless Config.NoPidfdExitInfo forces the path of
// a kernel without PIDFD_INFO_EXIT.
func (r *Reactor) pidfdExit(fd int) (unix.WaitStatus, bool, error) {
	if r.cfg.NoPidfdExitInfo {
		// Still tell "not exited yet" from "exited": a reaped process's
		// pidfd polls POLLHUP too, which is what such a kernel offers.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 0); n > 0 && fds[0].Revents&unix.POLLHUP != 0 {
			return 0, false, errNoPidfdExit
		}
		return 0, false, nil
	}
	return pidfdExit(fd)
}
