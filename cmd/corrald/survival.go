package main

// Surviving corrald itself (docs/corrald.md, "Restarts and upgrades"): what
// the daemon takes over at start (after a handover or a crash), and the
// handover on SIGHUP.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/systemd"
)

// handoverFile is where a handover leaves, in the state directory, what
// only the old image's memory held (reactor.HandoverExec per execution).
const handoverFile = "handover.json"

// survival is what this start has to take over, and what this host
// supports.
type survival struct {
	passed   systemd.Passed
	handover map[string]reactor.HandoverExec // what a handover left; nil: none
	// fromHandover: this image was exec'd by a handover.
	fromHandover bool
	info         api.SurvivalInfo
	// byID are the passed fds of executions: id -> role -> fd.
	byID map[string]map[string]int
	// adopt are the unfinished records taken over; lost says why the
	// others could not be.
	adopt []reactor.Adoptee
	// neverRan are the started records whose command was never let run:
	// their shim's exec-error pipe says so (reactor.RoleExec), or (where
	// every start is parked before it may run, see plan) nothing was
	// parked and nothing is in the scope the backend names for them. They
	// end start_failed, not lost.
	neverRan map[string]bool
	// undecided are the started records whose shim had neither exec'd nor
	// failed within execFates' wait: whether the command ran cannot be
	// told.
	undecided map[string]bool
	// ran are the started records whose shim exec'd the command (its
	// exec-error pipe says so).
	ran map[string]bool
	// execWait bounds execFates' wait; 0: 3 s. fdRemove takes a name out
	// of the fd store; nil: systemd.Remove. (Both for tests.)
	execWait time.Duration
	fdRemove func(name string)
}

// takeSurvival reads what was passed to this process and what the host
// supports. It runs first: the fds must be claimed before anything opens
// its own.
func takeSurvival(ctx context.Context, c *config, log zerolog.Logger) *survival {
	sv := &survival{byID: map[string]map[string]int{}}
	fromHandover := os.Getenv(systemd.HandoverEnv) != ""
	p, err := systemd.TakePassed()
	if err != nil {
		log.Warn().Err(err).Msg("passed fds")
	}
	sv.passed = p
	for name, fds := range p.Fds {
		id, role, ok := reactor.SplitFdName(name)
		if !ok || len(fds) == 0 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		for _, extra := range fds[1:] { // stored twice: one is enough
			unix.Close(extra)
		}
		if sv.byID[id] == nil {
			sv.byID[id] = map[string]int{}
		}
		sv.byID[id][role] = fds[0]
	}
	sv.passed.Fds = nil // owned by byID now
	// A handover's state: this image's own, or that of a handover whose new
	// image died before it read it (systemd restarted corrald since: the
	// crash path, with the memory-only state still good).
	path := filepath.Join(c.stateDir, handoverFile)
	if b, err := os.ReadFile(path); err == nil {
		sv.handover = map[string]reactor.HandoverExec{}
		if err := json.Unmarshal(b, &sv.handover); err != nil {
			log.Error().Err(err).Str("file", path).Msg("handover: state of the previous image")
		}
		os.Remove(path)
	} else if fromHandover {
		log.Error().Err(err).Msg("handover: state of the previous image")
	}
	sv.fromHandover = fromHandover
	// Survival needs pidfds and durable records to match the fds to.
	sv.info.Handover = !c.noPidfd && c.storeKind != "memory"
	sv.info.PidfdExitInfo = !c.noPidfdExitInfo && reactor.ProbePidfdExitInfo()
	if !c.noFdStore && sv.info.Handover {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := systemd.FdStoreCapacity(cctx)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("fd store: cannot tell its capacity; a crash of corrald will end running executions")
		}
		sv.info.FdStore = n > 0
		if n > 0 && c.maxRunning > 0 && n < 4*c.maxRunning {
			log.Warn().Int("fd_store_max", n).Int("max_running", c.maxRunning).
				Msg("fd store: FileDescriptorStoreMax= is below 4 per --max-running; some executions would not survive a crash")
		}
	}
	return sv
}

// lockScopes takes the backend's lock on its cgroup base or slice (see
// scope.Locker): a second corrald with another state directory stops here
// instead of sweeping the first one's scopes. The lock lives until the
// process exits or execs.
func lockScopes(backend scope.Backend) (io.Closer, error) {
	l, ok := backend.(scope.Locker)
	if !ok {
		return io.NopCloser(nil), nil
	}
	return l.Lock()
}

