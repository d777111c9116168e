package durability

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

var (
	binDir     string // holds the corrald built for this run
	skipReason string // non-empty: the host cannot run these tests
	cgroupRoot string // the cgroup2 mount the daemons use
	baseSeq    atomic.Int64
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
		return m.Run() // every test skips with the reason
	}
	dir, err := os.MkdirTemp("", "corral-dur-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "durability: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "corrald"), "../../cmd/corrald")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "durability: build corrald: %v\n%s", err, out)
		return 1
	}
	fds, gs := openFDs(), runtime.NumGoroutine()
	code := m.Run()
	if err := checkLeaks(fds, gs); err != nil {
		fmt.Fprintf(os.Stderr, "durability: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// openFDs counts this process's open file descriptors.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// checkLeaks reports file descriptors or goroutines beyond the counts
// before the tests, after giving closing connections a moment to finish.
func checkLeaks(fds, goroutines int) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		nf, ng := openFDs(), runtime.NumGoroutine()
		if nf <= fds && ng <= goroutines {
			return nil
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("leak after the tests: %d fds (before %d), %d goroutines (before %d):\n%s", nf, fds, ng, goroutines, buf)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findCgroup2 returns the cgroup2 mount point (the hybrid layout's
// /sys/fs/cgroup/unified, or a unified /sys/fs/cgroup), or "" if there is
// none whose cgroups can be killed with cgroup.kill.
func findCgroup2() string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			continue
		}
		// cgroup.kill exists in every non-root cgroup from Linux 5.14; look
		// for it in our own.
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
	}
	return ""
}

func requireHost(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip("durability: " + skipReason)
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
	e := &env{
		t: t, dir: dir, state: stateDir, socket: filepath.Join(dir, "corrald.sock"),
		base: filepath.Join(cgroupRoot, fmt.Sprintf("corral-dur-%d-%d", os.Getpid(), baseSeq.Add(1))),
	}
	t.Cleanup(func() {
		if err := removeCgroupTree(e.base); err != nil {
			t.Errorf("clean up cgroup base: %v", err)
		}
	})
	return e
}

// removeCgroupTree kills every process under dir and removes dir and its
// children. A missing dir is fine.
func removeCgroupTree(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if ent.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, ent.Name())); err != nil {
				return err
			}
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rmdir %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
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
		t.Skipf("durability: cannot mount a tmpfs: %v", err)
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
	t       *testing.T
	env     *env
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error
}

// start runs corrald with the env's socket, state dir and cgroup base and
// the cgroup backend, plus args, and returns once it listens. Cleanup stops
// it (SIGTERM, then SIGKILL after 30s) if the test has not.
func (e *env) start(args ...string) *daemon {
	e.t.Helper()
	e.runs++
	d := &daemon{t: e.t, env: e, logPath: filepath.Join(e.dir, fmt.Sprintf("corrald-%d.log", e.runs)), done: make(chan struct{})}
	logf, err := os.Create(d.logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	all := append([]string{"--socket", e.socket, "--state-dir", e.state, "--scope", "cgroup",
		"--cgroup-base", e.base, "--log-level", "debug", "--log-format", "json", "--kill-wait", "2s",
		"--config", "/dev/null", "--socket-group", ""}, args...)
	d.cmd = exec.Command(filepath.Join(binDir, "corrald"), all...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		e.t.Fatal(err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		logf.Close()
		close(d.done)
	}()
	e.t.Cleanup(func() {
		if !d.exited() {
			if err := d.stop(syscall.SIGTERM, 30*time.Second); err != nil {
				e.t.Errorf("stop corrald: %v", err)
			}
		}
		if e.t.Failed() {
			b, _ := os.ReadFile(d.logPath)
			e.t.Logf("corrald run %s log (tail):\n%s", filepath.Base(d.logPath), tail(string(b), 6000))
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c, err := net.Dial("unix", e.socket); err == nil {
			c.Close()
			return d
		}
		if d.exited() || time.Now().After(deadline) {
			b, _ := os.ReadFile(d.logPath)
			e.t.Fatalf("corrald did not listen on %s (exited: %v %v):\n%s", e.socket, d.exited(), d.waitErr, tail(string(b), 6000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends sig and waits up to within for corrald to exit; after that it
// kills it and reports an error.
func (d *daemon) stop(sig syscall.Signal, within time.Duration) error {
	if !d.exited() {
		_ = d.cmd.Process.Signal(sig)
	}
	select {
	case <-d.done:
		return nil
	case <-time.After(within):
		_ = d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("corrald did not exit within %v of %v; killed", within, sig)
	}
}

// kill9 kills corrald with SIGKILL and waits until it is reaped.
func (d *daemon) kill9() {
	d.t.Helper()
	if err := d.stop(syscall.SIGKILL, 10*time.Second); err != nil {
		d.t.Fatal(err)
	}
}

func (d *daemon) client() *ipc.Client {
	d.t.Helper()
	c, err := ipc.Dial(d.env.socket)
	if err != nil {
		d.t.Fatalf("dial: %v", err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
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
