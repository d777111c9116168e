package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/cmd/internal/cli"
	"github.com/corral-dev/corral/ipc"
)

// runOptions are the flags of `corralctl run`.
type runOptions struct {
	timeout, grace, cpu durationFlag
	memory, outputLimit sizeFlag
	tasks               countFlag
	env, labels         kvFlag
	network             choiceFlag
	cwd, id             string
	user                string
	redact, detach      bool
	stdin, tty          bool
	idleTimeout         durationFlag
}

func (o *runOptions) register(fs *pflag.FlagSet) {
	o.env.what, o.labels.what = "--env", "--label"
	fs.Var(&o.timeout, "timeout", "wall-clock `LIMIT`, e.g. 30s (daemon default 30s)")
	fs.Var(&o.grace, "grace", "`DURATION` between SIGTERM and SIGKILL (daemon default 2s)")
	fs.Var(&o.cpu, "cpu", "CPU time `LIMIT` of the whole process tree, e.g. 15s")
	fs.Var(&o.memory, "memory", "memory `LIMIT`, e.g. 512M (K, M, G: powers of 1024)")
	fs.Var(&o.tasks, "tasks", "maximum processes+threads (daemon default 256)")
	fs.Var(&o.env, "env", "`KEY=VALUE` environment variable for the command (repeatable; a bare KEY passes this shell's $KEY)")
	fs.StringVar(&o.cwd, "cwd", "", "working `DIR` of the command")
	fs.Var(&o.labels, "label", "`KEY=VALUE` label (repeatable)")
	o.network.choices = []string{"host", "none"}
	fs.Var(&o.network, "network", "network: host (default) or none")
	fs.StringVar(&o.id, "id", "", "idempotency `KEY`: the execution's id")
	fs.Var(&o.outputLimit, "output-limit", "output `SIZE` kept per stream (daemon default 256K)")
	fs.StringVar(&o.user, "user", "", "run as `NAME` (root callers only)")
	fs.BoolVar(&o.redact, "redact", false, "ask the daemon to redact secrets from kept output")
	fs.BoolVar(&o.detach, "detach", false, "start the command, print its id and exit")
	fs.BoolVarP(&o.stdin, "stdin", "i", false, "forward this process's stdin to the command")
	fs.BoolVarP(&o.tty, "tty", "t", false, "run the command on a terminal (with -i and a terminal here: raw mode, every key goes to the command)")
	fs.Var(&o.idleTimeout, "idle-timeout", "end the command after `DURATION` without output on either stream (exit 124)")
	cli.CompleteValues(fs, map[string]string{"cwd": "dir", "network": "words:host none", "user": "user"})
	cli.VarNames(fs, map[string]string{"network": "MODE"})
}

// startParams turns the flags and the command into exec.start params.
func (o *runOptions) startParams(argv []string) (api.StartParams, error) {
	if len(argv) == 0 {
		return api.StartParams{}, errors.New("no command given (corralctl run [flags] -- CMD [ARG...])")
	}
	// The protocol carries text (JSON strings are UTF-8): invalid bytes
	// would reach the daemon as U+FFFD, and a different command would run.
	if err := checkUTF8(argv, o.env.m, o.cwd); err != nil {
		return api.StartParams{}, err
	}
	if o.tty {
		// A terminal program needs to know the terminal type: ours, as
		// docker run -t and ssh pass it, unless --env sets one.
		if _, set := o.env.m["TERM"]; !set {
			if term, ok := osLookup("TERM"); ok && term != "" {
				if o.env.m == nil {
					o.env.m = map[string]string{}
				}
				o.env.m["TERM"] = term
			}
		}
	}
	return api.StartParams{
		Argv:             argv,
		Env:              o.env.m,
		Cwd:              o.cwd,
		StdinOpen:        o.stdin,
		TimeoutMS:        millis(o.timeout.d),
		GraceMS:          millis(o.grace.d),
		CPUMS:            millis(o.cpu.d),
		MemoryBytes:      o.memory.n,
		TasksMax:         o.tasks.n,
		OutputLimitBytes: o.outputLimit.n,
		Labels:           o.labels.m,
		ID:               o.id,
		User:             o.user,
		Network:          o.network.v,
		Redact:           o.redact,
		TTY:              o.tty,
		IdleTimeoutMS:    millis(o.idleTimeout.d),
	}, nil
}

