package systemdscope_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/tests/harness"
)

// pid1Cgroup returns the unified-hierarchy cgroup directory of systemd
// (PID 1 here), for its freezer.
func pid1Cgroup(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/1/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rel, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
				d := filepath.Join(root, rel)
				if _, err := os.Stat(filepath.Join(d, "cgroup.freeze")); err == nil {
					return d
				}
			}
		}
	}
	t.Fatal("no unified cgroup with cgroup.freeze for PID 1")
	return ""
}

// freeze freezes (true) or thaws (false) cgroup dir and waits, bounded,
// until the kernel says it is so.
func freeze(t *testing.T, dir string, on bool) {
	t.Helper()
	v := map[bool]string{true: "1", false: "0"}[on]
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(v), 0o644); err != nil {
		t.Fatalf("write %s/cgroup.freeze: %v", dir, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err == nil && strings.Contains(string(b), "frozen "+v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not frozen=%s after 10 s: %s %v", dir, v, b, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Remove of a scope whose tree is gone does not wait for systemd: with
// systemd frozen (its cgroup's freezer), so that it can neither stop the
// emptied scope nor answer D-Bus, Remove returns and its cgroup holds no
// process; once systemd runs again it unloads the unit, and Close waits
// for that. This is what lets cleaned come without systemd's stop and
// unload of the scope (docs/design.md, "Cleaned").
func TestRemoveEmptyScopeWithoutSystemd(t *testing.T) {
	harness.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A job timeout far above the bound below: a Remove that waits for
	// systemd would wait for it.
	b, err := scope.NewSystemd(ctx, scope.SystemdOptions{JobTimeout: 60 * time.Second})
	if err != nil {
		t.Fatalf("NewSystemd: %v", err)
	}
	t.Cleanup(func() { b.Close() })

	for i, argv := range [][]string{{"sleep", "0.3"}, {"sh", "-c", "sleep 0.2 & exec sleep 0.3"}} {
		c := startIn(t, b, uniqueID(t)+"-"+string(rune('a'+i)), scope.Limits{}, argv...)
		cg := unitProp(t, c.sc.Name(), "ControlGroup")
		if cg == "" {
			t.Fatalf("%s: no ControlGroup", c.sc.Name())
		}
		// Frozen before the tree ends, so systemd cannot have stopped the
		// scope by itself when Remove runs.
		sd := pid1Cgroup(t)
		freeze(t, sd, true)
		thawed := false
		thaw := func() {
			if !thawed {
				thawed = true
				freeze(t, sd, false)
			}
		}
		t.Cleanup(thaw)
		c.wait(t, 10*time.Second)
		waitEmpty(t, c.sc, 10*time.Second)
		done := make(chan error, 1)
		go func() { done <- c.sc.Remove() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Remove with systemd frozen: %v", c.sc.Name(), err)
			}
		case <-time.After(10 * time.Second):
			thaw()
			t.Fatalf("%s: Remove still waiting for the frozen systemd after 10 s", c.sc.Name())
		}
		for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
			if procs, err := os.ReadFile(filepath.Join(root, cg, "cgroup.procs")); err == nil && strings.TrimSpace(string(procs)) != "" {
				t.Errorf("%s: processes left in the removed scope: %s", c.sc.Name(), procs)
			}
		}
		thaw()
		waitUnloaded(t, c.sc.Name(), 10*time.Second)
	}
	b.Close() // returns once the background unloads ended
}
