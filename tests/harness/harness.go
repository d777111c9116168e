// Package harness boots a private, real systemd as PID 1 of private pid,
// mount, cgroup, uts and ipc namespaces, for integration tests that need a
// service manager (transient scopes over D-Bus, journald, socket units).
//
// Typical use, in an integration test package:
//
//	func TestMain(m *testing.M) { os.Exit(harness.RunInside(m)) }
//
//	func TestSomething(t *testing.T) {
//		harness.Require(t) // skips with a reason unless running inside
//		...
//	}
//
// RunInside boots one systemd for the whole package and re-runs the test
// binary inside it, so the tests see that systemd as the host's.
// Tests that want to drive a systemd from outside call Boot directly.
//
// Layout inside the namespaces: fresh tmpfs on /run, /tmp, /var/tmp and
// /var/log; fresh cgroup mounts (same layout as the host: pure v2, hybrid or
// legacy) whose roots are the harness's own child cgroups; the unit directory
// at InsideUnitDir (the only directory on SYSTEMD_UNIT_PATH); the host's /tmp
// and /var/tmp at InsideHostTmp and InsideHostVarTmp (so a test binary built
// under /tmp can still be run); everything else (/, /work, /etc, /dev, the
// network) is the host's.
//
// Pitfalls found while building this (keep them in mind when changing it):
//
//   - NEVER start systemd with the default unit path: it would run the host's
//     units (getty, tmpfiles cleaning /tmp, udev...). SYSTEMD_UNIT_PATH must
//     not end in ':' (a trailing colon appends the default path). Generators
//     still run with an explicit unit path (their output is just ignored), so
//     SYSTEMD_GENERATOR_PATH and SYSTEMD_ENVIRONMENT_GENERATOR_PATH point at an
//     empty directory too; that also saves boot time.
//   - The cgroup namespace's root is the cgroup of the process at unshare
//     time, in every hierarchy. So the process that calls unshare must first
//     move itself into the child cgroups of ALL hierarchies (v1 and v2);
//     CLONE_INTO_CGROUP only covers v2. We do it in a tiny shell that writes
//     its own pid into each cgroup.procs and then execs unshare.
//   - /proc/self/cgroup is read once: it changes under a reader when the
//     process moves.
//   - v1 cpuset children start with empty cpuset.cpus/mems and refuse tasks
//     until both are copied from the parent.
//   - The stock systemd-journald.service pulls systemd-journald-dev-log.socket
//     which symlinks /dev/log on the HOST's /dev (devtmpfs is shared even in a
//     private mount namespace). Our units are written by hand and never touch
//     /dev.
//   - Mounting a fresh tmpfs on /tmp hides a go test binary (built under
//     /tmp/go-build...) and go test's -test.testlogfile; RunInside rewrites
//     such paths to InsideHostTmp.
//   - nsenter into a mount namespace resets the cwd to "/"; Command passes
//     --wd explicitly.
//   - nsenter -C only enters the cgroup namespace, not a cgroup: the process
//     would stay in the host cgroup, outside systemd's tree (its
//     /proc/self/cgroup reads "/.."). And on a cgroup2 mounted with
//     nsdelegate (pure v2 systemd hosts) nothing inside the namespace, not
//     even its systemd, may move a process in from outside. So commands
//     enter the harness's cgroups from outside first (a tiny shell writes
//     cgroup.procs, then execs nsenter), and Command then runs the program
//     via systemd-run --scope, which moves it into a transient scope.
//   - Killing nsenter does not kill the program it started inside (nsenter
//     has no --kill-child); Close tears everything down anyway.
//   - PID 1 systemd always reopens /dev/console for its log, even in a
//     container, and wants a tty there: without care it writes to the
//     host's console. We bind a pty of ours over /dev/console. Keep a slave
//     fd open: a master with no open slave reads EIO, and a slave whose
//     master is gone fails to open with EIO, which systemd retries for a
//     second per log line (a 30 s boot).
//   - journald imports /dev/kmsg (the host's kernel log) unless it is
//     /dev/null, as under systemd-nspawn; we bind /dev/null over it.
//   - On pure v2, cgroup2 cannot be mounted right on top of the host's
//     cgroup2 mount (same superblock at the same place: EBUSY); the init
//     script lazily unmounts it first. Tested by running the harness tests
//     in a mount namespace whose /sys/fs/cgroup is only the unified
//     hierarchy.
//   - The namespace's root cgroup must end up holding no process but
//     systemd (which moves itself to init.scope): on v2 a cgroup with
//     processes cannot enable controllers for its children. unshare, which
//     had to be in the child cgroup to make it the namespace root, is moved
//     back to our own cgroup before init.sh is allowed to exec systemd.
//   - Closing: SIGKILL systemd and let unshare reap it. cgroup.kill on the
//     child cgroup first would also kill unshare, leaving a zombie systemd
//     for the host's PID 1.
//   - In the hybrid layout systemd gives a unit its v1 cpuacct/memory/pids
//     cgroups only with CPUAccounting=/MemoryAccounting=/TasksAccounting=yes;
//     the name=systemd and unified hierarchies always have it.
//   - Pdeathsig (set on the unshare process, which passes it on to the
//     namespace's init with --kill-child) fires when the Go *thread* that
//     started it exits; Go threads normally live as long as the process, so
//     a crashed test binary still takes its systemd down, but its child
//     cgroups are then left behind (named corral-harness-<pid>-<n>).
package harness