// warnUnenforced says on stderr which of the limits given as flags corrald
// could not apply on this host (the record's unenforced): a --memory the
// backend cannot enforce would otherwise look like one that was never hit.
func warnUnenforced(e *env, p api.StartParams, rec api.Record) {
	asked := map[string]string{}
	if p.MemoryBytes > 0 {
		asked["memory_bytes"] = "--memory"
	}
	if p.TasksMax > 0 {
		asked["tasks_max"] = "--tasks"
	}
	if p.CPUMS > 0 {
		asked["cpu_ms"] = "--cpu"
	}
	for _, u := range rec.Unenforced {
		if flag, ok := asked[u]; ok {
			fmt.Fprintf(e.stderr, "corralctl: warning: %s is not enforced: corrald's %s backend on this host cannot apply %s (see corrald's docs, \"Limits per kind of host\"); the command runs without it\n",
				flag, rec.Backend, u)
		}
	}
}

// checkUTF8 refuses a command, environment or working directory that is
// not valid UTF-8, naming the first such argument.
func checkUTF8(argv []string, env map[string]string, cwd string) error {
	const why = "is not valid UTF-8, and corrald's protocol carries only text (it would run with U+FFFD in place of those bytes)"
	for i, a := range argv {
		if !utf8.ValidString(a) {
			return fmt.Errorf("argument %d %q %s", i, a, why)
		}
	}
	for k, v := range env {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("--env %q %s", k, why)
		}
	}
	if !utf8.ValidString(cwd) {
		return fmt.Errorf("--cwd %q %s", cwd, why)
	}
	return nil
}

// parseRun parses run's arguments: flags up to the first non-flag argument
// or "--", then the command (whose own flags are its own).
func parseRun(fs *pflag.FlagSet, args []string) (*runOptions, []string, error) {
	o := &runOptions{}
	o.register(fs)
	o.env.lookup = osLookup
	fs.SetInterspersed(false)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return o, fs.Args(), nil
}

func cmdRun(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "run")
	o, argv, err := parseRun(fs, args)
	if err != nil {
		return usageError(e, fs, err, exitFailure)
	}
	if helpAsked(e, fs) {
		return 0
	}
	p, err := o.startParams(argv)
	if err != nil {
		return fail(e, exitFailure, "%v", err)
	}
	// A caller inside a trace (TRACEPARENT, as OpenTelemetry's environment
	// carriers name it) makes the execution's trace a child of its span.
	p.Traceparent = e.getenv("TRACEPARENT")
	ctx := context.Background()

	// Take SIGINT/SIGTERM before starting, so that no signal can leave an
	// execution running behind a dead corralctl.
	var sigs <-chan os.Signal
	if e.notifySignals != nil {
		ch, stop := e.notifySignals()
		defer stop()
		sigs = ch
	}

	c, err := dial(ctx, e, g)
	if err != nil {
		return fail(e, exitFailure, "%v", err)
	}
	defer c.Close()
	var lt *localTerminal
	if o.tty && !o.detach {
		// Raw mode (with -i) from before the start: no key typed from now on
		// is taken by our own terminal. Restored by the defer on every
		// return and panic; signals are handled (sigs), so they return too.
		var size *api.TTYSize
		if lt, size, err = setupTerminal(e, o.stdin); err != nil {
			return fail(e, exitFailure, "terminal: %v", err)
		}
		defer lt.restore()
		p.TTYSize = size
	}
	rec, err := c.Start(ctx, p)
	if err != nil {
		if lt != nil {
			lt.restore()
		}
		return fail(e, exitFailure, "start %s: %s", argvString(p.Argv, 60), describe(err))
	}

	warnUnenforced(e, p, rec)
	if o.detach {
		if g.json {
			if err := printJSON(e.stdout, rec); err != nil {
				return fail(e, exitFailure, "%v", err)
			}
		} else {
			fmt.Fprintln(e.stdout, rec.ID)
		}
		if rec.Outcome != nil && *rec.Outcome == api.OutcomeStartFailed {
			_, msg := exitStatus(rec)
			fmt.Fprintf(e.stderr, "corralctl: %s\n", msg)
		}
		return 0
	}
	return attach(ctx, e, g, c, rec, o.stdin, lt, sigs)
}

