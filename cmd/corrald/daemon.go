package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/systemd"
)

func newLogger(c *config) zerolog.Logger {
	level, err := zerolog.ParseLevel(c.logLevel)
	if err != nil || c.logLevel == "" {
		level = zerolog.InfoLevel
	}
	var w io.Writer = os.Stderr
	switch c.logFormat {
	case "journald":
		w = systemd.JournalWriter()
	case "console":
		w = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339}
	case "auto":
		if systemd.UnderSystemd() {
			w = systemd.JournalWriter()
		}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Str("component", "corrald").Logger()
}

// run is the daemon, as the steps below in order: harden the process, pin
// the shim, open the store, pick the backend, settle what an earlier run
// left, listen, start the reactor, serve until ctx ends, shut down
// gracefully. Each step wraps its own errors; run adds no context.
func run(ctx context.Context, c *config, log zerolog.Logger) error {
	// A reload (SIGHUP) is a handover; until serve handles it, it must not
	// kill the daemon.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// What an earlier image passed (fds by name) is claimed first.
	sv := takeSurvival(ctx, c, log)
	host := scope.Detect()
	checks := map[string]string{}
	checks["no_new_privs"] = setNoNewPrivs(log)
	shimPath, err := pinShim(c.shim, log)
	if err != nil {
		return err
	}
	checks["shim"] = shimPath
	raiseFileLimit(log)

	// The store first: opening it takes the state directory's lock, so a
	// second corrald stops here, before it could touch the first one's
	// scopes.
	st, err := openStore(c, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := st.Close(); err != nil {
			log.Error().Err(err).Msg("close store")
		}
	}()
	backend, err := chooseBackend(ctx, c, host, log)
	if err != nil {
		return err
	}
	defer backend.Close()
	checks["backend"] = backend.Name()
	lock, err := lockScopes(backend)
	if err != nil {
		return err
	}
	defer lock.Close()
	sv.plan(st, backend, c.stateDir, log)

	// Scopes first, then records: the records of executions whose scopes
	// the backend could not see (another cgroup base) are killed by path.
	cleanLeftoverScopes(ctx, backend, sv.keepScope, log)
	sv.release(recoverExecutions(st, host, c.stateDir, sv, log))
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	defer stopSweep()
	store.StartSweeper(sweepCtx, st, log, c.retention, 0)

	obs, err := startObservability(ctx, c, log)
	if err != nil {
		return err
	}
	defer obs.close(log)
	ln, activated, err := listen(c, sv, log)
	if err != nil {
		return err
	}
	d := &corrald{c: c, log: log, host: host, checks: checks, sv: sv, st: st, backend: backend,
		obs: obs, ln: ln, activated: activated, hup: hup}
	r, err := d.newReactor()
	if err != nil {
		ln.Close()
		return err
	}
	obs.serveMetrics(r, log)
	return d.serve(ctx, r)
}

// corrald is what run's steps made, for the last two: the reactor is built
// from it and serve runs with it. Owned by run's goroutine.
type corrald struct {
	c         *config
	log       zerolog.Logger
	host      scope.Host
	checks    map[string]string // daemon.info's checks
	sv        *survival
	st        store.Store
	backend   scope.Backend
	obs       *observability
	ln        *net.UnixListener
	activated bool             // ln came from systemd's socket activation
	hup       <-chan os.Signal // SIGHUP: hand over to a new image
}

// openStore creates the state directory and opens the store chosen by
// --store.
func openStore(c *config, log zerolog.Logger) (store.Store, error) {
	// 0711: only root reads or lists it (the store's files are 0600), but
	// a user can traverse it to reach its own workspace by its absolute
	// path (work/<id> is 0700 and the user's), which tools that resolve
	// $PWD need.
	// os's errors name the path already ("mkdir /x: not a directory").
	if err := os.MkdirAll(c.stateDir, 0o711); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := os.Chmod(c.stateDir, 0o711); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	switch c.storeKind {
	case "sqlite":
		var sync string
		switch c.storeSync {
		case "normal":
			sync = store.SyncNormal
		case "full":
			sync = store.SyncFull
		default:
			return nil, fmt.Errorf("--store-sync %q: want normal or full", c.storeSync)
		}
		db, err := store.OpenOptions(c.stateDir, log, store.Options{Synchronous: sync})
		if err != nil {
			return nil, err // "open store: ...", from the store
		}
		return db, nil
	case "memory":
		return store.NewMemory(), nil
	}
	return nil, fmt.Errorf("--store %q: want sqlite or memory", c.storeKind)
}