// plan decides, for every unfinished record, whether it is adopted (its
// pidfd was passed back, or it only had its cleanup left and its kept
// output is spooled) or lost, and why.
//
// The fds of the records not adopted stay in the fd store until release,
// called once their settled records are durable, so that a second crash
// in between decides the same way again; only their pidfds leave it here,
// first: a restart that found one would adopt a shim that is gone (a
// report read from the exec-error pipe cannot be read twice: the next
// read sees EOF, as if the command had been exec'd).
func (sv *survival) plan(st store.Store, backend scope.Backend, stateDir string, log zerolog.Logger) {
	recs, err := st.Unfinished()
	if err != nil {
		log.Error().Err(err).Msg("survival: read unfinished records")
		return
	}
	sv.neverRan = map[string]bool{}
	sv.undecided = map[string]bool{}
	sv.ran = map[string]bool{}
	// A shim still starting the command at the crash (held before its
	// release, or taking a pooled dispatch): its exec-error pipe tells
	// whether it ran it (reactor.RoleExec). All are waited for at once.
	pipes := map[string]int{}
	for _, rec := range recs {
		if xfd, ok := sv.byID[rec.ID][reactor.RoleExec]; ok && rec.State == api.StateStarted {
			pipes[rec.ID] = xfd
		}
	}
	wait := sv.execWait
	if wait == 0 {
		wait = 3 * time.Second
	}
	fates := execFates(pipes, wait)
	// "Nothing parked and an empty scope: never ran" holds only where every
	// start is parked before its command may run: the fd store is on and
	// the backend places held children (scope.PlaceHeld). Without an fd
	// store nothing is ever parked; at clone (cgroup) a command is parked
	// only after it started; a pooled command runs in its pool entry's
	// scope, not the one ScopeOf names for its id.
	parkedFirst := sv.info.FdStore && backend.Placement() == scope.PlaceHeld
	for _, rec := range recs {
		fds := sv.byID[rec.ID]
		_, hasPidfd := fds[reactor.RolePidfd]
		if xfd, ok := fds[reactor.RoleExec]; ok {
			// Of a started record it stays stored until the record is
			// taken over, or settled (release).
			if rec.State == api.StateStarted {
				switch fates[rec.ID] {
				case fateRan:
					// Without its pidfd it cannot be taken over: lost.
					sv.ran[rec.ID] = true
				case fateNeverRan:
					hasPidfd = false // the shim is gone
					sv.neverRan[rec.ID] = true
				default:
					hasPidfd = false // lost: it may have run (its scope is killed)
					sv.undecided[rec.ID] = true
				}
			} else { // past its start
				delete(fds, reactor.RoleExec)
				sv.remove(reactor.FdName(rec.ID, reactor.RoleExec))
				unix.Close(xfd)
			}
		} else if rec.State == api.StateStarted && !hasPidfd && parkedFirst {
			// Not parked, or not all of it (a shim's start parks before its
			// release or dispatch, the pidfd last): the command was let run
			// only if its scope holds a process; a held child that was never
			// released aborted when corrald died.
			if so, ok := backend.(scope.ScopeOf); ok {
				if name := so.ScopeOf(rec.ID, 0); name != "" && !so.Populated(name) {
					sv.neverRan[rec.ID] = true
				}
			}
		}
		adopt := false
		switch rec.State {
		case api.StateRunning, api.StateCanceling:
			adopt = hasPidfd
		case api.StateStarted:
			// Let run, its fds parked, but no running record yet: taken
			// over as running, its pid and scope from the pidfd and the
			// backend (named here so the leftover sweep keeps the scope).
			adopt = hasPidfd
			if adopt {
				rec.PID, rec.Scope = reactor.StartedScope(backend, rec, fds)
			}
		case api.StateExited:
			// Only its cleanup was left (or under way at a handover). A
			// spool of either stream holds output the record may not carry
			// (the other stream's spool could not be opened, and it stayed
			// quiet).
			_, err := os.Stat(filepath.Join(reactor.SpoolDir(stateDir), rec.ID+".stdout"))
			if err != nil {
				_, err = os.Stat(filepath.Join(reactor.SpoolDir(stateDir), rec.ID+".stderr"))
			}
			_, handed := sv.handover[rec.ID]
			adopt = len(fds) > 0 || err == nil || handed
		}
		if !adopt {
			continue
		}
		var p api.StartParams
		if b, ok, err := st.Params(rec.ID); err != nil || !ok || json.Unmarshal(b, &p) != nil {
			log.Warn().Err(err).Str("exec_id", rec.ID).Msg("survival: no stored params; the execution is lost")
			continue
		}
		if xfd, ok := fds[reactor.RoleExec]; ok { // exec'd: the pipe has no more to say
			delete(fds, reactor.RoleExec)
			sv.remove(reactor.FdName(rec.ID, reactor.RoleExec))
			unix.Close(xfd)
		}
		a := reactor.Adoptee{Record: rec, Params: p, Fds: fds}
		if he, ok := sv.handover[rec.ID]; ok {
			a.Handover = &he
		}
		delete(sv.byID, rec.ID)
		sv.adopt = append(sv.adopt, a)
	}
	// Fds of executions nobody will adopt: their pidfds out of the store
	// now, the rest by release.
	for id, fds := range sv.byID {
		if fd, ok := fds[reactor.RolePidfd]; ok {
			sv.remove(reactor.FdName(id, reactor.RolePidfd))
			unix.Close(fd)
			delete(fds, reactor.RolePidfd)
		}
	}
}

