package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"
)

const tputWindow = time.Second // one measuring window of one side

var (
	tputWindows         = 5 // windows per side, alternating with the baseline
	tputWindows64       = 3 // windows per side with 64 clients (bounds the time)
	drainBytes    int64 = 1_000_000_000
	drainRounds         = 3
)

// rateRow is one comparison of a throughput table: one value per window or
// round on each side.
type rateRow struct {
	name, side, baseName string
	unit                 string
	side1, base          []float64
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := append([]float64(nil), v...)
	sort.Float64s(c)
	return c[(len(c)-1)/2]
}

func minmax(v []float64) (float64, float64) {
	if len(v) == 0 {
		return 0, 0
	}
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

func (s *suite) rateTable(title, note string, rows []rateRow) {
	fmt.Fprintf(&s.out, "\n### %s\n\n", title)
	if note != "" {
		fmt.Fprintf(&s.out, "%s\n\n", note)
	}
	fmt.Fprintf(&s.out, "| comparison | measured | median | min–max | baseline | median | min–max | ratio (median) |\n")
	fmt.Fprintf(&s.out, "|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		a, b := median(r.side1), median(r.base)
		alo, ahi := minmax(r.side1)
		blo, bhi := minmax(r.base)
		fmt.Fprintf(&s.out, "| %s | %s | %.1f %s | %.1f–%.1f | %s | %.1f %s | %.1f–%.1f | %s |\n",
			r.name, r.side, a, r.unit, alo, ahi, r.baseName, b, r.unit, blo, bhi, ratio(a, b))
	}
}

// window runs k workers calling op until d has passed and returns the
// completed operations per second. A worker starts no operation after the
// deadline; the window ends when the last one returns.
func window(k int, d time.Duration, op func(worker int) error) (float64, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		first error
	)
	t0 := time.Now()
	deadline := t0.Add(d)
	for w := 0; w < k; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for time.Now().Before(deadline) {
				if err := op(w); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					break
				}
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(t0).Seconds(), first
}

// timed wraps op so that each call's duration is appended to lat[worker].
func timed(lat []durations, op func(worker int) error) func(worker int) error {
	return func(w int) error {
		t0 := time.Now()
		err := op(w)
		lat[w] = append(lat[w], time.Since(t0))
		return err
	}
}

// merged is every worker's samples together.
func merged(lat []durations) durations {
	var all durations
	for _, l := range lat {
		all = append(all, l...)
	}
	return all
}

