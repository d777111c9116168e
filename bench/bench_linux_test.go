package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

// supervisorEnv, when set in the environment of the test binary, turns it
// into the baseline supervisor of benchScale (see runSupervisor) instead of
// running tests, so that its memory is measured alone.
const supervisorEnv = "CORRAL_BENCH_SUPERVISOR"

// markEnv is set in the environment of every child the suite starts, so
// that leftovers can be found (and killed) by scanning /proc.
const markEnv = "CORRAL_BENCH_MARK"

func TestMain(m *testing.M) {
	if os.Getenv(supervisorEnv) != "" {
		os.Exit(runSupervisor())
	}
	if os.Getenv(systemdEnv) != "" {
		os.Exit(runSystemdInside())
	}
	if os.Getenv(notifyPeerEnv) != "" {
		os.Exit(runNotifyPeer())
	}
	os.Exit(testenv.Main(m))
}

// TestBenchSuite runs every measurement in one process, one after another,
// and reports the tables. It asserts only that each run did what it was asked
// (exit codes, byte counts, nothing left behind), never how fast.
func TestBenchSuite(t *testing.T) {
	if os.Getenv("CORRAL_BENCH") != "1" {
		t.Skip("benchmarks run only with CORRAL_BENCH=1 (make bench)") // not an environment skip
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "benchmarks need root (corrald supervises children as root)")
	}
	if _, err := os.Stat(filepath.Join(cgroupMount, "cgroup.procs")); err != nil {
		testenv.Skipf(t, "benchmarks need a cgroup2 hierarchy at %s: %v", cgroupMount, err)
	}
	if os.Getenv("CORRAL_BENCH_QUICK") == "1" {
		// A smoke run of the suite itself: small counts, figures not meaningful.
		latencyN, latencyWU, spacedN, notifyN = 30, 5, 20, 10
		tputWindows, drainBytes, drainRounds = 2, 100_000_000, 1
		scaleMax, systemdN, tputWindows64 = 100, 10, 1
		profileExecN, profileDrainN = 30, 1
		mcpN, mcpWU = 20, 3
		obsN = 30
		handoverN, adoptN, adoptRound = 3, 50, 1
	}
	// CORRAL_BENCH_SAMPLES=N sets the samples per side of (a) and (b), for
	// runs that need a p99 settled by more than 300 and 100 samples.
	if v := os.Getenv("CORRAL_BENCH_SAMPLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CORRAL_BENCH_SAMPLES=%q: want a count of samples", v)
		}
		latencyN, notifyN = n, n
	}
	start := time.Now()
	s := &suite{t: t}
	// Each step by its name and the letters of the tables it prints.
	steps := []struct {
		name   string
		tables []string
		f      func(*testing.T)
	}{
		{"exec_latency", []string{"a", "g", "a2"}, s.benchExecLatency},
		{"exit_notify", []string{"b"}, s.benchExitNotify},
		{"long_poll", []string{"l"}, s.benchLongPoll},
		{"throughput", []string{"d"}, s.benchThroughput},
		{"drain", []string{"e"}, s.benchDrain},
		{"scale", []string{"c"}, s.benchScale},
		{"systemd", []string{"f", "f2"}, s.benchSystemd},
		{"profile", []string{"h"}, s.benchProfile},
		{"mcp", nil, s.benchMCP},
		{"observability", []string{"j"}, s.benchObservability},
		{"survival", []string{"k1", "k2"}, s.benchSurvival},
	}
	// CORRAL_BENCH_ONLY=step runs one measurement (a short check of it),
	// named as in TestBenchSuite/<name> or by a table's letter ("c").
	only := os.Getenv("CORRAL_BENCH_ONLY")
	picked := func(name string, tables []string) bool {
		return only == "" || only == name || slices.Contains(tables, only)
	}
	var names []string
	found := false
	for _, st := range steps {
		names = append(names, st.name)
		found = found || picked(st.name, st.tables)
	}
	if !found {
		t.Fatalf("CORRAL_BENCH_ONLY=%q names no step: want one of %s or a table's letter", only, strings.Join(names, ", "))
	}
	s.bin = buildCorrald(t)
	s.header()
	before := testenv.Measure()
	for _, st := range steps {
		if picked(st.name, st.tables) {
			t.Run(st.name, st.f)
		}
	}

	s.targetTable()
	fmt.Fprintf(&s.out, "\nTotal wall time of the suite: %s. Load average at the end: %s.\n", time.Since(start).Round(time.Second), loadAvg())
	t.Logf("results:\n%s", s.out.String())
	if path := os.Getenv("CORRAL_BENCH_OUT"); path != "" {
		if err := os.WriteFile(path, s.out.Bytes(), 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
	// Every subtest's cleanups have run: daemons stopped, clients closed.
	if err := before.Check(5 * time.Second); err != nil {
		t.Error(err)
	}
	if n := countMarked(markValue()); n != 0 {
		t.Errorf("%d benchmark children still alive after the suite", n)
		killMarked(markValue())
	}
}

// cgroupMount is the cgroup2 hierarchy the cgroup backend uses on this host
// (hybrid layout); the daemons' bases go below it.
const cgroupMount = "/sys/fs/cgroup/unified"

// suite carries what the measurements share. Owned by the test goroutine.
type suite struct {
	t   *testing.T
	bin string       // built corrald
	out bytes.Buffer // Markdown results
	// scaleLimit is the RLIMIT_NOFILE of the first scale daemon, which
	// bounds scaleN.
	scaleLimit int
	// targets are the goals, checked against the measured ratios
	// and printed together at the end.
	targets []targetRow
}

// targetRow is one goal: the measured value against its limit.
type targetRow struct {
	name         string
	value, limit float64
	unit         string
	atLeast      bool   // met when value >= limit (else when value <= limit)
	detail       string // what the ratio is made of: both sides' p50 and p99 (or range)
}

// target records a goal met when value <= limit.
func (s *suite) target(name string, value, limit float64, unit string) {
	s.targets = append(s.targets, targetRow{name: name, value: value, limit: limit, unit: unit})
}

// targetAtLeast records a goal met when value >= limit.
func (s *suite) targetAtLeast(name string, value, limit float64, unit string) {
	s.targets = append(s.targets, targetRow{name: name, value: value, limit: limit, unit: unit, atLeast: true})
}

// targetDetail sets what the last recorded target's value is made of (both
// sides' p50 and p99, or for rates their median and range), printed beside
// it.
func (s *suite) targetDetail(format string, args ...any) {
	if len(s.targets) > 0 {
		s.targets[len(s.targets)-1].detail = fmt.Sprintf(format, args...)
	}
}

func (s *suite) targetTable() {
	if len(s.targets) == 0 {
		return
	}
	fmt.Fprintf(&s.out, "\n### Targets\n\n| target | measured | limit | met | from |\n|---|---|---|---|---|\n")
	for _, r := range s.targets {
		op, met := "≤", r.value <= r.limit
		if r.atLeast {
			op, met = "≥", r.value >= r.limit
		}
		verdict := "yes"
		if !met {
			verdict = "**no**"
		}
		fmt.Fprintf(&s.out, "| %s | %.3g%s | %s %.3g%s | %s | %s |\n", r.name, r.value, r.unit, op, r.limit, r.unit, verdict, r.detail)
	}
}

func (s *suite) header() {
	kernel := "unknown"
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		kernel = utsString(u.Release[:])
	}
	goVer := runtime.Version()
	if out, err := exec.Command(testd.GoTool(), "version").Output(); err == nil {
		goVer = strings.TrimSpace(string(out))
	}
	fmt.Fprintf(&s.out, "Machine: %d CPUs (nproc), kernel %s, %s, %s.\n", runtime.NumCPU(), kernel, goVer, cpuModel())
	all, runnable := hostProcesses()
	fmt.Fprintf(&s.out, "Date: %s. Load average at the start: %s; %d processes on the host, %d of them runnable.\n", time.Now().UTC().Format(time.RFC3339), loadAvg(), all, runnable)
	if p50, p99, fs, err := syncProbe(); err == nil {
		fmt.Fprintf(&s.out, "State directories live under %s (%s); a 4 KiB write + fdatasync there takes p50 %s ms, p99 %s ms (what each group commit of the store costs with --store-sync full; the default, normal, does not fsync per commit).\n",
			os.TempDir(), fs, ms(p50), ms(p99))
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		fmt.Fprintf(&s.out, "Source: %s (git describe --always --dirty of the tree the daemon was built from).\n", strings.TrimSpace(string(out)))
	}
}

