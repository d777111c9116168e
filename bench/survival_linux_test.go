package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"
)

// Counts of benchSurvival (CORRAL_BENCH_QUICK lowers them).
var (
	handoverN  = 20   // handovers measured
	adoptN     = 1000 // running executions re-adopted after kill -9
	adoptRound = 3    // rounds of each side
)

// benchSurvival measures surviving corrald itself (issue 9), under the
// cgroup backend:
//
//   - (k1) API unavailability during a handover: a client dials and calls
//     daemon.info in a loop; for each SIGHUP, the longest call that began
//     between the signal and the new image's first answer, against the
//     longest call in a window of the same length without a handover.
//   - (k2) time to re-adopt adoptN running executions after kill -9,
//     against the time the daemon takes to start with none: both from the
//     exec of the new corrald to its READY=1. The fd store is played by the
//     benchmark (fakeFdStore): systemd's protocol, not systemd.
func (s *suite) benchSurvival(t *testing.T) {
	s.benchHandover(t)
	s.benchReadopt(t)
}

func (s *suite) benchHandover(t *testing.T) {
	d := s.startDaemon(t, "handover", "cgroup", 0)
	c := d.Client()
	ctx := ctxT(t, 5*time.Minute)
	for i := 0; i < 20; i++ {
		if _, err := c.Start(ctx, api.StartParams{Argv: []string{"sleep", "600"}, Cwd: "/", TimeoutMS: 600000,
			Env: map[string]string{markEnv: markValue()}}); err != nil {
			t.Fatal(err)
		}
	}
	type call struct {
		start time.Time
		took  time.Duration
		err   error
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			cl, err := ipc.Dial(d.Socket)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err = cl.Info(cctx)
				cancel()
				cl.Close()
			}
			mu.Lock()
			calls = append(calls, call{t0, time.Since(t0), err})
			mu.Unlock()
			time.Sleep(500 * time.Microsecond)
		}
	}()
	longest := func(from, to time.Time) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		var m time.Duration
		for _, c := range calls {
			if !c.start.Before(from) && c.start.Before(to) && c.took > m {
				m = c.took
			}
		}
		return m
	}
	var during, quiet durations
	refused := 0
	for i := 0; i < handoverN; i++ {
		before, err := c.Info(ctx)
		if err != nil {
			c = d.Client()
			if before, err = c.Info(ctx); err != nil {
				t.Fatal(err)
			}
		}
		sig := time.Now()
		if err := d.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		var answered time.Time
		for {
			cl, err := ipc.Dial(d.Socket)
			if err == nil {
				info, ierr := cl.Info(ctx)
				cl.Close()
				if ierr == nil && info.StartedAt.After(before.StartedAt) {
					answered = time.Now()
					break
				}
			}
			if time.Since(sig) > 30*time.Second {
				t.Fatalf("handover %d: no new image after 30s:\n%s", i, d.LogTail(3000))
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // calls begun in the window finish
		during = append(during, longest(sig, answered))
		c = d.Client()
		// The same length of time, no handover.
		q0 := time.Now()
		time.Sleep(answered.Sub(sig) + 100*time.Millisecond)
		quiet = append(quiet, longest(q0, q0.Add(answered.Sub(sig))))
	}
	close(stop)
	wg.Wait()
	for _, c := range calls {
		if c.err != nil && (errors.Is(c.err, syscall.ECONNREFUSED) || errors.Is(c.err, syscall.ENOENT)) {
			refused++
		}
	}
	if refused > 0 {
		t.Errorf("%d connection attempts refused during %d handovers", refused, handoverN)
	}
	info, err := d.Client().Info(ctx)
	if err != nil || info.Running != 20 || info.Adopted != 20 {
		t.Errorf("after %d handovers: running %d adopted %d (%v); want 20, 20", handoverN, info.Running, info.Adopted, err)
	}
	s.latencyTable("(k1) API unavailability during a handover",
		fmt.Sprintf("corrald (cgroup backend, --pool-size 0, 20 `sleep` executions running) gets SIGHUP %d times; a client dials and calls daemon.info in a loop throughout. "+
			"Measured: per handover, the longest call begun between the signal and the new image's first answer (connections wait in the listening socket's backlog: "+
			"%d of %d attempts refused). Baseline: the longest call in a window of the same length right after, without a handover.", handoverN, refused, len(calls)),
		[]latencyRow{{"handover vs none", "longest call during a handover", "longest call, no handover", during, quiet}})
}

func (s *suite) benchReadopt(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	// corrald must see LISTEN_PID as its own pid: a shell sets it and
	// execs corrald, keeping the pid.
	wrapper := filepath.Join(t.TempDir(), "corrald-listen")
	script := "#!/bin/sh\nLISTEN_PID=$$ exec " + s.bin + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	base := testd.StrictCgroupBase(t, cgroupMount, "corral-bench-adopt")
	fs := newFakeFdStore(t, filepath.Join(dir, "notify.sock"))
	runs := 0
	start := func(files []*os.File, names []string) (*testd.Daemon, time.Duration) {
		runs++
		env := []string{"NOTIFY_SOCKET=" + fs.path, "FDSTORE=5120"}
		if len(files) > 0 {
			env = append(env, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
		}
		fs.readyAt() // drain an old READY
		t0 := time.Now()
		d := testd.Start(t, testd.Config{
			Name: "adopt", Corrald: wrapper, Socket: filepath.Join(dir, "s.sock"), StateDir: filepath.Join(dir, "state"),
			LogPath: filepath.Join(dir, fmt.Sprintf("corrald-%d.log", runs)), CgroupBase: base,
			Args: []string{"--scope", "cgroup", "--log-level", "warn", "--max-running", "20000", "--max-per-uid", "20000",
				"--pool-size", "0", "--socket-group", ""},
			Env: env, ExtraFiles: files,
		})
		ready := fs.waitReady(t, 5*time.Minute)
		for _, f := range files {
			f.Close()
		}
		return d, ready.Sub(t0)
	}
	var withN, none durations
	for round := 0; round < 2*adoptRound; round++ {
		n := 0
		if round%2 == 1 {
			n = adoptN
		}
		d, _ := start(nil, nil)
		c := d.Client()
		ids := startSleeps(t, ctx, c, n)
		fs.waitCount(t, 3*n, 5*time.Minute)
		if err := d.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		files, names := fs.take()
		d2, took := start(files, names)
		c2 := d2.Client()
		info, err := c2.Info(ctx)
		if err != nil || info.Adopted != n {
			t.Fatalf("after kill -9 with %d running: adopted %d, %v\n%s", n, info.Adopted, err, d2.LogTail(3000))
		}
		if n > 0 {
			withN = append(withN, took)
		} else {
			none = append(none, took)
		}
		for _, id := range ids {
			if _, err := c2.Cancel(ctx, api.CancelParams{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range ids {
			if rec, err := c2.Wait(ctx, api.WaitParams{ID: id}); err != nil || outcomeOf(rec) != "cancelled" {
				t.Fatalf("adopted %s: %v outcome %s", id, err, outcomeOf(rec))
			}
		}
		if err := d2.Stop(syscall.SIGTERM, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		fs.reset()
	}
	s.latencyTable("(k2) re-adopting running executions after kill -9",
		fmt.Sprintf("corrald (cgroup backend, --pool-size 0) with %d `sleep` executions running is killed with SIGKILL and started again with their fds "+
			"(the benchmark plays systemd's fd store: FDSTORE=1 collected, passed back as LISTEN_FDS/LISTEN_FDNAMES). "+
			"Measured: from the exec of the new corrald to its READY=1, every execution adopted. Baseline: the same with none running. %d rounds per side, alternating.",
			adoptN, adoptRound),
		[]latencyRow{{fmt.Sprintf("%d adopted vs none", adoptN), fmt.Sprintf("start adopting %d", adoptN), "start with none", withN, none}})
}

func outcomeOf(r api.Record) string {
	if r.Outcome == nil {
		return ""
	}
	return string(*r.Outcome)
}

// startSleeps starts n `sleep 600` executions, 16 at a time.
func startSleeps(t *testing.T, ctx context.Context, c *ipc.Client, n int) []string {
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			rec, err := c.Start(ctx, api.StartParams{Argv: []string{"sleep", "600"}, Cwd: "/", TimeoutMS: 900000,
				Env: map[string]string{markEnv: markValue()}})
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			ids[i] = rec.ID
		}(i)
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("start %d sleeps: %v", n, err)
	default:
	}
	return ids
}

// fakeFdStore is the part of systemd's notify protocol corrald's fd store
// uses: FDSTORE=1 with FDNAME= and the fds, FDSTOREREMOVE=1, READY=1.
type fakeFdStore struct {
	path  string
	conn  *net.UnixConn
	mu    sync.Mutex
	fds   map[string][]int
	ready chan time.Time
}

func newFakeFdStore(t *testing.T, path string) *fakeFdStore {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadBuffer(8 << 20)
	fs := &fakeFdStore{path: path, conn: conn, fds: map[string][]int{}, ready: make(chan time.Time, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, 4096)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			fs.handle(string(buf[:n]), oob[:oobn])
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
		fs.reset()
	})
	return fs
}

func (fs *fakeFdStore) handle(msg string, oob []byte) {
	vars := map[string]string{}
	for _, l := range strings.Split(msg, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			vars[k] = v
		}
	}
	var fds []int
	if len(oob) > 0 {
		if cms, err := unix.ParseSocketControlMessage(oob); err == nil {
			for i := range cms {
				if got, err := unix.ParseUnixRights(&cms[i]); err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	switch {
	case vars["FDSTORE"] == "1":
		fs.fds[vars["FDNAME"]] = append(fs.fds[vars["FDNAME"]], fds...)
		return
	case vars["FDSTOREREMOVE"] == "1":
		for _, fd := range fs.fds[vars["FDNAME"]] {
			unix.Close(fd)
		}
		delete(fs.fds, vars["FDNAME"])
	case vars["READY"] == "1":
		select {
		case fs.ready <- time.Now():
		default:
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// count is how many fds the store holds.
func (fs *fakeFdStore) count() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := 0
	for _, fds := range fs.fds {
		n += len(fds)
	}
	return n
}

func (fs *fakeFdStore) waitCount(t *testing.T, n int, within time.Duration) {
	deadline := time.Now().Add(within)
	for fs.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("fd store holds %d fds, want %d", fs.count(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// take returns duplicates of the stored fds as files to pass, with their
// names; the store keeps its own, as systemd does.
func (fs *fakeFdStore) take() ([]*os.File, []string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var files []*os.File
	var names []string
	for name, fds := range fs.fds {
		for _, fd := range fds {
			d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				continue
			}
			files = append(files, os.NewFile(uintptr(d), name))
			names = append(names, name)
		}
	}
	return files, names
}

// reset closes every stored fd.
func (fs *fakeFdStore) reset() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for name, fds := range fs.fds {
		for _, fd := range fds {
			unix.Close(fd)
		}
		delete(fs.fds, name)
	}
}

// readyAt drops a READY=1 already received.
func (fs *fakeFdStore) readyAt() {
	for {
		select {
		case <-fs.ready:
		default:
			return
		}
	}
}

func (fs *fakeFdStore) waitReady(t *testing.T, within time.Duration) time.Time {
	select {
	case at := <-fs.ready:
		return at
	case <-time.After(within):
		t.Fatalf("no READY=1 within %v", within)
	}
	return time.Time{}
}
