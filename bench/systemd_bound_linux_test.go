package bench

// The (f) step's bound for a design with one transient systemd scope per
// execution and `cleaned` meaning "the scope is removed": the scope made
// ahead of time around a holder process that waits (as corrald's pool
// does), and per execution only what cannot be left out: release the
// holder, which execs /bin/true; see its exit (pidfd) and reap it; wait
// until systemd announces the unit unloaded (UnitRemoved on its private
// socket, as corrald's Remove waits for it) and its cgroup is gone. No
// daemon, store or RPC.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/shim"
	"github.com/corral-dev/corral/tests/testd"
)

// Environment of the measuring process inside: the holders' binaries (the
// bound's sides are left out when unset).
const (
	sdHolderEnv   = "CORRAL_BENCH_SYSTEMD_HOLDER"
	sdGoHolderEnv = "CORRAL_BENCH_SYSTEMD_GOHOLDER"
	sdShimEnv     = "CORRAL_BENCH_SYSTEMD_SHIM" // corral-shim, pinned with shim.UseBinary
)

// Sides of the bound, as keys of the inside process's JSON; their two
// phases are boundKey(side, i) for boundPhases[i].
const (
	sdBoundC    = "bound: C holder in a scope made ahead"
	sdBoundGo   = "bound: Go holder in a scope made ahead"
	sdBoundShim = "bound: corral-shim in a scope made ahead"
)

var boundPhases = []string{"release → exit seen", "exit → unit removed"}

func boundKey(side string, i int) string { return side + " / " + boundPhases[i] }

// buildHolders compiles bench/testdata/scope_holder.c with cc -O2 (as
// spawn_peer.c is) and builds bench/testdata/goholder into dir; a path is
// empty, with the reason in why, when its tool is missing.
func buildHolders(dir string) (cHolder, goHolder string, why []string, err error) {
	if cc, lerr := exec.LookPath("cc"); lerr != nil {
		why = append(why, "no C compiler (cc) on PATH: the C holder's side is left out")
	} else {
		src, aerr := filepath.Abs("testdata/scope_holder.c")
		if aerr != nil {
			return "", "", nil, aerr
		}
		cHolder = filepath.Join(dir, "scope_holder")
		if out, cerr := exec.Command(cc, "-O2", "-o", cHolder, src).CombinedOutput(); cerr != nil {
			return "", "", nil, fmt.Errorf("compile %s: %w\n%s", src, cerr, out)
		}
	}
	goHolder = filepath.Join(dir, "goholder")
	cmd := exec.Command(testd.GoTool(), "build", "-trimpath", "-o", goHolder, "./testdata/goholder")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, berr := cmd.CombinedOutput(); berr != nil {
		return "", "", nil, fmt.Errorf("build testdata/goholder: %w\n%s", berr, out)
	}
	return cHolder, goHolder, why, nil
}

// sdBoundBus is the bound's one connection to systemd's private socket
// (EXTERNAL auth, no Hello, as corrald's backend dials it). systemd sends
// every unit and job signal to every private connection; the connection's
// signal handler (DeliverSignal, on godbus's reading goroutine, never
// blocking) closes the channel of a unit announced removed and passes a
// unit's job result on. mu guards the maps.
type sdBoundBus struct {
	conn *dbus.Conn
	// cgroot is the unified hierarchy's mount point (the scope's cgroup
	// is cgroot + the 0:: line of the holder's /proc/<pid>/cgroup).
	cgroot string

	mu      sync.Mutex
	removed map[string]chan struct{} // unit -> closed at its UnitRemoved
	jobs    map[string]chan string   // unit -> its job's result (JobRemoved)
}

func dialBoundBus() (*sdBoundBus, error) {
	cgroot, err := unifiedMount()
	if err != nil {
		return nil, err
	}
	b := &sdBoundBus{cgroot: cgroot, removed: map[string]chan struct{}{}, jobs: map[string]chan string{}}
	conn, err := dbus.Dial("unix:path=/run/systemd/private", dbus.WithSignalHandler(b))
	if err != nil {
		return nil, fmt.Errorf("dial systemd's private socket: %w", err)
	}
	if err := conn.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("auth on systemd's private socket: %w", err)
	}
	b.conn = conn
	return b, nil
}

