package scope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/scope/cgroupv2"

	"github.com/corral-dev/corral/tests/testenv"
)

// cgtBase returns a fresh base directory on this host's cgroup2 mount and
// removes it after the test. It skips the test when not root or without a
// writable cgroup2 mount.
func cgtBase(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to create cgroups")
	}
	h := Detect()
	if h.Cgroup2Mount == "" {
		testenv.Skip(t, "no cgroup2 mount on this host")
	}
	if _, err := os.Stat(filepath.Join(h.Cgroup2Mount, "cgroup.subtree_control")); err != nil {
		testenv.Skipf(t, "cgroup2 mount %s unusable: %v", h.Cgroup2Mount, err)
	}
	base := filepath.Join(h.Cgroup2Mount, fmt.Sprintf("corral-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	t.Cleanup(func() {
		if err := cgroupv2.Dir(base).RemoveTree(); err != nil {
			t.Errorf("remove test base: %v", err)
		}
	})
	return base
}

// cgtBackend returns a cgroup backend on a fresh test base.
func cgtBackend(t *testing.T) (*cgroupBackend, string) {
	t.Helper()
	base := cgtBase(t)
	b, err := NewCgroup(CgroupOptions{Base: base, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatalf("NewCgroup = %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b.(*cgroupBackend), base
}

// cgtCgroupOf returns pid's cgroup v2 path.
func cgtCgroupOf(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatalf("read cgroup of %d: %v", pid, err)
	}
	own, ok := cgroupv2.ParseOwn(data)
	if !ok {
		t.Fatalf("no 0:: line in /proc/%d/cgroup: %q", pid, data)
	}
	return own
}

func TestCgroupKillsOrphanedGrandchild(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	b, base := cgtBackend(t)
	c := bkStart(t, b, "orphan", Limits{}, "sh", "-c", "sleep 1000 & echo $!; exit 0")
	sleep := c.pid(t)
	if err := c.wait(t); err != nil {
		t.Fatalf("main exited with %v, want 0", err)
	}
	dir := filepath.Join(base, "orphan")
	if got := cgtCgroupOf(t, sleep); !strings.HasSuffix(dir, got) || c.scope.Name() != got {
		t.Errorf("grandchild in cgroup %q, Name = %q, want both to name %s", got, c.scope.Name(), dir)
	}
	if empty, err := c.scope.Empty(); empty || err != nil {
		t.Errorf("Empty with a live grandchild = %v, %v, want false, nil", empty, err)
	}
	if err := c.scope.Remove(); err == nil {
		t.Errorf("Remove of a populated scope = nil, want an error")
	}
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	bkWaitGone(t, sleep)
	bkWaitEmpty(t, c.scope)
	for i := range 2 {
		if err := c.scope.Remove(); err != nil {
			t.Errorf("Remove #%d = %v, want nil", i+1, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scope dir after Remove: %v, want not exist", err)
	}
	if err := c.scope.Kill(); err != nil {
		t.Errorf("Kill after Remove = %v, want nil", err)
	}
}

// A daemonizing grandchild (double fork + setsid) stays in the cgroup and
// dies with it.
func TestCgroupKillsSetsidDoubleFork(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	b, _ := cgtBackend(t)
	c := bkStart(t, b, "daemonize", Limits{}, "sh", "-c", `setsid sh -c 'sleep 1000 & echo $!'; exec sleep 1000`)
	escaped := c.pid(t)
	if got := cgtCgroupOf(t, escaped); got != c.scope.Name() {
		t.Errorf("setsid grandchild in cgroup %q, want %q", got, c.scope.Name())
	}
	if sid, _ := unix.Getsid(escaped); sid == c.cmd.Process.Pid {
		t.Fatalf("grandchild shares the main session %d; the test did not daemonize", sid)
	}
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	err := c.wait(t)
	var ee *exitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("main exited with %v, want killed by SIGKILL", err)
	}
	bkWaitGone(t, escaped)
	bkWaitEmpty(t, c.scope)
	if err := c.scope.Remove(); err != nil {
		t.Errorf("Remove = %v", err)
	}
}

func TestCgroupSignalReachesGrandchildren(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	b, base := cgtBackend(t)
	c := bkStart(t, b, "term", Limits{}, "sh", "-c", `setsid sh -c 'sleep 1000 & echo $!'; sleep 1000 & echo $!; wait`)
	pids := []int{c.pid(t), c.pid(t)}
	if err := c.scope.Signal(unix.SIGTERM); err != nil {
		t.Fatalf("Signal(SIGTERM) = %v", err)
	}
	err := c.wait(t)
	var ee *exitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("main exited with %v, want killed by SIGTERM", err)
	}
	for _, pid := range pids {
		bkWaitGone(t, pid)
	}
	bkWaitEmpty(t, c.scope)
	if data, err := cgroupv2.Dir(filepath.Join(base, "term")).Read("cgroup.freeze"); err != nil || strings.TrimSpace(string(data)) != "0" {
		t.Errorf("cgroup.freeze after Signal = %q, %v, want 0 (thawed)", data, err)
	}
}

func TestCgroupStats(t *testing.T) {
	testenv.CheckFDs(t)
	b, _ := cgtBackend(t)
	c := bkStart(t, b, "spin", Limits{}, "sh", "-c", "while :; do :; done")
	first, err := c.scope.Stats()
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	var last Stats
	for {
		time.Sleep(50 * time.Millisecond)
		if last, err = c.scope.Stats(); err != nil {
			t.Fatalf("Stats = %v", err)
		}
		if last.CPUUsageNS >= first.CPUUsageNS+20_000_000 || time.Now().After(deadline) {
			break
		}
	}
	if last.CPUUsageNS < first.CPUUsageNS+20_000_000 {
		t.Errorf("CPUUsageNS went %d -> %d in 5s of spinning, want +20ms at least", first.CPUUsageNS, last.CPUUsageNS)
	}
	if last.CPUUserNS < 0 || last.CPUSystemNS < 0 || last.CPUUserNS+last.CPUSystemNS > last.CPUUsageNS+1000 {
		t.Errorf("user %d + system %d ns, usage %d: want non-negative parts summing to usage", last.CPUUserNS, last.CPUSystemNS, last.CPUUsageNS)
	}
	if last.Tasks != 1 || last.TasksPeak < 1 {
		t.Errorf("Tasks, TasksPeak = %d, %d, want 1, >= 1", last.Tasks, last.TasksPeak)
	}
	if !b.controllers["memory"] && (last.MemoryPeak != Unknown || last.OOMKills != Unknown) {
		t.Errorf("MemoryPeak, OOMKills = %d, %d without a memory controller, want Unknown", last.MemoryPeak, last.OOMKills)
	}
	if b.controllers["memory"] && (last.MemoryPeak <= 0 || last.OOMKills != 0) {
		t.Errorf("MemoryPeak, OOMKills = %d, %d, want > 0, 0", last.MemoryPeak, last.OOMKills)
	}
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	c.wait(t)
	bkWaitEmpty(t, c.scope)
	final, err := c.scope.Stats()
	if err != nil || final.Tasks != 0 || final.CPUUsageNS < last.CPUUsageNS {
		t.Errorf("Stats of the emptied scope = %+v, %v, want 0 tasks and CPU >= %d", final, err, last.CPUUsageNS)
	}
	if err := c.scope.Remove(); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if got, err := c.scope.Stats(); err != nil || got != final {
		t.Errorf("Stats after Remove = %+v, %v, want the last reading %+v", got, err, final)
	}
}

// TestCgroupExitStats: ExitStats reports what Stats does, and whether the
// scope is empty: a populated scope's tasks counted, an emptied one's 0.
func TestCgroupExitStats(t *testing.T) {
	testenv.CheckFDs(t)
	b, _ := cgtBackend(t)
	c := bkStart(t, b, "two", Limits{}, "sh", "-c", "sleep 60 & wait")
	var (
		st    Stats
		empty bool
		err   error
	)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st, empty, err = c.scope.(ExitStatser).ExitStats(); err != nil {
			t.Fatalf("ExitStats = %v", err)
		}
		if st.Tasks == 2 || time.Now().After(deadline) {
			break
		}
	}
	want, err := c.scope.Stats()
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	if empty || st.Tasks != 2 || st.Tasks != want.Tasks || st.TasksPeak != want.TasksPeak {
		t.Errorf("ExitStats of sh and its sleep = tasks %d, peak %d, empty %v; want 2 tasks, Stats' peak %d, not empty",
			st.Tasks, st.TasksPeak, empty, want.TasksPeak)
	}
	if err := c.scope.Kill(); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	c.wait(t)
	bkWaitEmpty(t, c.scope)
	st, empty, err = c.scope.(ExitStatser).ExitStats()
	if err != nil {
		t.Fatalf("ExitStats of the emptied scope = %v", err)
	}
	want, err = c.scope.Stats()
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	if !empty || st.Tasks != 0 || st != want {
		t.Errorf("ExitStats of the emptied scope = %+v, empty %v; want Stats' %+v (0 tasks), empty", st, empty, want)
	}
	if b.controllers["pids"] && st.TasksPeak < 2 {
		t.Errorf("TasksPeak %d with the pids controller, want >= 2", st.TasksPeak)
	}
	if err := c.scope.Remove(); err != nil {
		t.Fatalf("Remove = %v", err)
	}
}

func TestCgroupLimits(t *testing.T) {
	testenv.CheckFDs(t)
	b, base := cgtBackend(t)
	lim := Limits{MemoryBytes: 64 << 20, TasksMax: 16, CPUMS: 1000}
	c := bkStart(t, b, "limits", lim, "sleep", "1000")
	dir := filepath.Join(base, "limits")
	got, ok := Unenforced(c.scope)
	if !ok {
		t.Fatalf("cgroup scope does not report unenforced limits")
	}
	var want Limits
	if b.controllers["memory"] {
		if v, err := cgroupv2.Dir(dir).ReadInt("memory.max"); err != nil || v != lim.MemoryBytes {
			t.Errorf("memory.max = %d, %v, want %d", v, err, lim.MemoryBytes)
		}
	} else {
		want.MemoryBytes = lim.MemoryBytes
	}
	if b.controllers["pids"] {
		if v, err := cgroupv2.Dir(dir).ReadInt("pids.max"); err != nil || v != lim.TasksMax {
			t.Errorf("pids.max = %d, %v, want %d", v, err, lim.TasksMax)
		}
	} else {
		want.TasksMax = lim.TasksMax
	}
	if got != want {
		t.Errorf("Unenforced = %+v, want %+v (controllers %v)", got, want, b.controllers)
	}
}

func TestCgroupPrepareRejectsBadIDs(t *testing.T) {
	b, base := cgtBackend(t)
	for _, id := range []string{"", ".", "..", "a/b", "../x"} {
		t.Run(strconv.Quote(id), func(t *testing.T) {
			cmd := bkCommand("true")
			sc, err := b.Prepare(context.Background(), Spec{ID: id, Cmd: cmd})
			if err == nil {
				_ = sc.Remove()
				t.Fatalf("Prepare(%q) = nil error, want rejection", id)
			}
			if cmd.SysProcAttr != nil {
				t.Errorf("Prepare(%q) failed but changed SysProcAttr", id)
			}
		})
	}
	if subs, err := cgroupv2.Dir(base).Children(); err != nil || len(subs) != 0 {
		t.Errorf("base holds %v, %v after rejected Prepares, want nothing", subs, err)
	}
}

// A scope that was never started must not keep its directory fd or dir.
func TestCgroupRemoveUnstarted(t *testing.T) {
	testenv.CheckFDs(t)
	b, base := cgtBackend(t)
	cmd := bkCommand("true")
	sc, err := b.Prepare(context.Background(), Spec{ID: "never", Cmd: cmd})
	if err != nil {
		t.Fatalf("Prepare = %v", err)
	}
	if !cmd.SysProcAttr.UseCgroupFD || !cmd.SysProcAttr.Setsid || cmd.SysProcAttr.CgroupFD < 0 {
		t.Errorf("SysProcAttr = %+v, want UseCgroupFD, CgroupFD and Setsid set", *cmd.SysProcAttr)
	}
	if err := sc.Remove(); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "never")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scope dir after Remove: %v, want not exist", err)
	}
}