// attach streams a started execution's output until it is cleaned and
// returns the exit status. The first SIGINT/SIGTERM cancels the execution
// (and keeps streaming until it is gone); a second one stops waiting.
//
// lt is set for a terminal execution (run -t): input is typed into it, and
// our window size follows it.
func attach(ctx context.Context, e *env, g *globalFlags, c *ipc.Client, rec api.Record, stdin bool, lt *localTerminal, sigs <-chan os.Signal) int {
	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()

	var (
		mu          sync.Mutex
		interrupted os.Signal
		redialled   []*ipc.Client // connections made after c broke
		// pendingCancel is the reason of a cancel asked for while the
		// connection was down: sent on the next one.
		pendingCancel string
	)
	// curLocked is the connection in use: c, or the last one redialled
	// after a restart of corrald broke it. mu must be held.
	curLocked := func() *ipc.Client {
		if n := len(redialled); n > 0 {
			return redialled[n-1]
		}
		return c
	}
	cur := func() *ipc.Client {
		mu.Lock()
		defer mu.Unlock()
		return curLocked()
	}
	defer func() {
		for _, rc := range redialled {
			rc.Close()
		}
	}()
	// sendCancel cancels the execution on the connection in use; when that
	// one is broken (any error but corrald's answer), the cancel is kept
	// and sent on the next one.
	sendCancel := func(reason string) {
		for {
			cl := cur()
			_, err := cl.Cancel(ctx, api.CancelParams{ID: rec.ID, Reason: reason})
			if err == nil {
				return
			}
			var ae *api.Error
			if errors.As(err, &ae) {
				// corrald answered: the cancel was refused.
				fmt.Fprintf(e.stderr, "corralctl: cancel %s: %s\n", rec.ID, describe(err))
				return
			}
			mu.Lock()
			if cl == curLocked() {
				pendingCancel = reason
				mu.Unlock()
				fmt.Fprintf(e.stderr, "corralctl: cancel %s: %s; the cancel is sent once corrald is reached again\n", rec.ID, describe(err))
				return
			}
			mu.Unlock() // a new connection came meanwhile: cancel on it
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	if sigs != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cancelled := false
			for {
				select {
				case <-done:
					return
				case sig := <-sigs:
					if cancelled {
						mu.Lock()
						interrupted = sig
						mu.Unlock()
						stopFollow()
						continue
					}
					cancelled = true
					fmt.Fprintf(e.stderr, "corralctl: %s: cancelling %s (again to stop waiting)\n", osSignalName(sig), rec.ID)
					sendCancel("corralctl received " + osSignalName(sig))
				}
			}
		}()
	}
	// stdinSent is closed once all of stdin reached corrald (-i, EOF, the
	// close acknowledged): from then on run -i can redial as plain run.
	stdinSent := make(chan struct{})
	canRedial := func() bool {
		if lt != nil {
			return false
		}
		select {
		case <-stdinSent:
			return true
		default:
			return !stdin
		}
	}
	switch {
	case stdin && lt != nil:
		// Not waited for, as below.
		go forwardTerminalInput(followCtx, c, rec.ID, e.stdin)
	case stdin:
		// Not waited for: a read from a terminal cannot be interrupted, and
		// the process exits when the execution is done.
		go func() {
			if forwardStdin(followCtx, c, rec.ID, e.stdin) {
				close(stdinSent)
			}
		}()
	}
	if lt != nil && lt.fd >= 0 && e.notifyResize != nil {
		winch, stop := e.notifyResize()
		defer stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			forwardResize(followCtx, c, rec.ID, lt.fd, winch)
		}()
	}

	st := newStreamer(c, rec.ID, map[string]io.Writer{"stdout": e.stdout, "stderr": e.stderr}, e.stderr)
	final, err := st.follow(followCtx)
	// corrald restarting (a reload hands the executions over; a restart
	// under systemd adopts them) breaks the connection, not the execution:
	// redial and follow on from the offsets written. Not with a terminal
	// or with stdin still being forwarded: their forwarders hold the broken
	// connection.
	rc := &reconnector{e: e, g: g, id: rec.ID}
	for err != nil && errors.Is(err, ipc.ErrClosed) && canRedial() && followCtx.Err() == nil {
		nc, rerr := rc.redial(followCtx, err, "following "+rec.ID+" on")
		if rerr != nil {
			err = fmt.Errorf("%w; %w", err, rerr)
			break
		}
		mu.Lock()
		redialled = append(redialled, nc)
		reason := pendingCancel
		pendingCancel = ""
		mu.Unlock()
		if reason != "" {
			fmt.Fprintf(e.stderr, "corralctl: sending the cancel of %s asked for while the connection was down\n", rec.ID)
			sendCancel(reason)
		}
		st.c = nc
		final, err = st.follow(followCtx)
	}
	if lt != nil {
		// Our messages below are lines of a cooked terminal again.
		lt.restore()
	}
	stopFollow()
	if err != nil {
		mu.Lock()
		sig, unsent := interrupted, pendingCancel
		mu.Unlock()
		if unsent != "" {
			fmt.Fprintf(e.stderr, "corralctl: the cancel of %s was not sent (corrald not reached again); 'corralctl cancel %s' ends it\n", rec.ID, rec.ID)
		}
		if sig != nil {
			fmt.Fprintf(e.stderr, "corralctl: stopped waiting for %s\n", rec.ID)
			if n, ok := sig.(syscall.Signal); ok {
				return exitSignalBase + int(n)
			}
			return exitFailure
		}
		var lw *localWriteError
		if errors.As(err, &lw) {
			// Our output is gone (e.g. `corralctl run ... | head`): end the
			// command too, as a local pipeline would by SIGPIPE.
			if _, cerr := cur().Cancel(ctx, api.CancelParams{ID: rec.ID, Reason: "corralctl: " + lw.stream + " closed"}); cerr != nil {
				fmt.Fprintf(e.stderr, "corralctl: cancel %s: %s\n", rec.ID, describe(cerr))
			}
			if errors.Is(err, syscall.EPIPE) {
				return exitSignalBase + int(syscall.SIGPIPE)
			}
			return fail(e, exitFailure, "%v; cancelled %s", err, rec.ID)
		}
		if errors.Is(err, ipc.ErrClosed) && !canRedial() {
			// The forwarders of -i and -t hold the broken connection, and
			// what they had read but not sent is lost: no redial.
			what := "stdin (-i)"
			if lt != nil {
				what = "terminal (-t)"
			}
			return fail(e, exitFailure, "follow %s: %s; the execution runs on in corrald without this corralctl's %s: see it with 'corralctl logs -f %s' or 'corralctl wait %s', end it with 'corralctl cancel %s'",
				rec.ID, describe(err), what, rec.ID, rec.ID, rec.ID)
		}
		return fail(e, exitFailure, "follow %s: %s", rec.ID, describe(err))
	}
	if final.Outcome == nil {
		// Follow ended without an outcome (a daemon that stops following
		// early); ask for the final record.
		if final, err = cur().Wait(ctx, api.WaitParams{ID: rec.ID}); err != nil {
			return fail(e, exitFailure, "wait %s: %s", rec.ID, describe(err))
		}
	}
	code, msg := exitStatus(final)
	if g.json {
		if err := printJSON(e.stdout, final); err != nil {
			return fail(e, exitFailure, "%v", err)
		}
	}
	if msg != "" {
		fmt.Fprintf(e.stderr, "corralctl: %s\n", msg)
	}
	return code
}

// forwardStdin copies r to the execution's stdin with exec.write and closes
// it at EOF. It gives up quietly when the execution no longer takes input.
// It reports whether all of r reached corrald and the close was taken.
func forwardStdin(ctx context.Context, c *ipc.Client, id string, r io.Reader) bool {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := c.Write(ctx, api.WriteParams{ID: id, Data: buf[:n]}); werr != nil {
				return false
			}
		}
		if err != nil {
			_, cerr := c.Write(ctx, api.WriteParams{ID: id, Close: true})
			return cerr == nil
		}
	}
}

// osSignalName names sig as "SIGINT" rather than Go's "interrupt".
func osSignalName(sig os.Signal) string {
	if n, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return sig.String()
}
