package testd

import (
	"fmt"
	"os"
	"runtime"
	"time"
)

// Resources is what a test process holds that its tests must give back.
type Resources struct {
	FDs        int // open file descriptors (-1: unknown)
	Goroutines int
}

// Measure counts this process's open fds and goroutines. Take it before
// the tests (after anything that stays open for the whole run) and Check
// it after them.
func Measure() Resources {
	return Resources{FDs: openFDs(), Goroutines: runtime.NumGoroutine()}
}

// openFDs counts this process's open file descriptors, not counting the one
// that reads /proc/self/fd.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1
}

// Check waits up to within for this process to hold no more fds and
// goroutines than before (closed connections and finished cleanups let go
// of theirs asynchronously), and returns an error with every goroutine's
// stack if it still holds more.
func (before Resources) Check(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		now := Measure()
		if now.FDs <= before.FDs && now.Goroutines <= before.Goroutines {
			return nil
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("leak after the tests: %d fds (before %d), %d goroutines (before %d):\n%s",
				now.FDs, before.FDs, now.Goroutines, before.Goroutines, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
