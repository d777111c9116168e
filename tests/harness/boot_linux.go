package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

var bootSeq atomic.Int64

const defaultSystemd = "/lib/systemd/systemd"

// Unavailable says why a harness systemd cannot be booted here, or "" if it
// probably can.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := os.Stat(defaultSystemd); err != nil {
		return "systemd not installed (" + defaultSystemd + ")"
	}
	for _, tool := range []string{"unshare", "nsenter", "systemctl", "systemd-run", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found"
		}
	}
	if _, err := os.Stat("/proc/self/ns/cgroup"); err != nil {
		return "kernel without cgroup namespaces"
	}
	if _, err := os.Stat(cgroupRoot); err != nil {
		return "no " + cgroupRoot
	}
	return ""
}

// outerScript runs in the host namespaces: it moves itself into the child
// cgroups of every hierarchy, then becomes unshare. Moving first is what
// makes the child cgroups the roots of the new cgroup namespace.
const outerScript = `set -e
h=$1; pts=$2; shift 2
for f in "$@"; do echo $$ > "$f"; done
exec unshare --pid --mount --cgroup --uts --ipc --fork --kill-child=SIGKILL --propagation private /bin/sh "$h/init.sh" "$h" "$pts"
`

// initScript runs as PID 1 of the new namespaces and execs systemd.
func initScript(lay *cgroupLayout, systemd string) string {
	var b strings.Builder
	b.WriteString(`set -eu
h=$1
# Wait until Boot has moved unshare out of our cgroups (at most 20 s).
i=0
while [ ! -e "$h/go" ]; do
	i=$((i+1)); [ $i -le 4000 ] || { echo "harness: no go-ahead from Boot" >&2; exit 1; }
	sleep 0.005
done
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p ` + InsideRoot + ` ` + InsideHostTmp + ` ` + InsideHostVarTmp + `
mount --bind "$h" ` + InsideRoot + `
# Keep the host's /tmp reachable (a go test binary lives there) before hiding it.
mount --rbind /tmp ` + InsideHostTmp + `
mount --rbind /var/tmp ` + InsideHostVarTmp + `
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /var/log
`)
	b.WriteString(lay.mountScript())
	b.WriteString(`# PID 1 systemd always reopens /dev/console for its own log (even in a
# container): give it a pty of ours instead of the host's console.
mount --bind "$2" /dev/console
# journald would import the host's kernel log (and the kernel's ring is
# shared): show it an empty one, as systemd-nspawn does.
mount --bind /dev/null /dev/kmsg
hostname corral-harness
# Never let systemd see the default unit path: it would start the host's
# services. No trailing ':' (that appends the defaults).
export container=` + Container + `
export SYSTEMD_UNIT_PATH=` + InsideUnitDir + `
export SYSTEMD_GENERATOR_PATH=` + InsideRoot + `/empty
export SYSTEMD_ENVIRONMENT_GENERATOR_PATH=` + InsideRoot + `/empty
exec ` + shellQuote(systemd) + ` --system --unit=` + TargetName + ` --log-target=console --log-level=info --log-color=no --show-status=no
`)
	return b.String()
}