import (
	"os"
	"os/exec"
	"sync"
	"time"
)

// Paths inside the harness's namespaces.
const (
	// InsideRoot is a bind mount of the harness's host temp dir.
	InsideRoot = "/run/corral-harness"
	// InsideUnitDir is the only directory on systemd's unit path.
	InsideUnitDir = InsideRoot + "/units"
	// InsideHostTmp is the host's /tmp (hidden by a fresh tmpfs on /tmp).
	InsideHostTmp = "/run/corral-harness-host/tmp"
	// InsideHostVarTmp is the host's /var/tmp.
	InsideHostVarTmp = "/run/corral-harness-host/var/tmp"
)

// Environment variables understood by RunInside and Require.
const (
	// EnvInside is set (to "1") in the environment of a test binary that
	// RunInside re-ran inside a harness systemd.
	EnvInside = "CORRAL_HARNESS_INSIDE"
	// EnvUnavailable carries the reason RunInside could not boot a systemd;
	// Require skips with it.
	EnvUnavailable = "CORRAL_HARNESS_UNAVAILABLE"
	// EnvUnitDir is set inside to InsideUnitDir.
	EnvUnitDir = "CORRAL_HARNESS_UNIT_DIR"
)

// Container is the value of $container given to the harness systemd.
const Container = "corral-test"

// TargetName is the target systemd is started with (--unit=). It wants the
// journal, D-Bus and every unit listed in Options.Start.
const TargetName = "corral-harness.target"

// Options configure Boot. The zero value boots journald and D-Bus only.
type Options struct {
	// Units are extra unit files (name -> content) written into the unit
	// directory before systemd starts. A name that collides with a stock
	// harness unit replaces it.
	Units map[string]string
	// Start lists units that TargetName wants, so they are started at boot
	// (for example a socket unit from Units).
	Start []string
	// Env is extra KEY=VALUE environment for systemd (PID 1). Note that
	// systemd does not pass its environment on to services; use
	// DefaultEnvironment= or Environment= in units for that.
	Env []string
	// Timeout bounds the boot (until `systemctl is-system-running --wait`
	// answers); default 20 s.
	Timeout time.Duration
	// SystemdPath is the systemd binary; default /lib/systemd/systemd.
	SystemdPath string
}

// Systemd is a booted private systemd. Its methods are safe for concurrent
// use; Close is idempotent and terminal: after it, Command must not be used.
type Systemd struct {
	dir     string // host temp dir: units/, init scripts, systemd.log
	initPID int    // host pid of the namespaces' PID 1 (systemd)
	unshare *exec.Cmd
	exited  chan struct{} // closed when unshare has been waited for
	waitErr error         // valid after exited is closed
	cgroups []*hierarchy
	// execProcs are the host paths of the cgroup.procs files commands enter
	// before nsenter (see Boot).
	execProcs []string
	logFile   *os.File
	// consoleDone is closed when the console pty copier has finished.
	consoleDone  chan struct{}
	consoleSlave *os.File // held open until systemd is gone (see openConsole)
	state        string   // what is-system-running answered at boot

	closeOnce sync.Once
	closeErr  error
}

// PID is the host pid of the namespaces' PID 1, the systemd.
func (s *Systemd) PID() int { return s.initPID }

// UnitDir is the host path of the unit directory (InsideUnitDir inside).
// After changing it, run `systemctl daemon-reload` inside.
func (s *Systemd) UnitDir() string { return s.dir + "/units" }

// LogPath is the host path of systemd's console output (kept until Close).
func (s *Systemd) LogPath() string { return s.dir + "/systemd.log" }

// BootState is what `systemctl is-system-running --wait` answered at boot:
// "running" or "degraded".
func (s *Systemd) BootState() string { return s.state }
