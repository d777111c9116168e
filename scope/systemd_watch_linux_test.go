package scope

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/testenv"
)

// v1MemoryCgroup makes a child of this process's v1 memory cgroup, where
// an OOM eventfd can be registered as for a scope, and removes it after t.
func v1MemoryCgroup(t *testing.T) string {
	t.Helper()
	testenv.SkipRoot(t, "create a v1 memory cgroup")
	h, err := readHierarchies()
	if err != nil || h.Memory.Point == "" {
		testenv.Skipf(t, "no v1 memory hierarchy (the OOM eventfd is a hybrid/legacy host's): %v", err)
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var own string
	for line := range strings.Lines(string(data)) {
		// "4:memory:/path"
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory") {
			own = f[2]
		}
	}
	parent, err := h.Memory.Dir(own)
	if err != nil {
		t.Fatalf("own memory cgroup %q: %v", own, err)
	}
	dir := filepath.Join(parent, fmt.Sprintf("corral-test-oomfd-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	return dir
}

// eventfds counts this process's open eventfds.
func eventfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:[eventfd]" {
			n++
		}
	}
	return n
}

// runningScope is a running systemd scope as far as its OOM watch goes:
// its v1 memory cgroup is dir and Started has set its watcher.
func runningScope(dir string) *systemdScope {
	return &systemdScope{
		b:     &systemdBackend{opts: SystemdOptions{Log: zerolog.Nop()}},
		unit:  "corral-test-oomfd.scope",
		state: unitRunning,
		paths: unitCgroups{Memory: dir},
		watch: &cgroupWatch{},
	}
}

// TestOOMEventfdOwnership: SetLimits registers a pool scope's v1 OOM
// eventfd after its D-Bus call, without the scope's lock, so Remove may stop
// the scope's watcher in between. Whatever the order, the eventfd must be
// closed by the time Remove (or the late registration) returns, not left
// for the GC; and two SetLimits keep one eventfd.
func TestOOMEventfdOwnership(t *testing.T) {
	mem := Limits{MemoryBytes: 64 << 20}

	t.Run("registered while running, closed by Remove", func(t *testing.T) {
		s := runningScope(v1MemoryCgroup(t))
		base := eventfds(t)
		w, paths, need := s.limitsSet(mem)
		if !need {
			t.Fatal("SetLimits with a memory limit on a running scope: no OOM registration wanted")
		}
		s.watchOOM(w, paths)
		if got := eventfds(t); got != base+1 || s.oom == nil {
			t.Fatalf("after the registration: %d eventfds (want %d), oom set %v", got, base+1, s.oom != nil)
		}
		// A second SetLimits that decided to register before the first
		// finished.
		s.watchOOM(w, paths)
		if got := eventfds(t); got != base+1 {
			t.Errorf("after a second registration: %d eventfds, want %d (one per scope)", got, base+1)
		}
		if _, _, need := s.limitsSet(mem); need {
			t.Error("SetLimits wants another OOM registration though the scope has one")
		}
		s.dropWatch(unitRemoved)
		if got := eventfds(t); got != base {
			t.Errorf("after Remove: %d eventfds, want %d", got, base)
		}
	})

	t.Run("registration finishing after Remove", func(t *testing.T) {
		s := runningScope(v1MemoryCgroup(t))
		base := eventfds(t)
		w, paths, need := s.limitsSet(mem)
		if !need {
			t.Fatal("no OOM registration wanted")
		}
		s.dropWatch(unitRemoved) // Remove ran between SetLimits' decision and its registration
		s.watchOOM(w, paths)
		if got := eventfds(t); got != base {
			t.Errorf("late registration left %d eventfds open, want %d", got, base)
		}
		if s.oom != nil {
			t.Error("a removed scope got an OOM eventfd")
		}
	})

	t.Run("watcher stopped first", func(t *testing.T) {
		s := runningScope(v1MemoryCgroup(t))
		base := eventfds(t)
		w, paths, _ := s.limitsSet(mem)
		w.stop()
		s.watchOOM(w, paths)
		if got := eventfds(t); got != base {
			t.Errorf("registration on a stopped watcher left %d eventfds open, want %d", got, base)
		}
		s.dropWatch(unitRemoved)
	})
}
