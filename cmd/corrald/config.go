package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli"
)

// config is corrald's configuration: flags, each of which may also come from
// the config file (flags win).
type config struct {
	socket       string
	socketGroup  string
	socketMode   octalMode
	scope        string
	stateDir     string
	retention    time.Duration
	configFile   string
	noPidfd      bool
	maxRunning   int
	maxPerUID    int
	killWait     time.Duration
	drain        time.Duration
	logLevel     string
	logFormat    string
	slice        string
	cgroupBase   string
	showVersion  bool
	showHelp     *bool
	showMan      bool
	defTimeout   time.Duration
	defGrace     time.Duration
	defTasks     int64
	defOutput    int64
	sampleEvery  time.Duration
	watchdogTick time.Duration
	poolSize     int
	storeSync    string
	storeKind    string
	shim         string
	metricsAddr  string
	// Survival (docs/corrald.md, "Restarts and upgrades").
	noFdStore       bool
	noPidfdExitInfo bool
	testAdoptDelay  time.Duration // hidden, tests only: see reactor.Config.AdoptDelay
}

var errHelpShown = errors.New("help shown")

const defaultConfigFile = "/etc/corral/corrald.conf"

// newFlagSet defines corrald's flags: the one source of its --help, its
// man page and the names its config file accepts.
func newFlagSet(c *config, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("corrald", pflag.ContinueOnError)
	fs.SetOutput(out)
	c.socketMode = 0o660
	fs.StringVar(&c.socket, "socket", "/run/corral/corrald.sock", "Unix socket `PATH` to listen on (ignored under socket activation)")
	fs.StringVar(&c.socketGroup, "socket-group", "corral", "`GROUP` owning the socket; members may use corral (\"\" keeps root's)")
	fs.Var(&c.socketMode, "socket-mode", "permission `BITS` of the socket, in octal")
	fs.StringVar(&c.scope, "scope", "auto", "scope `BACKEND`: auto, systemd, cgroup or pgroup")
	fs.StringVar(&c.stateDir, "state-dir", "/var/lib/corral", "state directory `DIR`: workspaces and the execution store")
	fs.DurationVar(&c.retention, "retention", time.Hour, "how long cleaned records stay queryable")
	fs.StringVar(&c.configFile, "config", "", "config `FILE` of \"name = value\" lines, one per flag (default "+defaultConfigFile+" if it exists)")
	fs.BoolVar(&c.noPidfd, "no-pidfd", false, "do not use pidfds: wait for children with a goroutine each (the fallback path)")
	fs.IntVar(&c.maxRunning, "max-running", 1024, "cap on executions not yet cleaned, overall (0: none)")
	fs.IntVar(&c.maxPerUID, "max-per-uid", 256, "cap on executions not yet cleaned, per caller uid (0: none)")
	fs.DurationVar(&c.killWait, "kill-wait", 5*time.Second, "how long a tree may take to vanish after SIGKILL before it is reported as stuck")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "on SIGTERM, how long running executions may finish before they are cancelled")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `LEVEL`: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "auto", "log `FORMAT`: auto (journald under systemd, else JSON on stderr), journald, json or console")
	fs.StringVar(&c.slice, "slice", "corral.slice", "systemd `SLICE` for execution scopes")
	fs.StringVar(&c.cgroupBase, "cgroup-base", "", "cgroup v2 `DIR` for execution cgroups (default: <own cgroup>/corral)")
	fs.BoolVar(&c.showVersion, "version", false, "print the version and exit")
	fs.DurationVar(&c.defTimeout, "default-timeout", 30*time.Second, "exec.start timeout_ms default")
	fs.DurationVar(&c.defGrace, "default-grace", 2*time.Second, "exec.start grace_ms default")
	fs.Int64Var(&c.defTasks, "default-tasks-max", 256, "exec.start tasks_max default")
	fs.Int64Var(&c.defOutput, "default-output-limit", 262144, "exec.start output_limit_bytes default, in `BYTES`")
	fs.DurationVar(&c.sampleEvery, "sample-interval", 100*time.Millisecond, "how often cgroup counters are sampled for cpu_ms and OOM")
	fs.IntVar(&c.poolSize, "pool-size", -1, "`N` shims kept waiting in scopes of their own for the next commands that need one (0: start each inline; -1: 4 under the systemd backend, 2 under cgroup and pgroup)")
	fs.StringVar(&c.storeKind, "store", "sqlite", "execution store: sqlite (durable, in the state dir) or memory (nothing survives a restart; for benchmarks and throw-away hosts)")
	fs.StringVar(&c.storeSync, "store-sync", "normal", "store durability: normal (survives a crash of corrald, not of the machine; no fsync per transition) or full (fsync per group commit)")
	fs.StringVar(&c.shim, "shim", "", "what children start through: a corral-shim `PATH`, \"self\" (re-execute corrald), or empty for corral-shim next to corrald if it is there, else self")
	fs.BoolVar(&c.noFdStore, "no-fd-store", false, "do not park executions' fds in systemd's fd store: a crash of corrald then ends them (lost)")
	fs.BoolVar(&c.noPidfdExitInfo, "no-pidfd-exit-info", false, "act as on a kernel without PIDFD_INFO_EXIT: an execution whose main process exited while corrald was down ends lost")
	fs.DurationVar(&c.watchdogTick, "watchdog-interval", 0, "override the watchdog ping interval (default: half of WatchdogSec)")
	cli.VarNames(fs, map[string]string{"store": "KIND", "store-sync": "MODE"})
	fs.StringVar(&c.metricsAddr, "metrics-listen", "", "serve Prometheus metrics at /metrics on `ADDR`: a loopback HOST:PORT (127.0.0.1:9464) or unix:PATH (default: off)")
	c.showHelp = cli.HelpFlag(fs)
	fs.BoolVar(&c.showMan, "man-page", false, "print the corrald(8) man page in roff and exit")
	_ = fs.MarkHidden("man-page")
	fs.DurationVar(&c.testAdoptDelay, "test-adopt-delay", 0, "tests only: hold every started child this long before the loop takes it up")
	_ = fs.MarkHidden("test-adopt-delay")
	return fs
}