// unifiedMount is where the cgroup2 hierarchy is mounted (the unified one
// of a hybrid layout).
func unifiedMount() (string, error) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("no cgroup2 hierarchy mounted")
}

func (b *sdBoundBus) DeliverSignal(_, _ string, sig *dbus.Signal) {
	switch sig.Name {
	case "org.freedesktop.systemd1.Manager.UnitRemoved":
		if len(sig.Body) < 1 {
			return
		}
		unit, _ := sig.Body[0].(string)
		b.mu.Lock()
		if ch, ok := b.removed[unit]; ok {
			close(ch)
			delete(b.removed, unit)
		}
		b.mu.Unlock()
	case "org.freedesktop.systemd1.Manager.JobRemoved":
		if len(sig.Body) < 4 {
			return
		}
		unit, _ := sig.Body[2].(string)
		res, _ := sig.Body[3].(string)
		b.mu.Lock()
		if ch, ok := b.jobs[unit]; ok {
			ch <- res // buffered, one job per unit at a time
			delete(b.jobs, unit)
		}
		b.mu.Unlock()
	}
}

// watch registers for unit's next job result and its removal; call it
// before the job is queued.
func (b *sdBoundBus) watch(unit string) (job <-chan string, removed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	j, r := make(chan string, 1), make(chan struct{})
	b.jobs[unit], b.removed[unit] = j, r
	return j, r
}

func (b *sdBoundBus) forget(unit string) {
	b.mu.Lock()
	delete(b.jobs, unit)
	delete(b.removed, unit)
	b.mu.Unlock()
}

func (b *sdBoundBus) manager() dbus.BusObject {
	return b.conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
}

func (b *sdBoundBus) close() { b.conn.Close() }

// sdHeld is one holder waiting in its scope.
type sdHeld struct {
	unit    string
	cmd     *exec.Cmd
	release func() error // lets the holder exec /bin/true
	done    func()       // closes what the parent holds for the holder; idempotent
	pidfd   int
	removed <-chan struct{}
	cgroup  string    // the scope's unified cgroup directory
	ready   time.Time // when its start job ended
	started bool      // StartTransientUnit was accepted: the unit may exist
}

// boundProps are the properties corrald's backend gives a pooled scope
// (scope.systemdScope.properties with the default tasks_max, 256), so that
// systemd does the same work to set it up and tear it down.
func boundProps(unit, slice string, pid int) []sddbus.Property {
	return []sddbus.Property{
		sddbus.PropDescription("corral bench bound " + unit),
		sddbus.PropSlice(slice),
		sddbus.PropPids(uint32(pid)),
		{Name: "CollectMode", Value: dbus.MakeVariant("inactive-or-failed")},
		{Name: "CPUAccounting", Value: dbus.MakeVariant(true)},
		{Name: "MemoryAccounting", Value: dbus.MakeVariant(true)},
		{Name: "TasksAccounting", Value: dbus.MakeVariant(true)},
		{Name: "OOMPolicy", Value: dbus.MakeVariant("continue")},
		{Name: "TimeoutStopUSec", Value: dbus.MakeVariant(uint64(10 * time.Second / time.Microsecond))},
		{Name: "TasksMax", Value: dbus.MakeVariant(uint64(256))},
	}
}

// boundHoldTime is how long a scope is left between its start job and its
// release at the least: the kernel holds a cgroup's "populated 0"
// notification until 10-12 ms after its "populated 1" (when systemd moved
// the holder in), which corrald's pooled scopes, made well ahead, never
// wait for (corrald stops a scope younger than this itself: notifyHold).
const boundHoldTime = 15 * time.Millisecond

// sdHolder starts one holder: its process (started), how to release it,
// and what to close once it is done with (also when it never ran).
type sdHolder func() (cmd *exec.Cmd, release func() error, done func(), err error)

