// Package reactor is corral's supervisor core. One goroutine, the loop
// goroutine of an eventloop.Loop, owns every execution: each child's pidfd
// and its stdout/stderr pipes sit in the loop's one epoll set, timers enforce
// the limits, and every state change runs there (state.go). The only Wait of
// a child happens when its pidfd is readable; without pidfds a waiter
// goroutine waits and posts the exit into the loop.
//
// Clients reach the reactor through the ipc.Service methods (service.go),
// from any goroutine: they post work to the loop and wait for its answer.
// Nothing on the loop goroutine blocks: spawning, D-Bus calls, removing
// workspaces and cgroups happen on other goroutines and post their results.
package reactor

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/eventloop"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
)

// Config configures a Reactor. Zero values mean the defaults noted.
type Config struct {
	Backend  scope.Backend // required
	Log      zerolog.Logger
	Defaults api.Defaults // exec.start defaults; zero fields take the protocol's
	// NoPidfd forces the waiter-goroutine fallback used when the kernel
	// gives no pidfd (os.ErrNoHandle), so both paths can be exercised.
	NoPidfd bool
	// KillWait bounds how long the tree may take to vanish after SIGKILL
	// before the execution moves on with an error (default 5s).
	KillWait time.Duration
	// SampleInterval is how often cgroup counters are read for cpu_ms and
	// OOM detection (default 100ms).
	SampleInterval time.Duration
	// Retention keeps cleaned records queryable (default 1h; <0: forever).
	Retention time.Duration
	// StateDir holds workspaces (<StateDir>/work/<id>); "" disables them.
	StateDir string
	// MaxRunning and MaxPerUID cap executions not yet cleaned (0: no cap).
	MaxRunning, MaxPerUID int
	// Subreaper makes the daemon reap orphaned descendants itself
	// (PR_SET_CHILD_SUBREAPER), so no zombie outlives an execution even
	// under a PID 1 that does not reap. The daemon sets it; it changes the
	// whole process.
	Subreaper bool
	// SocketGID is the socket's group, dropped from children's groups
	// (-1: none).
	SocketGID int64
	// PoolSize is how many shims wait, already in scopes of their own, for
	// commands (0: no pool; every exec.start creates its scope inline).
	PoolSize int
	// Store keeps records durable; nil means an in-memory store.
	Store store.Store
	// Info is filled into daemon.info (version, backend details, checks).
	Info api.Info
	// Observer is told of transitions, output and store writes (metrics,
	// traces); nil: nobody.
	Observer Observer
	// FdStore, when set, receives each execution's fds so that it
	// survives a crash of corrald (adopt_linux.go); output is then spooled
	// to <StateDir>/spool as it is read.
	FdStore FdStore
	// NoPidfdExitInfo forces the path of a kernel without PIDFD_INFO_EXIT:
	// an adopted child reaped by someone else ends lost.
	NoPidfdExitInfo bool
	// AdoptDelay (tests only: corrald's hidden --test-adopt-delay) holds
	// every started child that long between spawn and the loop's adopt,
	// as a loop that takes it up late under load: a crash meanwhile finds
	// its record started and its fds parked.
	AdoptDelay time.Duration
	// Adopt are the executions an earlier image of corrald ran, to take
	// over (after a handover or a crash).
	Adopt []Adoptee
}

// Reactor supervises executions. Create it with New, drive it with Run.
// Its exported methods are safe for concurrent use.
type Reactor struct {
	cfg  Config
	log  zerolog.Logger
	loop *eventloop.Loop

	// Loop-goroutine state.
	execs    map[string]*execution
	running  int
	perUID   map[uint32]int
	readBuf  []byte
	reaper   *reaper // nil without Config.Subreaper
	store    store.Store
	inflight int // store writes not yet answered
	// The store calls back (store.Notifier): answers are numbered in
	// persist order and run in that order (durable.go). Loop goroutine
	// only.
	ackSeq, ackNext uint64
	ackReady        map[uint64]func()
	dirty           map[*execution]struct{} // latest record not durable yet
	retry           *eventloop.Timer
	pool            *pool // nil without Config.PoolSize
	obs             Observer
	recent          recentRing // final records of the executions that left memory last (recent.go)

	total atomic.Int64
	// How exits were seen: through the pidfd in the loop, or by the
	// fallback waiter goroutine.
	reapedPidfd, reapedWaiter atomic.Int64
	stopping                  atomic.Bool
	handover                  handoverState
	adopted                   int // executions taken over at start; fixed after New
	startedAt                 time.Time
	runningAt                 atomic.Int64 // running count mirrored for Info

	// beforeAdopt, when set (tests only), runs on a starting client's
	// goroutine between the spawn and handing the child to the loop: a
	// loop that takes the child up late.
	beforeAdopt func()
	// oomSettle, when set (tests only), replaces oomSettleBound (deferExit).
	// Loop goroutine only.
	oomSettle time.Duration
}

var (
	_ ipc.Service      = (*Reactor)(nil)
	_ ipc.OutputWaiter = (*Reactor)(nil)
)

