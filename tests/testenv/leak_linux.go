package testenv

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Resources is what a test process holds that its tests must give back.
type Resources struct {
	FDs        map[string]string // open fd -> what it points at (nil: unknown)
	Goroutines int
}

// Measure records this process's open fds and goroutines. Take it before
// the tests (after anything that stays open for the whole run) and Check
// it after them.
func Measure() Resources {
	return Resources{FDs: openFDs(), Goroutines: runtime.NumGoroutine()}
}

// openFDs maps this process's open fds to their targets, not counting the
// one that reads /proc/self/fd.
func openFDs() map[string]string {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil
	}
	self := fmt.Sprint(f.Fd())
	fds := make(map[string]string, len(names))
	for _, n := range names {
		if n == self {
			continue
		}
		l, _ := os.Readlink("/proc/self/fd/" + n)
		fds[n] = l
	}
	return fds
}

// newFDs lists the fds of now that before did not have (or that point
// elsewhere now), as "fd=target".
func (before Resources) newFDs(now Resources) []string {
	var out []string
	for fd, l := range now.FDs {
		if old, ok := before.FDs[fd]; !ok || old != l {
			out = append(out, fd+"="+l)
		}
	}
	slices.Sort(out)
	return out
}

// Check waits up to within for this process to hold no more fds and
// goroutines than before (closed connections and finished cleanups let go
// of theirs asynchronously), and returns an error naming the new fds and
// with every goroutine's stack if it still holds more.
func (before Resources) Check(within time.Duration) error {
	return before.check(within, true)
}

// CheckFDs is Check for fds alone, for a check inside a test, where other
// tests' goroutines may come and go meanwhile.
func (before Resources) CheckFDs(within time.Duration) error {
	return before.check(within, false)
}

func (before Resources) check(within time.Duration, goroutines bool) error {
	deadline := time.Now().Add(within)
	for {
		now := Measure()
		fdsOK := before.FDs == nil || now.FDs == nil || len(now.FDs) <= len(before.FDs)
		gOK := !goroutines || now.Goroutines <= before.Goroutines
		if fdsOK && gOK {
			return nil
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("leak: %d fds (before %d), new: %s", len(now.FDs), len(before.FDs), strings.Join(before.newFDs(now), " "))
			if goroutines {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				msg += fmt.Sprintf("; %d goroutines (before %d):\n%s", now.Goroutines, before.Goroutines, buf)
			}
			return fmt.Errorf("%s", msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// warm starts what the runtime starts once, lazily, for good, so that a
// baseline taken after it does not count them as leaks: the netpoller's
// epoll fd and eventfd (the first pipe), and os/signal's watcher goroutine
// (the first signal.Notify; SIGUSR2 goes back to its default at Stop).
func warm() {
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR2)
	signal.Stop(c)
}

// Main runs the package's tests and, when they passed, checks that they
// left no fd or goroutine behind (waiting up to 5s for asynchronous
// cleanups). It returns the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
// Call it after anything that stays open for the whole run.
func Main(m *testing.M) int {
	warm()
	before := Measure()
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := before.Check(5 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "after the tests:", err)
		return 1
	}
	return 0
}

// CheckFDs fails t if, once its cleanups ran, the process holds more fds
// than when CheckFDs was called (waiting up to 2s for asynchronous closes).
// Call it first in the test so that its cleanup runs last. Goroutines are
// not counted: other tests' may come and go meanwhile.
func CheckFDs(t testing.TB) {
	t.Helper()
	warm()
	before := Measure()
	t.Cleanup(func() {
		if err := before.CheckFDs(2 * time.Second); err != nil {
			t.Error(err)
		}
	})
}