// benchThroughput is (d): executions per second of /bin/true (start+wait
// until cleaned) with 1, 8 and 64 clients, each on its own connection,
// against os/exec Run from as many goroutines, and against the C peer doing
// corrald's kernel work (runKernel) from as many worker processes: the
// rate that work allows on this host, whatever the daemon does on top.
// The sides' 1 s windows rotate. It also reads each daemon's CPU time over
// its windows, for the CPU it spends per execution.
func (s *suite) benchThroughput(t *testing.T) {
	d := s.startDaemon(t, "throughput-pool4", "cgroup", 4)
	dnp := s.startDaemon(t, "throughput-pool0", "cgroup", 0)
	sp, spWhy := startSpawnPeer(t)
	// Where the C peer does corrald's kernel work, as in (a).
	spCgroup, spWork := testd.StrictCgroupBase(t, cgroupMount, "corral-bench"), t.TempDir()
	if sp != nil {
		if err := os.Mkdir(spCgroup, 0o755); err != nil {
			t.Fatalf("cgroup base of the C peer: %v", err)
		}
	}
	ctx := ctxT(t, 5*time.Minute)
	var rows []rateRow
	var cpuNotes []string
	for _, k := range []int{1, 8, 64} {
		windows := tputWindows
		if k == 64 {
			windows = tputWindows64
		}
		clients := make([]*ipc.Client, k)
		npClients := make([]*ipc.Client, k)
		for i := range clients {
			clients[i] = d.Client()
			npClients[i] = dnp.Client()
		}
		viaDaemon := func(c *ipc.Client) error { return trueThrough(ctx, c) }
		bare := func(int) error { return exec.Command("/bin/true").Run() }
		// Each call's duration, per worker (one goroutine each), for the
		// target's p50 and p99.
		dLat, bLat := make([]durations, k), make([]durations, k)
		var dr, nr, br, kr []float64
		// The daemons' CPU over their own windows, and the executions done.
		var dCPU, nCPU cpuSpent
		sides := []func(){
			func() {
				r, err := dCPU.window(t, d.pid, k, timed(dLat, func(w int) error { return viaDaemon(clients[w]) }))
				if err != nil {
					t.Fatalf("%d clients: %v", k, err)
				}
				dr = append(dr, r)
			},
			func() {
				r, err := nCPU.window(t, dnp.pid, k, func(w int) error { return viaDaemon(npClients[w]) })
				if err != nil {
					t.Fatalf("%d clients, --pool-size 0: %v", k, err)
				}
				nr = append(nr, r)
			},
			func() {
				r, err := window(k, tputWindow, timed(bLat, bare))
				if err != nil {
					t.Fatalf("%d goroutines os/exec: %v", k, err)
				}
				br = append(br, r)
			},
		}
		if sp != nil {
			sides = append(sides, func() { kr = append(kr, sp.kernelRate(t, k, tputWindow, spCgroup, spWork)) })
		}
		for i := 0; i < windows; i++ {
			rotate(i, sides...)
		}
		if k == 8 {
			s.targetAtLeast("(d) exec/s with 8 clients (pool 4) / os/exec Run from 8 goroutines", median(dr)/median(br), 1.0, "×")
			dlo, dhi := minmax(dr)
			blo, bhi := minmax(br)
			dl, bl := merged(dLat), merged(bLat)
			bound := "the C peer's side was skipped: " + spWhy
			if sp != nil {
				klo, khi := minmax(kr)
				bound = fmt.Sprintf("the bound, corrald's kernel work in C from 8 worker processes: %.0f exec/s (%.0f–%.0f), %s of os/exec, corrald %s of it",
					median(kr), klo, khi, ratio(median(kr), median(br)), ratio(median(dr), median(kr)))
			}
			s.targetDetail("corrald %.0f exec/s (windows %.0f–%.0f), a start+wait p50 %s, p99 %s ms, %s ms of the daemon's CPU per execution; os/exec %.0f exec/s (%.0f–%.0f), a Run p50 %s, p99 %s ms; %s",
				median(dr), dlo, dhi, ms(dl.pct(.5)), ms(dl.pct(.99)), dCPU.perExec(), median(br), blo, bhi, ms(bl.pct(.5)), ms(bl.pct(.99)), bound)
		}
		base := fmt.Sprintf("os/exec Run ×%d goroutines", k)
		name := fmt.Sprintf("%d client(s)", k)
		rows = append(rows,
			rateRow{name: name, side: "corrald cgroup --pool-size 4", baseName: base, unit: "exec/s", side1: dr, base: br},
			rateRow{name: name, side: "corrald cgroup --pool-size 0", baseName: base, unit: "exec/s", side1: nr, base: br},
		)
		if sp != nil {
			kside := fmt.Sprintf("C: corrald's kernel work ×%d workers", k)
			rows = append(rows,
				rateRow{name: name + ", kernel work alone", side: kside, baseName: base, unit: "exec/s", side1: kr, base: br},
				rateRow{name: name + ", corrald vs its kernel work", side: "corrald cgroup --pool-size 4", baseName: kside, unit: "exec/s", side1: dr, base: kr},
			)
		}
		cpuNotes = append(cpuNotes, fmt.Sprintf("%d client(s): pool 4 %s ms (children %s ms), pool 0 %s ms (children %s ms)",
			k, dCPU.perExec(), dCPU.childrenPerExec(), nCPU.perExec(), nCPU.childrenPerExec()))
	}
	kernelNote := "The C side was skipped: " + spWhy + "."
	if sp != nil {
		kernelNote = "The kernel-work side is the C peer of (a) (bench/testdata/spawn_peer.c) doing corrald's kernel work for one /bin/true (mkdir a cgroup and a workspace, two pipes, clone3 into the cgroup, exec in the workspace, both pipes to EOF, waitpid, both rmdirs, the workspace held open across its rmdir as corrald does) in k worker processes forked from it, single-threaded, for the same 1 s window, timed by itself: no daemon, store or RPC, so the rate a design with a fresh cgroup and workspace per execution allows on this host."
	}
	s.rateTable("(d) executions per second, /bin/true",
		fmt.Sprintf("Each client its own connection, looping exec.start + exec.wait (until cleaned), against a daemon with --pool-size 4 and one with --pool-size 0 (cgroup backend, store sqlite sync normal); baseline: as many goroutines looping os/exec Run in the benchmark process. %s "+
			"%d windows of %s per side (%d with 64 clients, to bound the time), the sides rotating; a window ends when the last call started before its deadline returns, and the rate counts over the whole window. The table gives the median window and the range.", kernelNote, tputWindows, tputWindow, tputWindows64),
		rows)
	fmt.Fprintf(&s.out, "\nThe daemons' CPU per execution over their windows (utime + stime of corrald from /proc/<pid>/stat, at USER_HZ 100, divided by the executions completed; children: the cutime + cstime of the /bin/true processes it reaped): %s.\n",
		strings.Join(cpuNotes, "; "))
}

