package testd

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/testenv"
)

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		name, s string
		n       int
		want    string
	}{
		{"shorter", "abc", 5, "abc"},
		{"exact", "abcde", 5, "abcde"},
		{"longer", "abcdefg", 3, "...efg"},
		{"empty", "", 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Tail(tc.s, tc.n); got != tc.want {
				t.Errorf("Tail(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
		})
	}
}

// requireCgroup2 skips unless this process may create cgroups in a cgroup2
// hierarchy, and returns its mount point.
func requireCgroup2(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root (creates cgroups)")
	}
	root := Cgroup2Mount()
	if root == "" {
		testenv.Skip(t, "needs a cgroup2 hierarchy")
	}
	return root
}

func TestRemoveCgroupTreeKillsAndRemoves(t *testing.T) {
	root := requireCgroup2(t)
	if err := RemoveCgroupTree(filepath.Join(root, "corral-testd-missing-"+strconv.Itoa(os.Getpid()))); err != nil {
		t.Errorf("RemoveCgroupTree(missing) = %v, want nil", err)
	}
	var base string
	t.Run("base", func(t *testing.T) {
		base = CgroupBase(t, root, "corral-testd")
		child := filepath.Join(base, "child")
		if err := os.MkdirAll(child, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(child)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sleep := exec.Command("sleep", "1000")
		sleep.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
		if err := sleep.Start(); err != nil {
			t.Fatalf("start sleep in %s: %v", child, err)
		}
		done := make(chan error, 1)
		go func() { done <- sleep.Wait() }()
		if err := RemoveCgroupTree(base); err != nil {
			t.Fatalf("RemoveCgroupTree = %v", err)
		}
		select {
		case err := <-done:
			if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Errorf("sleep in the removed tree ended with %v, want SIGKILL", err)
			}
		case <-time.After(5 * time.Second):
			_ = sleep.Process.Kill()
			<-done
			t.Error("sleep still runs after RemoveCgroupTree")
		}
		if err := os.Mkdir(base, 0o755); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(base); !os.IsNotExist(err) {
		t.Errorf("cgroup base %s after its test: %v, want it removed", base, err)
	}
}

// TestStartStopsInCleanup: Start returns a daemon that accepts on its
// socket, and the test's cleanup stops it with SIGTERM (a clean exit).
func TestStartStopsInCleanup(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root (corrald supervises children as root)")
	}
	dir, err := Build("corral-testd-bin-", "corrald")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	before := testenv.Measure()
	var d *Daemon
	t.Run("daemon", func(t *testing.T) {
		d = Start(t, Config{Corrald: filepath.Join(dir, "corrald"), Dir: t.TempDir(),
			Args: []string{"--scope", "pgroup", "--socket-group", ""}})
		c, err := net.Dial("unix", d.Socket)
		if err != nil {
			t.Fatalf("dial %s: %v", d.Socket, err)
		}
		c.Close()
		if d.Exited() {
			t.Fatal("corrald exited while its test runs")
		}
	})
	if !d.Exited() {
		t.Fatal("corrald still runs after the test that started it")
	}
	if err := d.WaitErr(); err != nil {
		t.Errorf("corrald after the cleanup's SIGTERM: %v, want exit status 0", err)
	}
	if err := before.Check(5 * time.Second); err != nil {
		t.Error(err)
	}
}

// recorder is a testing.TB that keeps the cleanups and errors of the code
// under test instead of acting on them.
type recorder struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Cleanup(f func())             { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Errorf(f string, args ...any) { r.errs = append(r.errs, fmt.Sprintf(f, args...)) }

func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestStrictCgroupBaseReportsLeftovers(t *testing.T) {
	root := requireCgroup2(t)
	for _, tc := range []struct {
		name   string
		strict bool
		leave  bool
		errs   int
	}{
		{"strict, nothing left", true, false, 0},
		{"strict, a cgroup left", true, true, 1},
		{"lenient, a cgroup left", false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			newBase := CgroupBase
			if tc.strict {
				newBase = StrictCgroupBase
			}
			base := newBase(r, root, "corral-testd")
			if err := os.Mkdir(base, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.leave {
				if err := os.Mkdir(filepath.Join(base, "left"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			r.runCleanups()
			if len(r.errs) != tc.errs {
				t.Errorf("cleanup errors = %q, want %d", r.errs, tc.errs)
			}
			if _, err := os.Stat(base); !os.IsNotExist(err) {
				t.Errorf("cgroup base %s after cleanup: %v, want it removed", base, err)
			}
		})
	}
}
