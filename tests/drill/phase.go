package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/api"
)

// Fault is what one drill phase does to the daemon while the load runs.
type Fault struct {
	// Inject puts the fault in place (or, for a one-shot fault, strikes)
	// and returns a note for the report.
	Inject func(ctx context.Context, ph *Phase) string
	// Clear removes it, after the phase's During (nil: nothing to remove).
	Clear func(ctx context.Context, ph *Phase)
	// SelfTimed: Inject itself lasts the fault's duration.
	SelfTimed bool
	// AllowRefused and Tolerate: see Checks.
	AllowRefused func(code api.Code, msg string) bool
	Tolerate     func(rec api.Record) bool
	// After runs once the load has stopped, before the checks (a fault's
	// own checks); each problem it returns counts as wrong.
	After func(ctx context.Context) []string
}

// RunPhase runs the load (cfg, tm) on the daemon at ch.Socket, injects f
// after tm.Before, clears it after tm.During, lets the load run tm.After
// more, stops it and checks.
func RunPhase(cfg Config, tm Timing, name string, f Fault, ch Checks) Row {
	ctx := context.Background()
	ph := NewPhase(name)
	cfg.Clients = tm.Clients
	load := StartLoad(cfg, ph)
	defer load.Stop() // a fault that fails the test stops the load too
	time.Sleep(tm.Before)
	ph.MarkFault()
	note := f.Inject(ctx, ph)
	if !f.SelfTimed {
		time.Sleep(tm.During)
	}
	if f.Clear != nil {
		f.Clear(ctx, ph)
	}
	ph.MarkCleared()
	time.Sleep(tm.After)
	load.Stop()
	var extra []string
	if f.After != nil {
		extra = f.After(ctx)
	}
	ch.AllowRefused, ch.Tolerate = f.AllowRefused, f.Tolerate
	row := ph.Check(ctx, ch)
	row.Note = note
	row.Wrong += len(extra)
	row.Problems = append(extra, row.Problems...)
	return row
}

// MarkedProcesses lists the processes whose environment carries DRILL_RUN=run.
func MarkedProcesses(run string) []string {
	var out []string
	for _, pid := range procsWith("DRILL_RUN=" + run) {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		out = append(out, fmt.Sprintf("process %d %q", pid, bytes.ReplaceAll(bytes.TrimRight(cmd, "\x00"), []byte{0}, []byte{' '})))
	}
	return out
}

// ProcsOf lists the pids whose environment carries DRILL_EXEC=id.
func ProcsOf(id string) []int { return procsWith("DRILL_EXEC=" + id) }

func procsWith(kv string) []int {
	ents, _ := os.ReadDir("/proc")
	marker := []byte(kv + "\x00")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if env, err := os.ReadFile("/proc/" + e.Name() + "/environ"); err == nil && bytes.Contains(env, marker) {
			out = append(out, pid)
		}
	}
	return out
}

// FDList counts pid's fds by what they point at (socket:[n] counts as
// socket:, a log file as "the daemon's log").
func FDList(pid int) map[string]int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	m := make(map[string]int)
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if i := strings.IndexByte(l, '['); i > 0 && strings.HasSuffix(l, "]") {
			l = l[:i]
		}
		if strings.HasSuffix(l, ".log") {
			l = "the daemon's log"
		}
		m[l]++
	}
	return m
}

// poolEntryFDs are the daemon's fds of one waiting shim of the warm pool:
// its control socket, its exec-error pipe, the pidfd os/exec keeps in its
// Process and the pool's own dup of it.
var poolEntryFDs = map[string]int{"socket:": 1, "pipe:": 1, "anon_inode:": 2}

// PoolIdle is how many shims wait in the daemon's warm pool (daemon.info
// pool.idle; 0 without a pool, or when the daemon does not answer). The
// pool grows with misses under load and steps back only after a quiet
// while, so a check after the load allows its extra entries' fds.
//
// It returns once the daemon has closed its end of the connection it
// asked on: it shuts down its own writing after the request and reads to
// EOF, which comes when the daemon has answered and closed the socket. A
// client that just closes returns while the daemon still holds the
// connection (it ends it asynchronously), and the leftover check, which
// counts the daemon's fds right after, counted it as one socket more than
// before the load in most reads (TestCheckersOwnConnectionsNotCounted).
func PoolIdle(ctx context.Context, socket string) int {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ictx, "unix", socket)
	if err != nil {
		return 0
	}
	defer c.Close()
	nc := c.(*net.UnixConn)
	if dl, ok := ictx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if _, err := nc.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"daemon.info"}` + "\n")); err != nil {
		return 0
	}
	if err := nc.CloseWrite(); err != nil {
		return 0
	}
	all, err := io.ReadAll(nc) // to the daemon's close
	if err != nil {
		return 0
	}
	var resp struct {
		Result *api.Info `json:"result"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(all), &resp); err != nil || resp.Result == nil || resp.Result.Pool == nil {
		return 0
	}
	return resp.Result.Pool.Idle
}

// FDsAbove says which of pid's fds are above the baseline, leaving out the
// store's (its read pool opens connections as load needs them and keeps a
// bounded number: at most 16 fds of db files are accepted) and those of
// poolExtra more waiting shims than at the baseline (each exactly
// poolEntryFDs).
func FDsAbove(pid int, base map[string]int, dbPrefix string, poolExtra int) string {
	var more []string
	db, n := 0, 0
	for k, v := range FDList(pid) {
		n += v
		if dbPrefix != "" && strings.HasPrefix(k, dbPrefix) {
			db += v
			continue
		}
		if strings.HasPrefix(k, "/sys/fs/cgroup/") && strings.Contains(filepath.Base(k), "cpu.") {
			// The Go runtime's own: it keeps its cgroup's CPU limit files
			// open to follow GOMAXPROCS, opened after a while.
			continue
		}
		allowed := base[k]
		if poolExtra > 0 {
			allowed += poolExtra * poolEntryFDs[k]
		}
		if v > allowed {
			more = append(more, fmt.Sprintf("%d× %s", v-allowed, k))
		}
	}
	if len(more) == 0 && db <= 16 {
		return ""
	}
	return fmt.Sprintf("daemon holds %d fds (%d of the store; %d more waiting pool shims than before, allowed); more than before the load: %s", n, db, max(poolExtra, 0), strings.Join(more, ", "))
}

// SupportsMetrics reports whether the corrald binary knows --metrics-listen.
func SupportsMetrics(corrald string) bool {
	out, _ := exec.Command(corrald, "--help").CombinedOutput()
	return strings.Contains(string(out), "--metrics-listen")
}