// cpuSpent adds up a daemon's CPU time over the windows of its side and
// the executions they completed.
type cpuSpent struct {
	self, children time.Duration
	n              int64
}

// window runs a tputWindow window of k workers calling op against the
// daemon pid (as window does), adding the daemon's CPU time over it and
// the calls it completed.
func (c *cpuSpent) window(t *testing.T, pid, k int, op func(worker int) error) (float64, error) {
	t.Helper()
	var n atomic.Int64
	s0, c0 := procCPU(t, pid)
	r, err := window(k, tputWindow, func(w int) error {
		err := op(w)
		if err == nil {
			n.Add(1)
		}
		return err
	})
	s1, c1 := procCPU(t, pid)
	c.self += s1 - s0
	c.children += c1 - c0
	c.n += n.Load()
	return r, err
}

func (c *cpuSpent) perExec() string {
	if c.n == 0 {
		return "n/a"
	}
	return ms(c.self / time.Duration(c.n))
}

func (c *cpuSpent) childrenPerExec() string {
	if c.n == 0 {
		return "n/a"
	}
	return ms(c.children / time.Duration(c.n))
}

// procCPU is process pid's CPU time from /proc/<pid>/stat: its own (utime
// + stime) and that of its children it reaped (cutime + cstime), in clock
// ticks of USER_HZ, 100 on Linux.
func procCPU(t *testing.T, pid int) (self, children time.Duration) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("CPU time of %d: %v", pid, err)
	}
	// The fields after the command name, "(...)", which may hold spaces:
	// state is field 3, utime 14, stime 15, cutime 16, cstime 17.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 15 {
		t.Fatalf("CPU time of %d: stat %q", pid, b)
	}
	tick := func(s string) time.Duration {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("CPU time of %d: stat field %q: %v", pid, s, err)
		}
		return time.Duration(v) * 10 * time.Millisecond
	}
	return tick(f[11]) + tick(f[12]), tick(f[13]) + tick(f[14])
}

