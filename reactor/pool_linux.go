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
// Keeping ahead of demand: up to refillParallel entries are created at
// once (each waits for its own systemd job, so several jobs are in flight
// together); a take that leaves the pool at or below its low water (half
// its target) refills at once, one above it a moment later (refillDelay,
// so the refill does not compete with the command just handed over); and
// the target grows by one for every take that found the pool empty, up to
// poolGrowth times the configured size, and shrinks back by one per
// poolShrinkAfter without a miss, discarding an idle entry beyond it.
//
// Ownership: the run goroutine decides what to create and discards dead or
// surplus entries; create goroutines (at most refillParallel) each make one
// entry and hand it to the pool under mu; take may be called from any
// goroutine. An entry taken belongs to the caller, which dispatches it or
// discards it.
type pool struct {
	r    *Reactor
	size int // configured (--pool-size): the least target
	max  int // bound of the target

	mu       sync.Mutex
	idle     []*pooled
	target   int       // entries to keep idle now: size..max
	inflight int       // create goroutines running
	failures int       // creates failed in a row
	retryAt  time.Time // no create before this after a failure
	lastMiss time.Time
	stopping bool

	hits, misses atomic.Int64
	wake         chan struct{}
	stop         chan struct{}
	done         chan struct{}
	creates      sync.WaitGroup
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

const (
	// refillDelay is how long the pool waits after a take that left it
	// above its low water before it starts a replacement (see pool).
	refillDelay = 25 * time.Millisecond
	// refillParallel bounds the entries created at once.
	refillParallel = 2
	// poolGrowth bounds the target: poolGrowth times --pool-size.
	poolGrowth = 2
	// poolShrinkAfter is how long without a miss before the target
	// shrinks by one.
	poolShrinkAfter = 10 * time.Second
)

func newPool(r *Reactor, size int) *pool {
	p := &pool{r: r, size: size, max: poolGrowth * size, target: size,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// poke wakes the run goroutine.
func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take returns a waiting entry, or nil when the pool is empty (the caller
// then creates a scope inline, and the pool's target grows). Either way the
// pool refills in the background.
func (p *pool) take() *pooled {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	var e *pooled
	if n := len(p.idle); n > 0 {
		e = p.idle[n-1]
		p.idle = p.idle[:n-1]
	} else {
		p.target = min(p.target+1, p.max)
		p.lastMiss = time.Now()
	}
	p.mu.Unlock()
	if e == nil {
		p.misses.Add(1)
	} else {
		p.hits.Add(1)
	}
	p.poke()
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

// targetSize is the pool's current target (daemon.info's size).
func (p *pool) targetSize() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

func (p *pool) run() {
	defer close(p.done)
	check := time.NewTicker(time.Second)
	defer check.Stop()
	var retry <-chan time.Time
	for {
		if wait := p.fill(); wait > 0 {
			retry = time.After(wait)
		}
		select {
		case <-p.stop:
			p.stopCreates()
			return
		case <-p.wake:
			// A take just handed a shim its command: creating the next
			// one at once would compete with that command for the CPU on
			// its critical path. Refill a moment later, unless the pool
			// is at or below its low water.
			p.mu.Lock()
			above := len(p.idle) > max(1, p.target/2)
			p.mu.Unlock()
			if above {
				select {
				case <-p.stop:
					p.stopCreates()
					return
				case <-time.After(refillDelay):
				}
			}
		case <-retry:
			retry = nil
		case <-check.C:
			p.replaceDead()
			p.shrink()
		}
	}
}

// stopCreates is the run goroutine's end: fill starts no more create
// goroutines, those running discard what they make instead of keeping it,
// and it returns once they have all finished.
func (p *pool) stopCreates() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	p.creates.Wait()
}

// fill starts create goroutines while the idle and in-flight entries are
// below the target, at most refillParallel at once. After a failure it
// starts none until the back-off ends, and returns how long that is.
func (p *pool) fill() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if wait := time.Until(p.retryAt); wait > 0 {
		return wait
	}
	for !p.stopping && len(p.idle)+p.inflight < p.target && p.inflight < refillParallel {
		p.inflight++
		p.creates.Add(1)
		go p.createOne()
	}
	return 0
}

// createOne creates one entry and gives it to the pool (or discards it
// when the pool is stopping or no longer wants it).
func (p *pool) createOne() {
	defer p.creates.Done()
	e, err := p.create()
	p.mu.Lock()
	p.inflight--
	if err != nil {
		p.failures++
		// Back off; exec.start still works inline meanwhile.
		p.retryAt = time.Now().Add(time.Duration(min(p.failures, 10)) * 500 * time.Millisecond)
		n := p.failures
		p.mu.Unlock()
		p.r.log.Warn().Err(err).Int("failures", n).Msg("pool: create entry")
		p.poke()
		return
	}
	p.failures = 0
	keep := !p.stopping && len(p.idle) < p.target
	if keep {
		p.idle = append(p.idle, e)
	}
	p.mu.Unlock()
	if !keep {
		p.discard(e)
	}
	p.poke()
}

// shrink lowers the target by one once poolShrinkAfter passed without a
// miss, and discards one idle entry beyond the target.
func (p *pool) shrink() {
	p.mu.Lock()
	if p.target > p.size && time.Since(p.lastMiss) >= poolShrinkAfter {
		p.target--
		p.lastMiss = time.Now() // one step per poolShrinkAfter
	}
	var extra *pooled
	if n := len(p.idle); n > p.target {
		extra = p.idle[0] // the oldest
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	if extra != nil {
		p.discard(extra)
	}
}

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
	}, h, nil)
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
// limits to the entry's scope and hands over the command and its stdio.
// On failure before the command could run, ok is false: the caller takes
// back what it parked for the entry, discards it (pool.discard, which
// kills the shim) and starts inline. The exec itself is waited for on the
// loop (awaitExec): a failed exec is a failed start there.
func (r *Reactor) dispatchPooled(e *pooled, cfg shim.Config, lim scope.Limits, stdin, stdout, stderr *os.File) (ok bool) {
	if l, can := e.sc.(scope.Limiter); can && (lim.MemoryBytes != 0 || lim.TasksMax != r.cfg.Defaults.TasksMax) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := l.SetLimits(ctx, lim)
		cancel()
		if err != nil {
			r.log.Warn().Err(err).Str("scope", e.sc.Name()).Msg("pool: set limits; starting inline")
			return false
		}
	}
	devnull := stdin
	if devnull == nil {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return false
		}
		defer f.Close()
		devnull = f
	}
	e.dispatched = time.Now()
	if err := e.h.Dispatch(cfg, devnull, stdout, stderr); err != nil {
		r.log.Warn().Err(err).Str("scope", e.sc.Name()).Msg("pool: dispatch; starting inline")
		return false
	}
	return true
}