// Boot starts a private systemd and waits until it has finished starting
// up. The caller must Close it. On error nothing is left behind (except
// the temp dir if CORRAL_HARNESS_KEEP is set).
func Boot(opts Options) (*Systemd, error) {
	if reason := Unavailable(); reason != "" {
		return nil, fmt.Errorf("boot harness systemd: %s", reason)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 20 * time.Second
	}
	if opts.SystemdPath == "" {
		opts.SystemdPath = defaultSystemd
	}
	for _, kv := range opts.Env {
		if strings.HasPrefix(kv, "SYSTEMD_UNIT_PATH=") {
			return nil, errors.New("boot harness systemd: Options.Env must not set SYSTEMD_UNIT_PATH")
		}
	}
	deadline := time.Now().Add(opts.Timeout)

	dir, err := os.MkdirTemp("", "corral-harness-")
	if err != nil {
		return nil, fmt.Errorf("boot harness systemd: %w", err)
	}
	s := &Systemd{dir: dir, exited: make(chan struct{})}
	fail := func(err error) (*Systemd, error) {
		err = fmt.Errorf("boot harness systemd: %w%s", err, s.logTail())
		_ = s.Close()
		return nil, err
	}
	if err := writeUnits(s.UnitDir(), opts.Units, opts.Start); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		return fail(err)
	}

	lay, err := discoverCgroups()
	if err != nil {
		return fail(err)
	}
	name := fmt.Sprintf("corral-harness-%d-%d", os.Getpid(), bootSeq.Add(1))
	if err := lay.create(name); err != nil {
		return fail(err)
	}
	s.cgroups = lay.hierarchies
	// Commands run inside enter the harness's cgroups from OUTSIDE, before
	// nsenter: on a cgroup2 mounted with nsdelegate (pure v2 hosts) a process
	// in a cgroup namespace cannot be moved in from a cgroup outside it, not
	// even by systemd-run --scope. v1 hierarchies take them at the namespace
	// root; v2 ones need a leaf, since systemd enables controllers at the
	// root and a cgroup with controllers enabled may hold no processes.
	for _, h := range lay.hierarchies {
		dst := h.child
		if h.v2 {
			dst = filepath.Join(h.child, execCgroup)
			if err := os.Mkdir(dst, 0o755); err != nil {
				return fail(fmt.Errorf("create cgroup %s: %w", dst, err))
			}
		}
		s.execProcs = append(s.execProcs, filepath.Join(dst, "cgroup.procs"))
	}
	if err := os.WriteFile(filepath.Join(dir, "init.sh"), []byte(initScript(lay, opts.SystemdPath)), 0o644); err != nil {
		return fail(err)
	}
	s.logFile, err = os.Create(s.LogPath())
	if err != nil {
		return fail(err)
	}

	master, slave, pts, err := openConsole()
	if err != nil {
		return fail(err)
	}
	s.consoleSlave = slave
	s.consoleDone = make(chan struct{})
	go copyConsole(master, s.logFile, s.consoleDone)

	args := append([]string{"-c", outerScript, "sh", dir, pts}, lay.procsFiles()...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
	}, opts.Env...)
	cmd.Stdout = s.logFile
	cmd.Stderr = s.logFile
	cmd.Dir = "/"
	// If this process dies, unshare dies, and --kill-child takes systemd
	// (and with it the whole pid namespace) down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start unshare: %w", err))
	}
	s.unshare = cmd
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()

	// The namespaces' PID 1 is unshare's only child.
	for s.initPID == 0 {
		if pid := onlyChild(cmd.Process.Pid); pid > 0 {
			s.initPID = pid
			break
		}
		if err := s.pause(deadline); err != nil {
			return fail(fmt.Errorf("wait for namespace init: %w", err))
		}
	}
	// unshare goes back to our own cgroups, so that the namespace's root
	// cgroup holds no process but its init: on cgroup v2, systemd can only
	// enable controllers for its children in a root without processes. Only
	// then may init.sh exec systemd.
	for _, h := range lay.hierarchies {
		if err := os.WriteFile(filepath.Join(h.parent, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			return fail(fmt.Errorf("move unshare out of %s: %w", h.child, err))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		return fail(err)
	}
	// The private bus socket appears once the manager is up.
	private := fmt.Sprintf("/proc/%d/root/run/systemd/private", s.initPID)
	for {
		if _, err := os.Stat(private); err == nil {
			break
		}
		if err := s.pause(deadline); err != nil {
			return fail(fmt.Errorf("wait for systemd manager: %w", err))
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out, err := s.RawCommand(ctx, "systemctl", "is-system-running", "--wait").Output()
	s.state = strings.TrimSpace(string(out))
	if s.state != "running" && s.state != "degraded" {
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		failed, _ := s.RawCommand(fctx, "systemctl", "--failed", "--no-legend").Output()
		fcancel()
		return fail(fmt.Errorf("systemd state %q (%v); failed units: %s", s.state, err, bytes.TrimSpace(failed)))
	}
	return s, nil
}

// pause sleeps a little, failing if unshare exited or the deadline passed.
func (s *Systemd) pause(deadline time.Time) error {
	select {
	case <-s.exited:
		return fmt.Errorf("unshare exited: %v", s.waitErr)
	case <-time.After(5 * time.Millisecond):
	}
	if time.Now().After(deadline) {
		return errors.New("timed out")
	}
	return nil
}

// onlyChild returns the first child of pid, or 0.
func onlyChild(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

func (s *Systemd) logTail() string {
	data, err := os.ReadFile(s.LogPath())
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return "\nsystemd log (tail):\n" + string(data)
}

// execCgroup is the leaf under the harness's v2 child cgroup that commands
// started by Command and RawCommand enter before nsenter.
const execCgroup = "harness-exec"

// enterScript moves the shell into the cgroups given as $1 (host paths),
// then execs the rest of its arguments (nsenter ...).
const enterScript = `p=$1; shift
for f in $p; do echo $$ >"$f" || { echo "harness: cannot enter cgroup $f" >&2; exit 125; }; done
exec "$@"`

// command enters the harness's cgroups, then all its namespaces, keeping
// the caller's working directory (entering a mount namespace resets it to
// "/"), and runs argv.
//
// The directory is entered inside, by its inside path (InsidePath), not
// with nsenter --wd: nsenter opens that directory before it enters the
// mount namespace, and a working directory on the host's /tmp mount is
// then "unreachable" inside (getcwd fails), which breaks a checkout that
// lives under /tmp.
func (s *Systemd) command(ctx context.Context, argv ...string) *exec.Cmd {
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	a := []string{"-c", enterScript, "sh", strings.Join(s.execProcs, " "),
		"nsenter", "-t", strconv.Itoa(s.initPID), "-p", "-m", "-C", "-u", "-i", "--",
		"/bin/sh", "-c", `cd "$0" && exec "$@"`, InsidePath(wd)}
	return exec.CommandContext(ctx, "/bin/sh", append(a, argv...)...)
}

// Command returns a command that runs name inside the harness's namespaces,
// in a transient scope of its own (systemd-run --scope, with Delegate=yes so
// it may create sub-cgroups), as a child of systemd's cgroup tree rather
// than of the host's. Its environment, stdio and working directory are the
// caller's (set them on the returned Cmd as usual; Dir is ignored: the
// working directory is the caller's at the time of this call). Cancelling
// ctx kills nsenter but not necessarily the program inside; Close does.
func (s *Systemd) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	a := []string{"systemd-run", "--scope", "--quiet", "--collect", "-p", "Delegate=yes", "--", name}
	return s.command(ctx, append(a, args...)...)
}

// RawCommand is Command without the transient scope: the program runs in
// the harness's root cgroup (v1) or a leaf of it named harness-exec (v2),
// which systemd does not manage. Use it for systemctl, journalctl and the
// like, or when systemd itself is in trouble.
func (s *Systemd) RawCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return s.command(ctx, append([]string{name}, args...)...)
}

// Close kills the namespaces' PID 1 (which takes every process inside with
// it), waits for it, and removes the child cgroups and the temp dir (kept
// if CORRAL_HARNESS_KEEP is set). Mounts vanish with the mount namespace.
func (s *Systemd) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Systemd) close() error {
	var errs []error
	if s.initPID > 0 {
		if err := syscall.Kill(s.initPID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill harness init %d: %w", s.initPID, err))
		}
	}
	lay := &cgroupLayout{hierarchies: s.cgroups}
	if s.unshare != nil {
		// unshare reaps its child and exits. Do not cgroup.kill before: the
		// child cgroup holds unshare too, and a killed unshare leaves the
		// dead systemd as a zombie for the host's PID 1 to reap.
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			lay.kill()
			_ = s.unshare.Process.Kill()
			<-s.exited
		}
	}
	lay.kill() // anything that was moved into the cgroups from outside
	if err := lay.remove(len(lay.hierarchies), 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if s.consoleSlave != nil {
		_ = s.consoleSlave.Close()
	}
	if s.consoleDone != nil {
		// The pty reports EIO once systemd, its last user, is gone.
		select {
		case <-s.consoleDone:
		case <-time.After(2 * time.Second):
			errs = append(errs, errors.New("console pty still open"))
		}
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
	if os.Getenv("CORRAL_HARNESS_KEEP") == "" {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove harness dir: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close harness systemd: %w", err)
	}
	return nil
}