func utsString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "cpu unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "cpu unknown"
}

// syncProbe times 50 rounds of a 4 KiB write and fdatasync in the temp
// directory, where the daemons' state directories (and so their stores) are.
func syncProbe() (p50, p99 time.Duration, fsType string, err error) {
	f, err := os.CreateTemp("", "corral-bench-sync-")
	if err != nil {
		return 0, 0, "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var d durations
	for i := 0; i < 50; i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			return 0, 0, "", err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, 0, "", err
		}
		d = append(d, time.Since(t0))
	}
	fsType = "unknown filesystem"
	var st syscall.Statfs_t
	if syscall.Statfs(os.TempDir(), &st) == nil {
		switch st.Type {
		case 0xEF53:
			fsType = "ext4"
		case 0x01021994:
			fsType = "tmpfs"
		case 0x58465342:
			fsType = "xfs"
		case 0x9123683E:
			fsType = "btrfs"
		default:
			fsType = fmt.Sprintf("filesystem magic %#x", st.Type)
		}
	}
	return d.pct(.5), d.pct(.99), fsType, nil
}

// loadAvg is the 1, 5 and 15 minute load averages: other work on the host
// shows up in every figure, and interleaving only evens it out between the
// sides of a comparison.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// buildCorrald builds corrald (cgo-free, as make build does) into a
// temporary directory and returns its path.
// CORRAL_BENCH_CORRALD names a prebuilt corrald to measure instead.
func buildCorrald(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CORRAL_BENCH_CORRALD"); p != "" {
		return p
	}
	dir, err := testd.Build("corral-bench-bin-", "corrald", "corral-shim")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "corrald")
}

