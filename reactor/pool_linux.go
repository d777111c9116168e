package reactor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
)

// pool keeps shims already started and placed in scopes of their own, each
// waiting for a command. Creating a scope costs a D-Bus round trip and a
// systemd job under the systemd backend, and starting a shim process costs
// milliseconds anywhere; the pool pays both ahead of time, off the hot path,
// so exec.start only applies the request's limits, hands the command and
// its stdio to a waiting shim, and waits for its exec.
//
// Ownership: one refill goroutine creates entries and discards dead ones;
// take may be called from any goroutine. An entry taken belongs to the
// caller, which dispatches it or discards it.
type pool struct {
	r    *Reactor
	size int

	mu   sync.Mutex
	idle []*pooled

	hits, misses atomic.Int64
	wake         chan struct{}
	stop         chan struct{}
	done         chan struct{}
}

// pooled is one waiting shim in its scope.
type pooled struct {
	id    string // the scope's id: "pool-<uuid>"
	cmd   *exec.Cmd
	h     *shim.Handle
	sc    scope.Scope
	pidfd int // -1 without pidfds
	// dispatched is when the shim was given its command (dispatchPooled):
	// the command's started_at.
	dispatched time.Time
}

func newPool(r *Reactor, size int) *pool {
	p := &pool{r: r, size: size, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// take returns a waiting entry, or nil when the pool is empty (the caller
// then creates a scope inline). Either way the pool refills in the
// background.
func (p *pool) take() *pooled {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	var e *pooled
	if n := len(p.idle); n > 0 {
		e = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if e == nil {
		p.misses.Add(1)
	} else {
		p.hits.Add(1)
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return e
}

func (p *pool) idleCount() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func (p *pool) run() {
	defer close(p.done)
	check := time.NewTicker(time.Second)
	defer check.Stop()
	failures := 0
	for {
		// Fill up, one entry at a time, so a stop is noticed quickly.
		for p.idleCount() < p.size {
			select {
			case <-p.stop:
				return
			default:
			}
			e, err := p.create()
			if err != nil {
				failures++
				p.r.log.Warn().Err(err).Int("failures", failures).Msg("pool: create entry")
				// Back off; exec.start still works inline meanwhile.
				select {
				case <-p.stop:
					return
				case <-time.After(time.Duration(min(failures, 10)) * 500 * time.Millisecond):
				}
				continue
			}
			failures = 0
			p.mu.Lock()
			p.idle = append(p.idle, e)
			p.mu.Unlock()
		}
		select {
		case <-p.stop:
			return
		case <-p.wake:
			// A take just handed a shim its command: creating the next
			// one at once would compete with that command for the CPU on
			// its critical path. Refill a moment later, unless the pool
			// ran dry.
			if p.idleCount() > 0 {
				select {
				case <-p.stop:
					return
				case <-time.After(refillDelay):
				}
			}
		case <-check.C:
			p.replaceDead()
		}
	}
}

// refillDelay is how long the pool waits after a take before it starts a
// replacement shim (see run).
const refillDelay = 25 * time.Millisecond

// create starts a pooled shim in a new scope.
func (p *pool) create() (*pooled, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := &pooled{id: "pool-" + newID(time.Now()), pidfd: -1}
	e.cmd = &exec.Cmd{SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	wrap := shim.WrapPooled
	if p.r.cfg.Backend.Placement() != scope.PlaceHeld {
		// Here the pool serves only commands that need the shim: network
		// "none" ones, and non-root callers'. Make the network namespace
		// ahead (about a millisecond of kernel work off the request's
		// path); a host-network dispatch goes back to the host's.
		wrap = shim.WrapPooledNetNS
	}
	h, err := wrap(e.cmd)
	if err != nil {
		return nil, err
	}
	e.h = h
	pl, err := p.r.startPlaced(ctx, scope.Spec{
		ID: e.id, Argv: []string{"(corral pool)"}, Cmd: e.cmd,
		Limits: scope.Limits{TasksMax: p.r.cfg.Defaults.TasksMax},
	}, h)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("pool: %w", err)
	}
	e.sc, e.pidfd = pl.sc, pl.pidfd
	return e, nil
}

// discard ends an entry that will not run a command: the shim exits when
// its dispatch socket closes; it is reaped here and its scope removed.
func (p *pool) discard(e *pooled) {
	e.h.Close()
	if err := e.sc.Kill(); err != nil {
		p.r.log.Debug().Err(err).Str("scope", e.sc.Name()).Msg("pool: kill discarded scope")
	}
	pl := placed{proc: e.cmd.Process, pidfd: e.pidfd, sc: e.sc}
	p.r.unstart(&pl, e.id)
	e.pidfd = -1
}

// replaceDead drops idle entries whose shim died (killed by someone, OOM);
// the fill loop replaces them.
func (p *pool) replaceDead() {
	p.mu.Lock()
	var dead []*pooled
	alive := p.idle[:0]
	for _, e := range p.idle {
		if e.exited() {
			dead = append(dead, e)
		} else {
			alive = append(alive, e)
		}
	}
	p.idle = alive
	p.mu.Unlock()
	for _, e := range dead {
		p.r.log.Warn().Str("scope", e.sc.Name()).Msg("pool: waiting shim died; replacing it")
		p.discard(e)
	}
}

// exited reports whether the shim has exited, without reaping it.
func (e *pooled) exited() bool {
	if e.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(e.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	}
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, e.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err == nil && info.Signo != 0
}

// close stops refilling and discards the idle entries.
func (p *pool) close() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, e := range idle {
		p.discard(e)
	}
}

// pooled takes a waiting shim for a command that would otherwise start a
// shim of its own (needShim), or returns nil. A pooled shim saves the
// scope and the shim's start-up; but waking it and having a Go process
// exec costs more than os/exec's direct vfork + exec, so a command that
// needs no shim (root, host network, no systemd) starts directly and
// leaves the pool (and its hit and miss counts) alone.
func (r *Reactor) pooled(needShim bool) *pooled {
	if !needShim {
		return nil
	}
	return r.pool.take()
}

// dispatchPooled runs cfg in a pooled shim: it applies the request's
// limits to the entry's scope, hands over the command and its stdio, and
// waits for the exec. On failure before the command could run, the entry
// is discarded and ok is false: the caller starts inline instead. A failed
// exec is a failed start, reported in xerr.
func (r *Reactor) dispatchPooled(e *pooled, cfg shim.Config, lim scope.Limits, stdin, stdout, stderr *os.File) (xerr *shim.ExecError, ok bool) {
	if l, can := e.sc.(scope.Limiter); can && (lim.MemoryBytes != 0 || lim.TasksMax != r.cfg.Defaults.TasksMax) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := l.SetLimits(ctx, lim)
		cancel()
		if err != nil {
			r.log.Warn().Err(err).Str("scope", e.sc.Name()).Msg("pool: set limits; starting inline")
			r.pool.discard(e)
			return nil, false
		}
	}
	devnull := stdin
	if devnull == nil {
		f, err := os.Open(os.DevNull)
		if err != nil {
			r.pool.discard(e)
			return nil, false
		}
		defer f.Close()
		devnull = f
	}
	e.dispatched = time.Now()
	if err := e.h.Dispatch(cfg, devnull, stdout, stderr); err != nil {
		r.log.Warn().Err(err).Str("scope", e.sc.Name()).Msg("pool: dispatch; starting inline")
		r.pool.discard(e)
		return nil, false
	}
	rep, err := e.h.WaitExec(30 * time.Second)
	e.h.Close()
	if err != nil {
		_ = e.cmd.Process.Kill()
		rep = &shim.ExecError{Op: "exec", Message: fmt.Sprintf("pooled shim did not exec: %v", err)}
	}
	return rep, true
}