// benchDrain is (e): a child writing 1 GB to stdout as fast as it can,
// through corrald (default output limit: kept head and tail, middle
// counted and dropped) against the same command with stdout on /dev/null
// and with stdout on an os/exec pipe read into io.Discard.
func (s *suite) benchDrain(t *testing.T) {
	d := s.startDaemon(t, "drain", "cgroup", 0)
	c := d.Client()
	py, why := startPyPeer(t)
	ctx := ctxT(t, 5*time.Minute)
	argv := []string{"/usr/bin/head", "-c", fmt.Sprint(drainBytes), "/dev/zero"}
	var viaDaemon, devNull, goPipe, viaPy, spliced, loopRead []float64
	const gb = 1e9
	for i := 0; i < drainRounds; i++ {
		sides := []func(){
			func() {
				t0 := time.Now()
				rec, err := c.Start(ctx, api.StartParams{Argv: argv, TimeoutMS: 300000})
				if err != nil {
					t.Fatalf("exec.start: %v", err)
				}
				rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
				el := time.Since(t0)
				if err != nil {
					t.Fatalf("exec.wait: %v", err)
				}
				if rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Stdout.TotalBytes != drainBytes {
					b, _ := json.Marshal(rec)
					t.Fatalf("head through corrald: want exit 0 and %d stdout bytes counted; got %s", drainBytes, b)
				}
				viaDaemon = append(viaDaemon, float64(drainBytes)/el.Seconds()/gb)
			},
			func() {
				t0 := time.Now()
				if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
					t.Fatalf("head to /dev/null: %v", err)
				}
				devNull = append(devNull, float64(drainBytes)/time.Since(t0).Seconds()/gb)
			},
			func() {
				var n countWriter
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Stdout = &n
				t0 := time.Now()
				if err := cmd.Run(); err != nil {
					t.Fatalf("head to an os/exec pipe: %v", err)
				}
				el := time.Since(t0)
				if int64(n) != drainBytes {
					t.Fatalf("head to an os/exec pipe: read %d bytes, want %d", n, drainBytes)
				}
				goPipe = append(goPipe, float64(drainBytes)/el.Seconds()/gb)
			},
			func() { spliced = append(spliced, float64(drainBytes)/spliceDrain(t, argv).Seconds()/gb) },
			func() { loopRead = append(loopRead, float64(drainBytes)/epollDrain(t, argv).Seconds()/gb) },
		}
		if py != nil {
			sides = append(sides, func() { viaPy = append(viaPy, float64(drainBytes)/py.drain(t, drainBytes).Seconds()/gb) })
		}
		rotate(i, sides...)
	}
	rows := []rateRow{
		{"corrald vs /dev/null", "corrald cgroup", "stdout on /dev/null", "GB/s", viaDaemon, devNull},
		{"corrald vs Go pipe reader", "corrald cgroup", "os/exec pipe → counter", "GB/s", viaDaemon, goPipe},
		{"corrald vs zero-copy reader", "corrald cgroup", "pipe spliced to /dev/null", "GB/s", viaDaemon, spliced},
		{"corrald vs its loop alone", "corrald cgroup", "epoll loop reading corrald's pipe", "GB/s", viaDaemon, loopRead},
		{"its loop alone vs /dev/null", "epoll loop reading corrald's pipe", "stdout on /dev/null", "GB/s", loopRead, devNull},
		{"zero-copy reader vs /dev/null", "pipe spliced to /dev/null", "stdout on /dev/null", "GB/s", spliced, devNull},
		{"Go pipe reader vs /dev/null", "os/exec pipe → counter", "stdout on /dev/null", "GB/s", goPipe, devNull},
	}
	pyNote := "The seed's asyncio run_limited (4096-byte reads, keeps 256,000 bytes, drops the rest) is one more side, timed by the python peer itself."
	if py != nil {
		rows = append(rows,
			rateRow{"run_limited vs /dev/null", "python3 asyncio run_limited", "stdout on /dev/null", "GB/s", viaPy, devNull},
			rateRow{"corrald vs run_limited", "corrald cgroup", "python3 asyncio run_limited", "GB/s", viaDaemon, viaPy},
		)
	} else {
		pyNote = "The seed's run_limited side was skipped: " + why + "."
	}
	s.targetAtLeast("(e) drain through corrald / head -c to /dev/null", median(viaDaemon)/median(devNull), 0.8, "×")
	vlo, vhi := minmax(viaDaemon)
	nlo, nhi := minmax(devNull)
	llo, lhi := minmax(loopRead)
	s.targetDetail("corrald %.2f GB/s (rounds %.2f–%.2f), /dev/null %.2f (%.2f–%.2f); the pipe's bound, an epoll loop reading corrald's pipe (%d KiB) into 1 MiB: %.2f GB/s (%.2f–%.2f), %s of /dev/null, corrald %s of it; the pipe spliced to /dev/null %s of /dev/null",
		median(viaDaemon), vlo, vhi, median(devNull), nlo, nhi, corraldPipeCapacity()>>10, median(loopRead), llo, lhi,
		ratio(median(loopRead), median(devNull)), ratio(median(viaDaemon), median(loopRead)), ratio(median(spliced), median(devNull)))
	s.rateTable("(e) output drain throughput, 1 GB on stdout",
		fmt.Sprintf("`head -c %d /dev/zero`; corrald: exec.start to exec.wait (cleaned), default output_limit_bytes (262144 kept, the rest counted and dropped); "+
			"baselines: os/exec Run with stdout on /dev/null, with stdout on an os/exec pipe copied to a byte counter in the benchmark process, "+
			"with stdout on a pipe as corrald's (%d KiB: F_SETPIPE_SZ to /proc/sys/fs/pipe-max-size, at least 1 MiB) that the benchmark splice(2)s to /dev/null in blocking calls (the bytes leave the pipe without a copy to user space), "+
			"and with stdout on the same pipe, non-blocking, read into a 1 MiB buffer by an epoll loop as corrald's reactor reads it (level-triggered, up to four reads per wake-up) with nothing else to do: the pipe's bound for corrald's design. %d rounds per side, interleaved. "+
			"Daemon: cgroup backend, --pool-size 0. %s",
			drainBytes, corraldPipeCapacity()>>10, drainRounds, pyNote),
		rows)
}

