package reactor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/tests/testd"
	"github.com/corral-dev/corral/tests/testenv"
)

// TestCleanupThroughCgroupEvents: under the cgroup backend the reactor
// waits for the scope to empty through its cgroup.events in the epoll set.
// A main process that exits at once leaving a background child, and one
// whose tree is all gone at its exit, both end cleaned with the tree gone,
// the cgroup removed, no fd left open and no timer left behind.
func TestCleanupThroughCgroupEvents(t *testing.T) {
	testenv.CheckFDs(t)
	be, base := strictCgroupBackend(t)
	tr := newTestReactor(t, func(c *Config) { c.Backend = be })

	// The background sleep keeps the scope populated after the main
	// process exited; cleanup SIGKILLs it, and cleaned follows its death.
	rec := tr.run(api.StartParams{Argv: []string{"/bin/sh", "-c", "sleep 1000 >/dev/null 2>&1 </dev/null & echo $!"}})
	pid, err := strconv.Atoi(strings.TrimSpace(tr.stdout(rec.ID)))
	if err != nil {
		t.Fatalf("stdout %q: no pid", tr.stdout(rec.ID))
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("background sleep %d alive after cleaned", pid)
	}
	if rec.Error != nil {
		t.Errorf("cleaned with error %q, want none (the tree died within --kill-wait)", *rec.Error)
	}
	if _, err := os.Stat(filepath.Join(base, rec.ID)); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there after cleaned (%v)", rec.ID, err)
	}
	for i := 0; i < 20; i++ {
		rec := tr.run(api.StartParams{Argv: []string{"/bin/true"}})
		if outcome(rec) != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != 0 {
			t.Fatalf("/bin/true: outcome %v, exit %v", outcome(rec), rec.ExitCode)
		}
	}
	// Each cleanup armed one KillWait timer and stopped it when it ended.
	var timers int
	if err := tr.onLoop(t.Context(), func() { timers = tr.loop.Timers() }); err != nil {
		t.Fatal(err)
	}
	if timers > 1 { // the reaper's or the sampler's may tick
		t.Errorf("%d timers armed with nothing running", timers)
	}
	if left := testd.CgroupChildren(base); len(left) > 0 {
		t.Errorf("cgroups left under %s: %v", base, left)
	}
}