// parseConfig parses args, then fills every flag not given on the command
// line from the config file.
func parseConfig(args []string) (*config, error) {
	c := &config{}
	fs := newFlagSet(c, os.Stderr)
	// pflag prints nothing on a parse error with ContinueOnError; main
	// prints the error once, with a pointer to --help.
	fs.Usage = func() {}
	if err := fs.Parse(singleDashLong(fs, args)); err != nil {
		return nil, err
	}
	if *c.showHelp {
		printHelp(os.Stdout, fs)
		return nil, errHelpShown
	}
	if c.showMan {
		writeManPage(os.Stdout, fs)
		return nil, errHelpShown
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	path, explicit := c.configFile, c.configFile != ""
	if !explicit {
		path = defaultConfigFile
	}
	f, err := os.Open(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return c, c.check()
		}
		return nil, fmt.Errorf("config: %w", err) // "open PATH: ...", from os
	}
	defer f.Close()
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	if err := applyConfigFile(fs, f, set); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, c.check()
}

// check refuses values every flag's type accepts but corrald cannot run
// with.
func (c *config) check() error {
	if c.retention <= 0 {
		// The sweeper deletes what was cleaned before now - retention: 0
		// or less would delete every record as soon as it is cleaned.
		return fmt.Errorf("--retention %v: must be positive (how long cleaned records stay queryable)", c.retention)
	}
	return nil
}

// singleDashLong rewrites "-name" and "-name=value" to "--name..." when name
// is a long flag of fs, so that command lines written for Go's flag package
// (which took one dash) keep working.
func singleDashLong(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if len(name) > 1 && fs.Lookup(name) != nil {
			out[i] = "-" + a
		}
	}
	return out
}

// applyConfigFile reads "name = value" lines ('#' starts a comment) and sets
// each flag not in skip.
func applyConfigFile(fs *pflag.FlagSet, r io.Reader, skip map[string]bool) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("line %d: want name = value", n)
		}
		name, value = strings.TrimSpace(name), strings.Trim(strings.TrimSpace(value), `"`)
		if f := fs.Lookup(name); f == nil || f.Hidden || name == "config" || name == "help" {
			return fmt.Errorf("line %d: unknown setting %q", n, name)
		}
		if skip[name] {
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("line %d: %s: %w", n, name, err)
		}
	}
	return sc.Err()
}

// octalMode is a flag holding permission bits, shown and parsed in octal
// ("0660"; a leading 0 is optional).
type octalMode uint32

func (m *octalMode) String() string { return fmt.Sprintf("%#o", uint32(*m)) }
func (m *octalMode) Type() string   { return "mode" }
func (m *octalMode) Set(s string) error {
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return fmt.Errorf("invalid mode %q: want octal permission bits such as 0660", s)
	}
	*m = octalMode(n)
	return nil
}