// trueThrough is one /bin/true through corrald on c, for a throughput
// window's workers (hence an error, not a test failure): exec.start, then
// exec.wait until cleaned, which must say exit 0.
func trueThrough(ctx context.Context, c *ipc.Client) error {
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"/bin/true"}})
	if err != nil {
		return fmt.Errorf("exec.start: %w", err)
	}
	rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
	if err != nil {
		return fmt.Errorf("exec.wait: %w", err)
	}
	if rec.ExitCode == nil || *rec.ExitCode != 0 {
		b, _ := json.Marshal(rec)
		return fmt.Errorf("/bin/true did not exit 0: %s", b)
	}
	return nil
}

// corraldPipeCapacity is what corrald asks F_SETPIPE_SZ for on output
// pipes (reactor's pipeCapacity): /proc/sys/fs/pipe-max-size, at least
// 1 MiB, at most 16 MiB.
func corraldPipeCapacity() int {
	n := 1 << 20
	if b, err := os.ReadFile("/proc/sys/fs/pipe-max-size"); err == nil {
		if m, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			n = min(max(m, 1<<20), 16<<20)
		}
	}
	return n
}

// drainPipe is a pipe sized as corrald's output pipes, read end first.
func drainPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatalf("pipe: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, corraldPipeCapacity()); err != nil {
		_, _ = unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, 1<<20)
	}
	return os.NewFile(uintptr(p[0]), "drain-r"), os.NewFile(uintptr(p[1]), "drain-w")
}

