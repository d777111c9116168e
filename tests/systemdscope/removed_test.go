package systemdscope_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/tests/harness"
)

// Remove of a scope whose command exited ends on systemd's UnitRemoved
// signal under the backend's own dial (root, the private socket): the unit
// is unloaded and its cgroup gone when Remove returns, and Remove never
// had to look for the unit itself (its debug log would say "looking for
// the unit").
func TestRemoveEndsOnUnitRemoved(t *testing.T) {
	harness.Require(t)
	var logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := scope.NewSystemd(ctx, scope.SystemdOptions{JobTimeout: 15 * time.Second, Log: zerolog.New(&logs).Level(zerolog.DebugLevel)})
	if err != nil {
		t.Fatalf("NewSystemd: %v", err)
	}
	t.Cleanup(func() { b.Close() })

	for i := range 5 {
		id := uniqueID(t) + "-" + string(rune('a'+i))
		c := startIn(t, b, id, scope.Limits{}, "sleep", "0.2")
		cg := unitProp(t, c.sc.Name(), "ControlGroup")
		c.wait(t, 10*time.Second)
		waitEmpty(t, c.sc, 10*time.Second)
		if i%2 == 1 {
			// A scope past the kernel's cgroup.events rate limit, which
			// systemd stops by itself (the pooled case).
			time.Sleep(30 * time.Millisecond)
		}
		if err := c.sc.Remove(); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		if st := unitProp(t, c.sc.Name(), "LoadState"); st != "not-found" {
			t.Errorf("%s: LoadState %q after Remove, want not-found (unloaded)", c.sc.Name(), st)
		}
		if cg == "" {
			t.Fatalf("%s: no ControlGroup", c.sc.Name())
		}
		// The unified hierarchy (pure v2 or hybrid) and name=systemd.
		for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"} {
			if _, err := os.Stat(filepath.Join(root, cg)); !os.IsNotExist(err) {
				t.Errorf("%s: cgroup %s still there after Remove (stat: %v)", c.sc.Name(), filepath.Join(root, cg), err)
			}
		}
	}
	if strings.Contains(logs.String(), "looking for the unit") {
		t.Errorf("Remove fell back to looking for the unit; log:\n%s", logs.String())
	}
}
