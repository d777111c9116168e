package durability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

var (
	binDir     string // holds the corrald built for this run
	skipReason string // non-empty: the host cannot run these tests
	cgroupRoot string // the cgroup2 mount the daemons use
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	switch {
	case os.Geteuid() != 0:
		skipReason = "needs root (corrald with the cgroup backend, tmpfs mounts)"
	default:
		cgroupRoot = findCgroup2()
		if cgroupRoot == "" {
			skipReason = "needs a cgroup2 hierarchy with cgroup.kill"
		}
	}
	if skipReason != "" {
		return testenv.Main(m) // every test skips with the reason (fails under CORRAL_STRICT=1)
	}
	dir, err := testd.Build("corral-dur-bin-", "corrald", "corral-shim")
	if err != nil {
		fmt.Fprintf(os.Stderr, "durability: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	return testenv.Main(m)
}

// findCgroup2 returns the cgroup2 mount point (the hybrid layout's
// /sys/fs/cgroup/unified, or a unified /sys/fs/cgroup), or "" if there is
// none whose cgroups can be killed with cgroup.kill.
func findCgroup2() string {
	p := testd.Cgroup2Mount()
	if p == "" {
		return ""
	}
	// cgroup.kill exists in every non-root cgroup from Linux 5.14; look for
	// it in our own.
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(l, "0::"); ok {
			if rel == "/" {
				return p // the root has no cgroup.kill; trust the kernel version
			}
			if _, err := os.Stat(filepath.Join(p, rel, "cgroup.kill")); err == nil {
				return p
			}
		}
	}
	return ""
}

func requireHost(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Skip(t, "durability: "+skipReason)
	}
}

// env is what several daemon runs share: a state directory, a socket path
// and a cgroup base. Its cleanup kills whatever is left in the cgroup base
// and removes it.
type env struct {
	t      *testing.T
	dir    string
	state  string
	socket string
	base   string
	runs   int
}

// newEnv makes an env. stateDir "" means a state directory inside the
// test's temp dir.
func newEnv(t *testing.T, stateDir string) *env {
	t.Helper()
	requireHost(t)
	dir := t.TempDir()
	if stateDir == "" {
		stateDir = filepath.Join(dir, "state")
	}
	return &env{
		t: t, dir: dir, state: stateDir, socket: filepath.Join(dir, "corrald.sock"),
		base: testd.CgroupBase(t, cgroupRoot, "corral-dur"),
	}
}

// mountTmpfs mounts a tmpfs of size (mount's size= syntax) on a fresh
// directory and unmounts it in cleanup.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	requireHost(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		testenv.Skipf(t, "durability: cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v; detaching it", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

// daemon is one run of corrald in an env.
type daemon struct {
	*testd.Daemon
	t *testing.T
}

// start runs corrald with the env's socket, state dir and cgroup base and
// the cgroup backend, plus args, and returns once it listens. Cleanup stops
// it (SIGTERM, then SIGKILL after 30s) if the test has not.
func (e *env) start(args ...string) *daemon {
	e.t.Helper()
	e.runs++
	d := testd.Start(e.t, testd.Config{
		Corrald: filepath.Join(binDir, "corrald"),
		Socket:  e.socket, StateDir: e.state, CgroupBase: e.base,
		LogPath: filepath.Join(e.dir, fmt.Sprintf("corrald-%d.log", e.runs)),
		Args:    append([]string{"--scope", "cgroup", "--socket-group", ""}, args...),
	})
	return &daemon{Daemon: d, t: e.t}
}

// kill9 kills corrald with SIGKILL and waits until it is reaped.
func (d *daemon) kill9() {
	d.t.Helper()
	if err := d.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		d.t.Fatal(err)
	}
}

// ctx is a context bounded so that a wedged daemon fails the test instead
// of hanging it.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// rpcCode returns err's JSON-RPC code, or 0 when err is not a JSON-RPC
// error.
func rpcCode(err error) api.Code {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// proc is a process seen alive, identified by pid and start time so that a
// reused pid is not taken for it.
type proc struct {
	pid   int
	start string
}

// statOf returns pid's state letter and start time from /proc/<pid>/stat.
func statOf(pid int) (state byte, start string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, "", false
	}
	return f[0][0], f[19], true
}

// watch records pid as a process that must be gone by the end of the test;
// cleanup SIGKILLs it if it is not.
func watch(t *testing.T, pid int) proc {
	t.Helper()
	state, start, ok := statOf(pid)
	if !ok || state == 'Z' {
		t.Fatalf("process %d is not alive (state %c)", pid, state)
	}
	p := proc{pid: pid, start: start}
	t.Cleanup(func() {
		if p.alive() {
			_ = unix.Kill(p.pid, unix.SIGKILL)
		}
	})
	return p
}

// alive reports whether p still runs (a zombie has ended).
func (p proc) alive() bool {
	state, start, ok := statOf(p.pid)
	return ok && state != 'Z' && start == p.start
}

// cgroupPIDs lists the processes in the cgroup dir.
func cgroupPIDs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %q: %w", dir, f, err)
		}
		pids = append(pids, n)
	}
	return pids, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// waitCleaned waits for id to reach cleaned and returns its record.
func waitCleaned(t *testing.T, c *ipc.Client, id string) api.Record {
	t.Helper()
	rec, err := c.Wait(ctx(t), api.WaitParams{ID: id})
	if err != nil {
		t.Fatalf("exec.wait %s: %v", id, err)
	}
	if rec.State != api.StateCleaned {
		t.Fatalf("exec.wait %s: state %v, want cleaned", id, rec.State)
	}
	return rec
}

// outputRead is one exec.output answer.
type outputRead struct {
	Data   string
	Offset int64
	Next   int64
	Total  int64
	EOF    bool
	Gap    bool
}

// readAll reads a stream of id from offset 0 with exec.output until eof,
// returning every answer.
func readAll(t *testing.T, c *ipc.Client, id, stream string) []outputRead {
	t.Helper()
	var reads []outputRead
	var off int64
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatalf("exec.output %s %s: no eof after %d reads: %+v", id, stream, i, reads)
		}
		res, err := c.Output(ctx(t), api.OutputParams{ID: id, Stream: stream, Offset: off})
		if err != nil {
			t.Fatalf("exec.output %s %s offset %d: %v", id, stream, off, err)
		}
		reads = append(reads, outputRead{Data: string(res.Data), Offset: res.Offset, Next: res.NextOffset,
			Total: res.TotalBytes, EOF: res.EOF, Gap: res.Gap})
		if res.EOF {
			return reads
		}
		if res.NextOffset <= off && !res.Gap {
			t.Fatalf("exec.output %s %s: no progress at offset %d: %+v", id, stream, off, res)
		}
		off = res.NextOffset
	}
}

// joined concatenates the data of reads.
func joined(reads []outputRead) string {
	var b strings.Builder
	for _, r := range reads {
		b.WriteString(r.Data)
	}
	return b.String()
}

func strOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

func outcomeOf(rec api.Record) string {
	if rec.Outcome == nil {
		return "<nil>"
	}
	return string(*rec.Outcome)
}