// release takes the fds of the executions not adopted out of the fd store
// and closes them, once their settled records are durable (settled false:
// they may not be; the fds stay stored for the next start to decide).
func (sv *survival) release(settled bool) {
	for id, fds := range sv.byID {
		for role, fd := range fds {
			if settled {
				sv.remove(reactor.FdName(id, role))
			}
			unix.Close(fd)
		}
	}
	sv.byID = nil
}

// remove takes name out of the fd store.
func (sv *survival) remove(name string) {
	if sv.fdRemove != nil {
		sv.fdRemove(name)
		return
	}
	_, _ = systemd.Remove(name)
}

// fate is what a shim's exec-error pipe says of its command.
type fate int

const (
	fateUnknown  fate = iota // neither exec'd nor failed within the wait
	fateRan                  // EOF without a report: exec'd
	fateNeverRan             // a report: nothing ran
)

// execFates reads the shims' exec-error pipes (reactor.RoleExec, by id)
// passed back after a crash while they were starting their commands,
// waiting up to d in all for the shims to get that far: each exec'd the
// command (EOF without a report: ran), or ran nothing (a report: never
// released or dispatched, shim.OpParentGone, or its exec failed), or
// neither within d (unknown: the shim still sets up, or hangs).
func execFates(pipes map[string]int, d time.Duration) map[string]fate {
	out := make(map[string]fate, len(pipes))
	pending := make(map[string]int, len(pipes))
	for id, fd := range pipes {
		pending[id] = fd
	}
	deadline := time.Now().Add(d)
	for {
		for id, fd := range pending {
			rep, err := shim.ReadExecError(fd)
			switch {
			case err == nil && rep == nil:
				out[id] = fateRan
			case err == nil:
				out[id] = fateNeverRan
			case !errors.Is(err, shim.ErrPending):
				out[id] = fateUnknown
			default:
				continue
			}
			delete(pending, id)
		}
		left := time.Until(deadline)
		if len(pending) == 0 || left <= 0 {
			return out
		}
		pfds := make([]unix.PollFd, 0, len(pending))
		for _, fd := range pending {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		_, _ = unix.Poll(pfds, int(min(left, 100*time.Millisecond).Milliseconds())+1)
	}
}

// adopted reports whether the record id is being adopted.
func (sv *survival) adopted(id string) bool {
	for _, a := range sv.adopt {
		if a.Record.ID == id {
			return true
		}
	}
	return false
}

// keepScope tells the leftover sweep which scopes hold adopted executions
// (by the name the backend lists: a cgroup's directory, a unit's name).
func (sv *survival) keepScope(name string) bool {
	for _, a := range sv.adopt {
		if s := a.Record.Scope; s != "" && (s == name || filepath.Base(s) == name) {
			return true
		}
	}
	return false
}

// lostWhy is the error of a record that could not be adopted: what made
// survival impossible.
func (sv *survival) lostWhy(rec api.Record) string {
	switch {
	case sv.neverRan[rec.ID]:
		return reactor.StartFailedRestart
	case rec.State == api.StateStarted && sv.ran[rec.ID]:
		return "corrald restarted while the execution was starting, after its shim exec'd the command, and its pidfd was not in the fd store to take it over; its scope was killed"
	case rec.State == api.StateStarted && sv.undecided[rec.ID]:
		return "corrald restarted while its shim was starting the command, which neither ran nor failed in the 3 s waited for it and may have run; its scope was killed"
	case rec.State == api.StateStarted:
		return "corrald restarted while the execution was starting, after its command may have been let run; its scope was killed"
	case sv.fromHandover:
		return "corrald was upgraded in place (handover) but the execution's fds were not handed over"
	case !sv.info.FdStore:
		return "corrald restarted while the execution ran, and nothing kept it across the restart: there is no fd store (corrald is not a systemd service with FileDescriptorStoreMax=), so a crash ends running executions"
	}
	return "corrald restarted while the execution ran, and its fds were not in the fd store"
}

// sdFdStore is systemd's fd store, for the reactor.
type sdFdStore struct{}

func (sdFdStore) Store(name string, fd int) error {
	_, err := systemd.Store(name, fd)
	return err
}

func (sdFdStore) Remove(name string) error {
	_, err := systemd.Remove(name)
	return err
}

// handover execs the binary now on disk in place, handing over every
// execution and the listening socket (systemctl reload). If the exec
// fails, the old image carries on and the error is returned; on success it
// does not return.
func handover(c *config, r *reactor.Reactor, ln *net.UnixListener, activated bool, log zerolog.Logger) error {
	if c.noPidfd || c.storeKind == "memory" {
		// Without pidfds, or records to match them to, nothing could be
		// taken over: a reload changes nothing then.
		return errors.New("handover: unavailable under --no-pidfd or --store memory; not reloading")
	}
	systemd.Reloading()
	defer systemd.Ready() // reached only when the old image carries on
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("handover: own binary: %w", err)
	}
	lfd := -1
	if rc, err := ln.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { lfd = int(fd) })
	}
	if lfd < 0 {
		return errors.New("handover: no fd for the listening socket")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log.Info().Str("event", "handover").Str("binary", exe).Int("running", r.Running()).Msg("handing over to the binary on disk")
	return r.Handover(ctx, 10*time.Second, func(h reactor.Handover) error {
		name := systemd.ListenerName
		if activated {
			name = systemd.SocketName
		}
		h.Fds[lfd] = name
		b, err := json.Marshal(h.Execs)
		if err != nil {
			return fmt.Errorf("handover: %w", err)
		}
		path := filepath.Join(c.stateDir, handoverFile)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return fmt.Errorf("handover: %w", err)
		}
		env := make([]string, 0, len(os.Environ())+1)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, systemd.HandoverEnv+"=") {
				env = append(env, kv)
			}
		}
		env = append(env, systemd.HandoverEnv+"="+systemd.HandoverValue(h.Fds))
		// fd store messages systemd has not read yet wait in this image's
		// memory (systemd.notifier): the exec would drop them.
		if !systemd.FlushNotify(5 * time.Second) {
			log.Warn().Msg("handover: fd store messages still unread by systemd are dropped by the exec; those executions would not survive a crash")
		}
		// The log entries still queued for the journal (systemd.JournalWriter)
		// die with this image too.
		systemd.FlushJournal(2 * time.Second)
		// The watchdog runs on through a reload: the new image's first
		// ping comes once its loop runs, so this one, right before the
		// exec (after the flushes, which may take seconds with journald
		// stalled), covers the exec and its start-up (without it, the last
		// ping up to WatchdogSec/2 ago plus a handover slowed by load
		// passed WatchdogSec: systemd aborted the new image right after it
		// took over).
		systemd.Watchdog()
		err = execKeeping(h.Fds, func() error { return syscall.Exec(exe, os.Args, env) }, log)
		// Still here: exec failed before it replaced the image.
		os.Remove(path)
		return fmt.Errorf("handover: exec %s: %w", exe, err)
	})
}