func TestCgroupCleanLeftovers(t *testing.T) {
	bkSubreaper(t)
	testenv.CheckFDs(t)
	b, base := cgtBackend(t)
	// A previous run left a scope with a live process (and a nested cgroup
	// the process made).
	c := bkStart(t, b, "left", Limits{}, "sh", "-c", "sleep 1000 & echo $!; exit 0")
	sleep := c.pid(t)
	c.wait(t)
	if err := os.Mkdir(filepath.Join(base, "left", "nested"), 0o755); err != nil {
		t.Fatalf("mkdir nested: %v", err)
	}

	b2, err := NewCgroup(CgroupOptions{Base: base})
	if err != nil {
		t.Fatalf("NewCgroup = %v", err)
	}
	defer b2.Close()
	lc, ok := b2.(LeftoverCleaner)
	if !ok {
		t.Fatalf("cgroup backend is not a LeftoverCleaner")
	}
	if names, err := b2.(*cgroupBackend).Leftovers(); err != nil || !slices.Equal(names, []string{"left"}) {
		t.Errorf("Leftovers = %v, %v, want [left]", names, err)
	}
	removed, err := lc.CleanLeftovers(context.Background())
	if err != nil || !slices.Equal(removed, []string{"left"}) {
		t.Errorf("CleanLeftovers = %v, %v, want [left], nil", removed, err)
	}
	bkWaitGone(t, sleep)
	if _, err := os.Stat(filepath.Join(base, "left")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover dir after CleanLeftovers: %v, want not exist", err)
	}
	if err := b2.(*cgroupBackend).RemoveLeftover(".."); err == nil {
		t.Errorf("RemoveLeftover(..) = nil, want rejection")
	}
}