// epollDrain runs argv with stdout on a pipe sized as corrald's, its read
// end non-blocking in an epoll set, and reads it as corrald's loop does:
// wait, then up to four reads into a 1 MiB buffer, back to the wait after a
// short read. It returns the elapsed time.
func epollDrain(t *testing.T, argv []string) time.Duration {
	t.Helper()
	r, w := drainPipe(t)
	defer r.Close()
	rfd := int(r.Fd()) // Fd leaves it blocking: set it as corrald does
	if err := unix.SetNonblock(rfd, true); err != nil {
		w.Close()
		t.Fatalf("set nonblock: %v", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		w.Close()
		t.Fatalf("epoll_create1: %v", err)
	}
	defer unix.Close(epfd)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, rfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(rfd)}); err != nil {
		w.Close()
		t.Fatalf("epoll_ctl: %v", err)
	}
	wr := startWriter(t, argv, w)
	buf := make([]byte, 1<<20)
	evs := make([]unix.EpollEvent, 16)
	var total int64
	for eof := false; !eof; {
		if _, err := unix.EpollWait(epfd, evs, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			wr.fatal(t, "epoll_wait: %v", err)
		}
		for i := 0; i < 4; i++ {
			n, err := unix.Read(rfd, buf)
			if n > 0 {
				total += int64(n)
				if n < len(buf) {
					break
				}
				continue
			}
			if err == unix.EAGAIN {
				break
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				wr.fatal(t, "read: %v", err)
			}
			eof = true
			break
		}
	}
	el := wr.wait(t)
	if total != drainBytes {
		t.Fatalf("epoll loop read %d bytes, want %d", total, drainBytes)
	}
	return el
}

// spliceDrain runs argv with stdout on a pipe (sized as corrald's) that
// this process splices to /dev/null until EOF: moving the bytes out of the
// pipe without copying them to user space. It returns the elapsed time.
// (Not necessarily faster than read(2): each blocking splice wakes up for
// whatever the writer has just put in the pipe.)
func spliceDrain(t *testing.T, argv []string) time.Duration {
	t.Helper()
	r, w := drainPipe(t)
	defer r.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	defer null.Close()
	wr := startWriter(t, argv, w)
	rfd, nfd := int(r.Fd()), int(null.Fd()) // Fd leaves them blocking
	var total int64
	for {
		n, err := unix.Splice(rfd, nil, nfd, nil, 1<<20, unix.SPLICE_F_MOVE)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			wr.fatal(t, "splice: %v", err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	el := wr.wait(t)
	if total != drainBytes {
		t.Fatalf("spliced %d bytes, want %d", total, drainBytes)
	}
	return el
}

// drainWriter is argv writing to a drain pipe: started by startWriter, it
// is reaped by wait once its reader has seen EOF, or by fatal.
type drainWriter struct {
	argv []string
	cmd  *exec.Cmd
	t0   time.Time // just before the start: the side's clock
}

// startWriter starts argv with stdout on w and closes w, so that the
// child holds the pipe's only write end and its reader sees EOF when the
// child exits; it fails the test (w closed) if argv does not start.
func startWriter(t *testing.T, argv []string, w *os.File) *drainWriter {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = w
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatalf("start %v: %v", argv, err)
	}
	w.Close()
	return &drainWriter{argv: argv, cmd: cmd, t0: t0}
}

// wait reaps the writer, failing the test unless it exited 0, and returns
// the time since it was started.
func (d *drainWriter) wait(t *testing.T) time.Duration {
	t.Helper()
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("%v: %v", d.argv, err)
	}
	return time.Since(d.t0)
}

// fatal kills and reaps the writer, then fails the test: its reader broke
// off before EOF.
func (d *drainWriter) fatal(t *testing.T, format string, args ...any) {
	t.Helper()
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	t.Fatalf(format, args...)
}

// countWriter counts what is written to it and keeps nothing.
type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) {
	*w += countWriter(len(p))
	return len(p), nil
}

var _ io.Writer = (*countWriter)(nil)