// execKeeping runs exec (syscall.Exec) with fds' close-on-exec flag
// cleared, so that they reach the next image, and sets it again if exec
// returns. The window in which they are inheritable holds syscall.ForkLock
// for reading, as Go requires of code that makes an fd without atomic
// close-on-exec: every fork of the process (os/exec, os.StartProcess:
// syscall.forkExec takes ForkLock for writing) waits until exec has
// replaced the image, or failed and the flags are back. Without it, a
// child forked in the window (one outside the reactor's hold on its own
// forks) inherited the listening socket and every execution's fds. Taking
// the lock waits only for forks already under way, and nothing slow runs
// while it is held (the flushes to systemd and journald come before).
func execKeeping(fds map[int]string, exec func() error, log zerolog.Logger) error {
	failed := map[int]error{}
	syscall.ForkLock.RLock()
	for fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			failed[fd] = err
		}
	}
	err := exec()
	for fd := range fds {
		unix.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	for fd, ferr := range failed {
		log.Warn().Err(ferr).Int("fd", fd).Str("name", fds[fd]).Msg("handover: clear close-on-exec")
	}
	return err
}

// killLeftoverPgroup kills what is left of a lost execution's process group
// ("pgid:<n>") under the pgroup backend, which has no scope that outlives
// the daemon: every process still in group n that started no earlier than
// the execution (a group id is a pid, and pids are reused).
func killLeftoverPgroup(rec api.Record) {
	n, ok := strings.CutPrefix(rec.Scope, "pgid:")
	pgid, err := strconv.Atoi(n)
	if !ok || err != nil || pgid <= 1 || rec.StartedAt == nil {
		return
	}
	boot := bootTime()
	if boot.IsZero() {
		return
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		// After ")": state(0) ppid(1) pgrp(2) ... starttime(19).
		if len(f) < 20 {
			continue
		}
		g, _ := strconv.Atoi(f[2])
		ticks, _ := strconv.ParseInt(f[19], 10, 64)
		started := boot.Add(time.Duration(ticks) * (time.Second / 100))
		if g == pgid && !started.Before(rec.StartedAt.Add(-time.Second)) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// bootTime is the kernel's boot time (btime in /proc/stat).
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}
