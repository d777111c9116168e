package drill

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/corral-dev/corral/ipc"
)

// Flags of the drill tests (go test ./tests/drill/... -args -drill.full).
// Without -drill.full they run the short form that `make test` runs.
var (
	flagFull    = flag.Bool("drill.full", false, "run the full drill (make drill): more clients, longer phases")
	flagClients = flag.Int("drill.clients", 64, "load clients in the full drill (the short form caps them at 8)")
	flagPhase   = flag.Duration("drill.phase", 0, "how long each fault lasts under load (default 3s short, 20s full)")
	flagReport  = flag.String("drill.report", "", "directory to write the report to, as <dir>/<name>.md (and its rows as JSON beside it)")
	flagFaults  = flag.String("drill.faults", "", "comma-separated faults to run (default all)")
)

// Timing is how long a phase runs its load before, during and after the
// fault, and with how many clients.
type Timing struct {
	Clients               int
	Before, During, After time.Duration
	Full                  bool
}

// FromFlags is the timing the flags ask for.
func FromFlags() Timing {
	if *flagFull {
		tm := Timing{Clients: *flagClients, Before: 10 * time.Second, During: 20 * time.Second, After: 10 * time.Second, Full: true}
		if *flagPhase > 0 {
			tm.During = *flagPhase
		}
		return tm
	}
	tm := Timing{Clients: min(*flagClients, 8), Before: 2 * time.Second, During: 3 * time.Second, After: 2 * time.Second}
	if *flagPhase > 0 {
		tm.During = *flagPhase
	}
	return tm
}

// Selected reports whether -drill.faults lets fault run.
func Selected(fault string) bool {
	if *flagFaults == "" {
		return true
	}
	for _, f := range strings.Split(*flagFaults, ",") {
		if strings.TrimSpace(f) == fault {
			return true
		}
	}
	return false
}

// ReportPath is where the report called name goes: -drill.report/name.md
// ("" when -drill.report is not given).
func ReportPath(name string) string {
	if *flagReport == "" {
		return ""
	}
	return filepath.Join(*flagReport, name+".md")
}

// Survival is what daemon.info says the daemon survives (v1.1's
// survival object; all false on a daemon that does not report it).
type Survival struct {
	Handover      bool `json:"handover"`
	FDStore       bool `json:"fdstore"`
	PidfdExitInfo bool `json:"pidfd_exit_info"`
}

// DaemonSurvival asks the daemon at c what it survives.
func DaemonSurvival(ctx context.Context, c *ipc.Client) (Survival, error) {
	var info struct {
		Survival *Survival `json:"survival"`
	}
	if err := c.Call(ctx, "daemon.info", nil, &info); err != nil {
		return Survival{}, fmt.Errorf("daemon.info: %w", err)
	}
	if info.Survival == nil {
		return Survival{}, nil
	}
	return *info.Survival, nil
}

// RawInfo is daemon.info as a map, for the report's notes.
func RawInfo(ctx context.Context, c *ipc.Client) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	_ = c.Call(ctx, "daemon.info", nil, &m)
	return m
}

// Commit is the commit the drill runs at (git describe), for the report.
func Commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// Host describes the machine for the report.
func Host() string {
	n, _ := os.ReadFile("/proc/loadavg")
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d CPUs, kernel %s, load average at start %s", runtime.NumCPU(), strings.TrimSpace(string(kernel)), strings.Join(strings.Fields(string(n))[:3], " "))
}
