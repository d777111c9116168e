package reactor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// TestStartedAtIsWhenTheCommandStarted: started_at, and the wall limit that
// counts from it, are when corral let the command run, not when the loop
// took the child up. A loop that takes it up late (here 400 ms, as a loaded
// host does) must not push started_at past the child's first instruction,
// nor stretch timeout_ms by that delay.
func TestStartedAtIsWhenTheCommandStarted(t *testing.T) {
	for _, pool := range []bool{false, true} {
		name, mod := "direct", func(*Config) {}
		if pool {
			name, mod = "pooled shim", func(c *Config) { c.PoolSize = 1 }
		}
		t.Run(name, func(t *testing.T) {
			tr := newTestReactor(t, mod)
			tr.beforeAdopt = func() { time.Sleep(400 * time.Millisecond) }
			dir := t.TempDir() // <tmp>/<test>NNN/001: both levels open to nobody
			for _, d := range []string{filepath.Dir(dir), dir} {
				if err := os.Chmod(d, 0o777); err != nil {
					t.Fatal(err)
				}
			}
			f := filepath.Join(dir, "t")
			p := api.StartParams{Argv: []string{"sh", "-c", "date +%s%N > " + f + "; exec sleep 10"}, TimeoutMS: 1000, GraceMS: 100, Cwd: "/"}
			if pool {
				p.User = "nobody" // the pool serves commands that need a shim
				for deadline := time.Now().Add(10 * time.Second); tr.pool.idleCount() == 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
			}
			rec := tr.start(p)
			final := tr.wait(rec.ID)
			if pool && tr.pool.hits.Load() == 0 {
				t.Fatal("the pooled case did not go through the pool")
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatalf("the child wrote no start time: %v (outcome %s)", err, outcome(final))
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			child := time.Unix(0, ns)
			if final.StartedAt == nil || final.StartedAt.After(child) {
				t.Errorf("started_at %v is after the child's own first action at %v", final.StartedAt, child)
			}
			// The running record (exec.start's answer) carries the deadline.
			if rec.Deadline == nil || rec.StartedAt == nil || !rec.Deadline.Equal(rec.StartedAt.Add(time.Second)) {
				t.Errorf("deadline %v, want started_at %v + timeout_ms 1000", rec.Deadline, rec.StartedAt)
			}
			if outcome(final) != api.OutcomeTimeout {
				t.Errorf("outcome %s, want timeout", outcome(final))
			}
		})
	}
}