// daemon is one corrald started by the suite. Stopped and its cgroup base
// removed by a t.Cleanup of the test that started it.
type daemon struct {
	*testd.Daemon
	name string
	base string // cgroup base directory ("" for pgroup)
	pid  int
}

// startDaemon starts corrald with the given backend, warm pool size (given
// explicitly: the daemon's default depends on the backend) and extra flags,
// and waits until it accepts connections. Its cleanup stops it with SIGTERM
// (it cancels what still runs), checks that its cgroups are gone and
// removes its cgroup base.
func (s *suite) startDaemon(t *testing.T, name, backend string, pool int, extra ...string) *daemon {
	t.Helper()
	cfg := testd.Config{
		Name:    name,
		Corrald: s.bin,
		Dir:     t.TempDir(),
		Args: append([]string{"--scope", backend, "--log-level", "warn",
			"--drain", "1s", "--kill-wait", "5s",
			"--max-running", "20000", "--max-per-uid", "20000",
			"--pool-size", strconv.Itoa(pool)}, extra...),
	}
	if backend == "cgroup" {
		cfg.CgroupBase = testd.StrictCgroupBase(t, cgroupMount, "corral-bench")
	}
	d := testd.Start(t, cfg)
	return &daemon{Daemon: d, name: name, base: d.CgroupBase, pid: d.Pid()}
}

// populated reports whether any process is in the cgroup tree at dir (its
// cgroup.events says "populated 1").
func populated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false
	}
	return strings.Contains(string(b), "populated 1")
}

// busyScopes lists the cgroups below base that hold processes, leaving out
// the daemon's warm pool ("pool-*": shims waiting for the next command).
func busyScopes(base string) []string {
	var busy []string
	for _, name := range testd.CgroupChildren(base) {
		if !strings.HasPrefix(name, "pool-") && populated(filepath.Join(base, name)) {
			busy = append(busy, name)
		}
	}
	return busy
}