// stdinHolder is a holder binary released by one byte on its stdin
// (scope_holder.c, goholder).
func stdinHolder(bin string) sdHolder {
	return func() (*exec.Cmd, func() error, func(), error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("holder pipe: %w", err)
		}
		cmd := exec.Command(bin)
		cmd.Stdin = r
		err = cmd.Start()
		r.Close()
		if err != nil {
			w.Close()
			return nil, nil, nil, fmt.Errorf("start holder %s: %w", bin, err)
		}
		release := func() error {
			_, err := w.Write([]byte{1})
			return err
		}
		return cmd, release, func() { w.Close() }, nil
	}
}

// shimHolder is corrald's own pooled shim (shim.WrapPooled, the binary
// pinned by the caller with shim.UseBinary), released by a dispatch of
// /bin/true as corrald's pool dispatches it (shim.Dispatch: the config
// and three fds over its socket; here stdio on /dev/null, dir a fixed
// directory), with no daemon around it.
func shimHolder(dir string) sdHolder {
	return func() (*exec.Cmd, func() error, func(), error) {
		devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			return nil, nil, nil, err
		}
		cmd := &exec.Cmd{SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
		h, err := shim.WrapPooled(cmd)
		if err != nil {
			devnull.Close()
			return nil, nil, nil, fmt.Errorf("wrap pooled shim: %w", err)
		}
		done := func() {
			h.Close()
			devnull.Close()
		}
		if err := cmd.Start(); err != nil {
			done()
			return nil, nil, nil, fmt.Errorf("start pooled shim: %w", err)
		}
		h.CloseChildEnds()
		cfg := shim.Config{Argv: []string{"/bin/true"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, Dir: dir, NoNewPrivs: true, EnterDirAsRoot: true}
		release := func() error { return h.Dispatch(cfg, devnull, devnull, devnull) }
		return cmd, release, done, nil
	}
}

// hold starts a holder and creates the transient scope unit around it,
// waiting for the start job. On error nothing is left: the holder is
// killed and reaped, the unit stopped and waited for.
func (b *sdBoundBus) hold(ctx context.Context, start sdHolder, unit, slice string) (*sdHeld, error) {
	cmd, release, done, err := start()
	if err != nil {
		return nil, err
	}
	h := &sdHeld{unit: unit, cmd: cmd, release: release, done: done, pidfd: -1}
	fail := func(err error) (*sdHeld, error) {
		b.discard(h)
		return nil, fmt.Errorf("hold %s: %w", unit, err)
	}
	if h.pidfd, err = unix.PidfdOpen(h.cmd.Process.Pid, 0); err != nil {
		return fail(fmt.Errorf("pidfd_open: %w", err))
	}
	job, removed := b.watch(unit)
	h.removed = removed
	var path dbus.ObjectPath
	err = b.manager().CallWithContext(ctx, "org.freedesktop.systemd1.Manager.StartTransientUnit", 0,
		unit, "fail", boundProps(unit, slice, h.cmd.Process.Pid), []sddbus.PropertyCollection{}).Store(&path)
	if err != nil {
		return fail(fmt.Errorf("StartTransientUnit: %w", err))
	}
	h.started = true
	select {
	case res := <-job:
		if res != "done" {
			return fail(fmt.Errorf("start job %s", res))
		}
	case <-ctx.Done():
		return fail(fmt.Errorf("wait for start job %s: %w", path, ctx.Err()))
	}
	h.ready = time.Now()
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", h.cmd.Process.Pid))
	if err != nil {
		return fail(fmt.Errorf("read holder's cgroup: %w", err))
	}
	for _, line := range strings.Split(string(cg), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			h.cgroup = filepath.Join(b.cgroot, rest)
		}
	}
	if !strings.HasSuffix(h.cgroup, "/"+unit) {
		return fail(fmt.Errorf("holder is in cgroup %q, not in its scope's", h.cgroup))
	}
	return h, nil
}