// cleanLeftoverScopes kills and removes the scopes an earlier run left, for
// a backend whose scopes can outlive the daemon. Failures are logged: the
// daemon starts anyway.
func cleanLeftoverScopes(ctx context.Context, backend scope.Backend, keep func(string) bool, log zerolog.Logger) {
	lc, ok := backend.(scope.LeftoverCleaner)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	names, err := lc.CleanLeftoversExcept(cctx, keep)
	for _, n := range names {
		log.Warn().Str("scope", n).Str("event", "leftover_removed").Msg("killed and removed a scope left by an earlier run")
	}
	if err != nil {
		log.Warn().Err(err).Msg("clean leftover scopes")
	}
}

// recoverExecutions settles the records an earlier run left unfinished,
// before anything new starts: running ones are lost (their scopes were
// killed by cleanLeftoverScopes, or by path here), and their workspaces go.
// Then, since nothing runs yet, whatever else is in the workspace root is
// debris and goes too. Failures are logged; it reports whether the settled
// records were written.
func recoverExecutions(st store.Store, host scope.Host, stateDir string, sv *survival, log zerolog.Logger) bool {
	opts := store.RecoverOptions{
		Skip: func(rec api.Record) bool { return sv.adopted(rec.ID) },
		Why:  sv.lostWhy,
		// Never let run: start_failed (the error says why), not lost.
		NeverRan: func(rec api.Record) bool { return sv.neverRan[rec.ID] },
	}
	n, err := store.RecoverWith(st, log, time.Now(), opts, func(rec api.Record) error {
		if err := killLeftoverCgroup(host, rec.Scope); err != nil {
			return err
		}
		killLeftoverPgroup(rec)
		if err := os.RemoveAll(reactor.WorkspaceDir(stateDir, rec.ID)); err != nil {
			return fmt.Errorf("remove workspace: %w", err)
		}
		ev := log.Warn().Str("exec_id", rec.ID).Str("event", "cleaned").Uint32("owner_uid", rec.Owner.UID).
			Int32("owner_pid", rec.Owner.PID).Str("scope", rec.Scope)
		if rec.Outcome != nil {
			ev = ev.Str("outcome", string(*rec.Outcome))
		}
		ev.Msg("execution settled at start-up")
		return nil
	})
	if err != nil {
		log.Error().Err(err).Msg("recover unfinished executions")
	}
	settled := err == nil
	if n > 0 {
		log.Warn().Int("count", n).Msg("settled executions left by an earlier run")
	}
	root := reactor.WorkspaceRoot(stateDir)
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			if sv.adopted(e.Name()) {
				continue
			}
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				log.Warn().Err(err).Str("workspace", e.Name()).Msg("remove leftover workspace")
			}
		}
	}
	// Spooled output of executions not adopted is debris too.
	if ents, err := os.ReadDir(reactor.SpoolDir(stateDir)); err == nil {
		for _, e := range ents {
			id, _, _ := strings.Cut(e.Name(), ".")
			if !sv.adopted(id) || strings.HasSuffix(e.Name(), ".tmp") {
				os.Remove(filepath.Join(reactor.SpoolDir(stateDir), e.Name()))
			}
		}
	}
	return settled
}

// newReactor configures the reactor from the flags and what the earlier
// steps made. reactor.New's errors carry their own context.
func (d *corrald) newReactor() (*reactor.Reactor, error) {
	c, host, ln, sv := d.c, d.host, d.ln, d.sv
	socketGID := int64(-1)
	if fi, err := os.Stat(ln.Addr().String()); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Gid != 0 {
			socketGID = int64(st.Gid)
		}
	}
	return reactor.New(reactor.Config{
		AdoptDelay: c.testAdoptDelay,
		Backend:    d.backend,
		Log:        d.log,
		Defaults: api.Defaults{
			TimeoutMS: c.defTimeout.Milliseconds(), GraceMS: c.defGrace.Milliseconds(),
			TasksMax: c.defTasks, OutputLimitBytes: c.defOutput,
		},
		NoPidfd:        c.noPidfd,
		KillWait:       c.killWait,
		SampleInterval: c.sampleEvery,
		Retention:      c.retention,
		StateDir:       c.stateDir,
		MaxRunning:     c.maxRunning,
		MaxPerUID:      c.maxPerUID,
		Subreaper:      true,
		Store:          d.st,
		Observer:       d.obs.observer(),
		PoolSize:       poolSize(c.poolSize, d.backend),
		SocketGID:      socketGID,
		Info: api.Info{
			Version: version, Pidfd: host.Pidfd, Cgroup: host.CgroupMode, Kernel: host.Kernel,
			Socket: ln.Addr().String(), StateDir: c.stateDir, Checks: d.checks,
			Survival: &sv.info,
		},
		FdStore:         fdStore(sv),
		NoPidfdExitInfo: !sv.info.PidfdExitInfo,
		Adopt:           sv.adopt,
	})
}