// procStats is what /proc says about one process.
type procStats struct {
	RSSKiB  int64
	Threads int
	FDs     int
}

func readProcStats(pid int) (procStats, error) {
	var ps procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, fmt.Errorf("read status of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			ps.RSSKiB, _ = strconv.ParseInt(f[0], 10, 64)
		case "Threads":
			ps.Threads, _ = strconv.Atoi(f[0])
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return ps, fmt.Errorf("list fds of %d: %w", pid, err)
	}
	ps.FDs = len(ents)
	return ps, nil
}

// markValue is this run's value of markEnv.
func markValue() string { return "bench-" + strconv.Itoa(os.Getpid()) }

// markedPIDs returns the processes with an environment entry markEnv=V
// where V begins with mark.
func markedPIDs(mark string) []int {
	want := []byte("\x00" + markEnv + "=" + mark)
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		if bytes.Contains(append([]byte{0}, b...), want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func countMarked(mark string) int { return len(markedPIDs(mark)) }

// killMarked SIGKILLs every process carrying mark: the last resort of a
// failed run, so that nothing outlives the suite.
func killMarked(mark string) {
	for _, pid := range markedPIDs(mark) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// waitMarked waits until exactly n marked processes exist, for at most
// within. It returns the last count and the largest one seen: at a deadline
// the last alone may say little (children that lived too short a time are
// all gone by then).
func waitMarked(mark string, n int, within time.Duration) (last, most int) {
	deadline := time.Now().Add(within)
	for {
		last = countMarked(mark)
		most = max(most, last)
		if last == n || time.Now().After(deadline) {
			return last, most
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// durations is a set of samples of one side of a comparison.
type durations []time.Duration

// pct returns the p-th percentile (0 < p <= 1) by nearest rank.
func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	c := append(durations(nil), d...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(math.Ceil(p*float64(len(c)))) - 1
	if i < 0 {
		i = 0
	}
	return c[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// latencyRow is one comparison of a latency table.
type latencyRow struct {
	name           string
	side, baseName string
	side1, base    durations
}

func (s *suite) latencyTable(title, note string, rows []latencyRow) {
	fmt.Fprintf(&s.out, "\n### %s\n\n", title)
	if note != "" {
		fmt.Fprintf(&s.out, "%s\n\n", note)
	}
	fmt.Fprintf(&s.out, "| comparison | measured | n | p50 ms | p99 ms | baseline | n | p50 ms | p99 ms | ratio p50 | ratio p99 |\n")
	fmt.Fprintf(&s.out, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		a50, a99, b50, b99 := r.side1.pct(.5), r.side1.pct(.99), r.base.pct(.5), r.base.pct(.99)
		fmt.Fprintf(&s.out, "| %s | %s | %d | %s | %s | %s | %d | %s | %s | %s | %s |\n",
			r.name, r.side, len(r.side1), ms(a50), ms(a99), r.baseName, len(r.base), ms(b50), ms(b99),
			ratio(float64(a50), float64(b50)), ratio(float64(a99), float64(b99)))
	}
}

// rotate runs fns in an order that rotates with i, so that no side always
// goes first (warm caches) or last.
func rotate(i int, fns ...func()) {
	for k := range fns {
		fns[(i+k)%len(fns)]()
	}
}

// ctxT is a context for calls of one measurement, ended with the test.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// openFileLimit is the soft RLIMIT_NOFILE of process pid, from
// /proc/<pid>/limits ("Max open files").
func openFileLimit(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, fmt.Errorf("read limits of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) < 1 {
				break
			}
			n, err := strconv.Atoi(f[0])
			if err != nil {
				return 0, fmt.Errorf("limits of %d: max open files %q: %w", pid, f[0], err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("limits of %d: no max open files line", pid)
}

// hostProcesses counts the processes on the host and those of them that
// are running (state R), as a note on what else loads the CPUs.
func hostProcesses() (all, runnable int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		all++
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'R' {
			runnable++
		}
	}
	return all, runnable
}