// run is the timed part: release the holder, see its exit on the pidfd and
// reap it (t1), wait for the unit's UnitRemoved and its cgroup gone (t2).
// h is used up, also on error (discard).
func (b *sdBoundBus) run(ctx context.Context, h *sdHeld) (t0, t1, t2 time.Time, err error) {
	if wait := boundHoldTime - time.Since(h.ready); wait > 0 {
		time.Sleep(wait)
	}
	t0 = time.Now()
	if err = h.release(); err != nil {
		b.discard(h)
		return t0, t1, t2, fmt.Errorf("release holder: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
	for {
		_, err = unix.Poll(fds, int(30*time.Second/time.Millisecond))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || fds[0].Revents&unix.POLLIN == 0 {
		b.discard(h)
		return t0, t1, t2, fmt.Errorf("poll holder's pidfd: %v (revents %#x)", err, fds[0].Revents)
	}
	werr := h.cmd.Wait()
	t1 = time.Now()
	unix.Close(h.pidfd)
	h.pidfd = -1
	h.done()
	if werr != nil {
		b.discard(h)
		return t0, t1, t2, fmt.Errorf("holder: %w", werr)
	}
	select {
	case <-h.removed:
	case <-time.After(30 * time.Second):
		b.discard(h)
		return t0, t1, t2, fmt.Errorf("no UnitRemoved for %s within 30s", h.unit)
	case <-ctx.Done():
		b.discard(h)
		return t0, t1, t2, fmt.Errorf("wait for UnitRemoved of %s: %w", h.unit, ctx.Err())
	}
	for wait := 10 * time.Microsecond; ; wait = min(2*wait, time.Millisecond) {
		if _, err := os.Stat(h.cgroup); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Since(t1) > 30*time.Second {
			b.discard(h)
			return t0, t1, t2, fmt.Errorf("cgroup %s still there 30s after its unit was removed", h.cgroup)
		}
		time.Sleep(wait)
	}
	t2 = time.Now()
	b.forget(h.unit)
	return t0, t1, t2, nil
}

// discard ends h without a measurement: the holder killed and reaped, its
// unit stopped and its removal waited for (bounded).
func (b *sdBoundBus) discard(h *sdHeld) {
	h.done()
	if h.cmd.ProcessState == nil {
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
	}
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
		h.pidfd = -1
	}
	if h.started {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var job dbus.ObjectPath
		err := b.manager().CallWithContext(ctx, "org.freedesktop.systemd1.Manager.StopUnit", 0, h.unit, "replace").Store(&job)
		var de dbus.Error
		if err == nil || !errors.As(err, &de) || de.Name != "org.freedesktop.systemd1.NoSuchUnit" {
			select {
			case <-h.removed:
			case <-ctx.Done():
			}
		}
	}
	b.forget(h.unit)
}

// sdBoundSide is one side of the bound: a holder binary, the next scope
// made ahead, and the samples with their phases.
type sdBoundSide struct {
	name   string // the side's key
	b      *sdBoundBus
	holder sdHolder
	prefix string // unit names: prefix + n + ".scope"
	slice  string
	n      int
	next   *sdHeld
	total  []time.Duration
	phases [2][]time.Duration
}

func (s *sdBoundSide) prepare(ctx context.Context) error {
	s.n++
	h, err := s.b.hold(ctx, s.holder, fmt.Sprintf("%s%d.scope", s.prefix, s.n), s.slice)
	if err != nil {
		return err
	}
	s.next = h
	// The holder may still be starting (a Go runtime's start-up runs on
	// after cmd.Start returned): let it settle before the next side's
	// timing begins, so that its start costs no other side.
	time.Sleep(boundSettle)
	return nil
}

// boundSettle is the untimed pause after a holder's scope is made.
const boundSettle = 5 * time.Millisecond

// sample measures the scope made ahead and makes the next one (untimed).
func (s *sdBoundSide) sample(ctx context.Context, record bool) error {
	if s.next == nil {
		if err := s.prepare(ctx); err != nil {
			return err
		}
	}
	h := s.next
	s.next = nil
	t0, t1, t2, err := s.b.run(ctx, h)
	if err != nil {
		return err
	}
	if record {
		s.total = append(s.total, t2.Sub(t0))
		s.phases[0] = append(s.phases[0], t1.Sub(t0))
		s.phases[1] = append(s.phases[1], t2.Sub(t1))
	}
	return s.prepare(ctx)
}

// close discards the scope made ahead, if any.
func (s *sdBoundSide) close() {
	if s.next != nil {
		s.b.discard(s.next)
		s.next = nil
	}
}