func TestNewCgroupUnsupported(t *testing.T) {
	base := filepath.Join(t.TempDir(), "corral")
	_, err := NewCgroup(CgroupOptions{Base: base})
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("NewCgroup(base on tmpfs) = %v, want ErrUnsupported", err)
	}
	if _, serr := os.Stat(base); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("NewCgroup created %s on a non-cgroup fs", base)
	}
}

// TestCgroupPrepareOutOfFDsLeavesNoCgroup: when Prepare fails because the
// daemon is out of fds (EMFILE), the cgroup it made must still be removed;
// found by tests/drill (emfile), where every such start left one for good.
func TestCgroupPrepareOutOfFDsLeavesNoCgroup(t *testing.T) {
	b, base := cgtBackend(t)
	cmd := bkCommand("true")
	// No fd left: mkdir works, opening the new directory does not.
	restore, err := testenv.LowerFDLimit(0)
	if err != nil {
		t.Fatal(err)
	}
	_, perr := b.Prepare(context.Background(), Spec{ID: "emfile", Cmd: cmd})
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(perr, unix.EMFILE) {
		t.Fatalf("Prepare with no fd left = %v, want EMFILE", perr)
	}
	if _, err := os.Stat(filepath.Join(base, "emfile")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup of the failed Prepare: %v, want it removed", err)
	}
}
