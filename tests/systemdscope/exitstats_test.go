package systemdscope_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/scope"
)

// ExitStats, what the reactor reads at the main process's exit, tells a
// scope with a process left from an empty one and reads the counters with
// it: one reading where Stats and then Empty would read every counter
// twice.
func TestExitStats(t *testing.T) {
	b, _ := newBackend(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	c := startIn(t, b, uniqueID(t), scope.Limits{},
		"sh", "-c", `(setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$1"); i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done`, "sh", pidFile)
	c.wait(t, 10*time.Second)
	readPid(t, pidFile, 5*time.Second)
	x, ok := c.sc.(scope.ExitStatser)
	if !ok {
		t.Fatalf("%T does not implement scope.ExitStatser", c.sc)
	}
	st, empty, err := x.ExitStats()
	if err != nil || empty {
		t.Fatalf("ExitStats with the sleep left = empty %v, err %v; want not empty", empty, err)
	}
	if st.Tasks < 1 {
		t.Errorf("ExitStats with the sleep left: Tasks = %d, want >= 1", st.Tasks)
	}
	if st.CPUUsageNS <= 0 {
		t.Errorf("ExitStats: CPUUsageNS = %d after a busy loop, want > 0", st.CPUUsageNS)
	}
	if err := c.sc.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitEmpty(t, c.sc, 10*time.Second)
	st2, empty, err := x.ExitStats()
	if err != nil || !empty {
		t.Fatalf("ExitStats once killed = empty %v, err %v; want empty", empty, err)
	}
	if st2.Tasks != 0 || st2.CPUUsageNS < st.CPUUsageNS {
		t.Errorf("ExitStats once killed: Tasks %d, CPUUsageNS %d (before %d); want 0 and no less", st2.Tasks, st2.CPUUsageNS, st.CPUUsageNS)
	}
}