// New creates a reactor; call Run to start supervising.
func New(cfg Config) (*Reactor, error) {
	if cfg.Backend == nil {
		return nil, errors.New("reactor: no scope backend")
	}
	d := &cfg.Defaults
	if d.TimeoutMS == 0 {
		d.TimeoutMS = api.DefaultTimeoutMS
	}
	if d.GraceMS == 0 {
		d.GraceMS = api.DefaultGraceMS
	}
	if d.TasksMax == 0 {
		d.TasksMax = api.DefaultTasksMax
	}
	if d.OutputLimitBytes == 0 {
		d.OutputLimitBytes = api.DefaultOutputLimitBytes
	}
	if cfg.KillWait <= 0 {
		cfg.KillWait = 5 * time.Second
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = 100 * time.Millisecond
	}
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	loop, err := eventloop.New()
	if err != nil {
		return nil, fmt.Errorf("reactor: %w", err)
	}
	st := cfg.Store
	if st == nil {
		st = store.NewMemory()
	}
	r := &Reactor{
		store:     st,
		startedAt: time.Now(),
		cfg:       cfg,
		log:       cfg.Log,
		loop:      loop,
		execs:     make(map[string]*execution),
		dirty:     make(map[*execution]struct{}),
		perUID:    make(map[uint32]int),
		readBuf:   make([]byte, pipeSize), // one read can empty a full pipe
	}
	// Adopted children are registered as main processes before the reaper
	// runs: it must never reap one of them as an orphan.
	mains := r.prepareAdoptions()
	if cfg.Subreaper {
		if r.reaper, err = startReaper(cfg.Log, mains...); err != nil {
			loop.Close()
			return nil, fmt.Errorf("reactor: %w", err)
		}
	}
	if len(r.cfg.Adopt) > 0 {
		if err := loop.Post(r.readoptAll); err != nil {
			loop.Close()
			return nil, fmt.Errorf("reactor: %w", err)
		}
	}
	if cfg.PoolSize > 0 {
		r.pool = newPool(r, cfg.PoolSize)
	}
	r.obs = cfg.Observer
	if r.obs == nil {
		r.obs = Observers()
	}
	return r, nil
}

// Run drives the loop on the calling goroutine until ctx ends.
func (r *Reactor) Run(ctx context.Context) error {
	defer r.reaper.close()
	defer r.loop.Close()
	defer r.pool.close()
	return r.loop.Run(ctx)
}

// post queues f on the loop; after shutdown f is dropped.
func (r *Reactor) post(f func()) {
	if err := r.loop.Post(f); err != nil {
		r.log.Debug().Err(err).Msg("post after loop stopped")
	}
}

// onLoop runs f on the loop goroutine and waits for it.
func (r *Reactor) onLoop(ctx context.Context, f func()) error {
	done := make(chan struct{})
	if err := r.loop.Post(func() { f(); close(done) }); err != nil {
		return api.Errorf(api.CodeShuttingDown, "daemon is shutting down")
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lookup finds id for caller. Another uid's execution answers not found,
// exactly as a missing one. Loop goroutine only.
func (r *Reactor) lookup(caller api.Owner, id string) (*execution, error) {
	e, ok := r.execs[id]
	if !ok || (caller.UID != 0 && e.owner.UID != caller.UID) {
		return nil, api.ErrNotFound
	}
	return e, nil
}

// snapshot returns e's record as clients see it. Loop goroutine only.
func (r *Reactor) snapshot(e *execution) api.Record {
	rec := e.rec
	if e.streams[0] != nil {
		rec.Stdout = e.streams[0].info()
		rec.Stderr = e.streams[1].info()
	}
	if rec.DurationMS == 0 && rec.StartedAt != nil && rec.ExitedAt == nil {
		rec.DurationMS = time.Since(*rec.StartedAt).Milliseconds()
	}
	return rec
}

// Every runs f on the loop goroutine every d until ctx ends. The watchdog
// uses it: a loop that stops turning stops the pings, and systemd restarts
// the daemon.
func (r *Reactor) Every(ctx context.Context, d time.Duration, f func()) {
	var tick func()
	tick = func() {
		if ctx.Err() != nil {
			return
		}
		f()
		r.loop.AfterFunc(d, tick)
	}
	r.post(func() { r.loop.AfterFunc(d, tick) })
}

// Running reports how many executions are not yet cleaned.
func (r *Reactor) Running() int { return int(r.runningAt.Load()) }

// Total reports how many executions were started since the daemon started.
func (r *Reactor) Total() int64 { return r.total.Load() }

func (r *Reactor) stopTimer(t **eventloop.Timer) {
	if *t != nil {
		r.loop.StopTimer(*t)
		*t = nil
	}
}

// audit starts the structured log line of a state change. Field names map
// to journal fields by upper-casing (EXEC_ID, EVENT, OWNER_UID, ...).
func (r *Reactor) audit(e *execution, event string) *zerolog.Event {
	ev := r.log.Info().Str("exec_id", e.id).Str("event", event).
		Uint32("owner_uid", e.owner.UID).Int32("owner_pid", e.owner.PID)
	if e.rec.Scope != "" {
		ev = ev.Str("scope", e.rec.Scope)
	}
	for k, v := range e.params.Labels {
		ev = ev.Str("label_"+k, v)
	}
	return ev
}