// fdStore is systemd's fd store when this host has one for corrald.
func fdStore(sv *survival) reactor.FdStore {
	if !sv.info.FdStore {
		return nil
	}
	return sdFdStore{}
}

// Sync waits for what the fd store sent to reach systemd (reactor.FdStore):
// its messages wait in the process while systemd is slow to read them.
func (sdFdStore) Sync(d time.Duration) bool { return systemd.SyncNotify(d) }

// serve runs the reactor's loop and the socket server, tells systemd it is
// ready, and waits for ctx to end (SIGTERM), the server to stop or the loop
// to fail; then it shuts down.
func (d *corrald) serve(ctx context.Context, r *reactor.Reactor) error {
	c, ln, activated, log := d.c, d.ln, d.activated, d.log
	loopCtx, stopLoop := context.WithCancel(context.Background())
	defer stopLoop()
	loopDone := make(chan error, 1)
	go func() { loopDone <- r.Run(loopCtx) }()

	srv := ipc.NewServer(r, log)
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()

	// Watchdog pings come from the loop goroutine itself: if the loop
	// wedges, the pings stop and systemd restarts the daemon.
	if wd, ok := systemd.WatchdogInterval(); ok {
		every := wd / 2
		if c.watchdogTick > 0 {
			every = c.watchdogTick
		}
		// A ping at once, then every interval: after a handover the
		// previous image's last ping was just before its exec, and
		// waiting a whole interval for the first one here would leave
		// systemd without one for longer than WatchdogSec.
		systemd.Watchdog()
		r.Every(loopCtx, every, func() { systemd.Watchdog() })
	}
	r.Every(loopCtx, 5*time.Second, func() {
		systemd.Status(fmt.Sprintf("%d running, %d total", r.Running(), r.Total()))
	})
	// Executions taken over from an earlier image are in the loop before
	// systemd hears READY=1 (the end of a reload).
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	if err := r.Sync(sctx); err != nil {
		log.Warn().Err(err).Msg("wait for the adopted executions")
	}
	scancel()
	systemd.Ready()
	log.Info().Str("event", "ready").Str("socket", ln.Addr().String()).Bool("socket_activated", activated).
		Str("backend", d.backend.Name()).Str("cgroup", d.host.CgroupMode).Bool("pidfd", d.host.Pidfd && !c.noPidfd).
		Str("kernel", d.host.Kernel).Str("version", version).Msg("corrald ready")

wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-d.hup:
			// The traces queued in this image would die with it.
			d.obs.flush(log)
			// Returns only if the exec failed: the old image carries on.
			if err := handover(c, r, ln, activated, log); err != nil {
				log.Error().Err(err).Str("event", "handover_failed").Msg("handover failed; this corrald carries on")
			}
		case err := <-srvDone:
			if err != nil {
				log.Error().Err(err).Msg("server stopped")
			}
			break wait
		case err := <-loopDone:
			return fmt.Errorf("event loop stopped: %w", err)
		}
	}
	shutdown(c, r, srv, log)
	stopLoop()
	<-loopDone
	if !activated {
		os.Remove(c.socket)
	}
	log.Info().Str("event", "stopped").Msg("corrald stopped")
	return nil
}

// shutdown is the graceful part of stopping: refuse new work (-32005), let
// running executions finish for --drain, then cancel them; every record
// ends before exit. The loop still runs.
func shutdown(c *config, r *reactor.Reactor, srv *ipc.Server, log zerolog.Logger) {
	systemd.Stopping()
	log.Info().Str("event", "stopping").Int("running", r.Running()).Dur("drain", c.drain).Msg("corrald stopping")
	sctx, cancel := context.WithTimeout(context.Background(), c.drain+c.defGrace+c.killWait+10*time.Second)
	defer cancel()
	if err := r.Shutdown(sctx, c.drain); err != nil {
		log.Error().Err(err).Msg("shutdown")
	}
	_ = srv.Shutdown(sctx)
}
