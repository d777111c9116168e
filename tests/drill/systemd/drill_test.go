// Package systemd runs the failure drills that need a service manager:
// corrald as the real corrald.service/corrald.socket units (deploy/),
// inside the private systemd of tests/harness, under the drill's mixed load,
// while it is killed with SIGKILL (Restart=on-failure brings it back),
// reloaded (handover, when the daemon reports it), while PID 1 re-executes
// itself (daemon-reexec) and while D-Bus restarts.
package systemd

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/drill"
	"github.com/corral-dev/corral/tests/harness"
)

const (
	socket   = "/run/corral/corrald.sock"
	stateDir = "/run/corral-drill-state" // tmpfs inside the harness
	// metricsSock is corrald's --metrics-listen socket, when it has one:
	// the drill reads the daemon's goroutine count from it.
	metricsSock = "/run/corral-drill-metrics.sock"
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(harness.RunInsideWithBinaries(m, "corrald", "corral-shim"))
}

// setup installs corrald's real units with ExecStart pointing at the binary
// under test and the state on a tmpfs, and starts the socket.
func setup(t *testing.T) {
	t.Helper()
	var args []string
	if drill.SupportsMetrics(harness.Binary("corrald")) {
		args = append(args, "--metrics-listen", "unix:"+metricsSock)
	}
	harness.Corrald{StateDir: stateDir, Args: append([]string{"--kill-wait", "3s"}, args...)}.Install(t, "corrald.socket", "corrald.service")
}

func mainPID(t *testing.T) int {
	t.Helper()
	pid, _ := strconv.Atoi(harness.Sh(t, "systemctl", "show", "-p", "MainPID", "--value", "corrald.service"))
	return pid
}

// env is the systemd drill's view of the daemon: the fd baseline of its
// idle state and how to find what it left.
type env struct {
	t        *testing.T
	run      string
	fdBase   map[string]int
	poolBase int              // waiting pool shims at the baseline
	goBase   drill.Goroutines // nil: the daemon has no metrics endpoint
}

func (e *env) settle(ctx context.Context) {
	c, err := drill.DialRetry(ctx, socket, 30*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"true"}, Cwd: "/"})
	if err == nil {
		_, err = c.Wait(ctx, api.WaitParams{ID: rec.ID})
	}
	if err != nil {
		e.t.Fatalf("warm-up execution: %v", err)
	}
	time.Sleep(time.Second) // the warm pool refills
	e.fdBase = drill.FDList(mainPID(e.t))
	// Goroutines before PoolIdle: a connection the client closed ends in
	// the daemon asynchronously (see leftovers).
	e.goBase = nil
	if _, err := os.Stat(metricsSock); err == nil {
		g, err := drill.DaemonGoroutines(ctx, metricsSock)
		if err != nil {
			e.t.Fatal(err)
		}
		e.goBase = g
	}
	e.poolBase = drill.PoolIdle(ctx, socket)
}

// leftovers: corral-<id>.scope units (pool scopes are the daemon's own),
// marked processes, workspaces, daemon fds above the idle count.
func (e *env) leftovers(ctx context.Context) []string {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left []string
		// The goroutines first, as tests/drill's leftovers: PoolIdle's
		// connection (below) of the round before has ended by now, one
		// closed just now may still be ending in the daemon.
		var goroutines drill.Goroutines
		var goErr error
		if e.goBase != nil {
			goroutines, goErr = drill.DaemonGoroutines(ctx, metricsSock)
		}
		out, _ := exec.Command("systemctl", "list-units", "--all", "--plain", "--no-legend", "corral-*.scope").Output()
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || strings.HasPrefix(f[0], "corral-pool-") {
				continue
			}
			left = append(left, "unit "+l)
		}
		left = append(left, drill.MarkedProcesses(e.run)...)
		ents, _ := os.ReadDir(filepath.Join(stateDir, "work"))
		for _, w := range ents {
			left = append(left, "workspace "+w.Name())
		}
		if pid := mainPID(e.t); pid > 0 {
			if more := drill.FDsAbove(pid, e.fdBase, filepath.Join(stateDir, store.FileName), drill.PoolIdle(ctx, socket)-e.poolBase); more != "" {
				left = append(left, more)
			}
		}
		if e.goBase != nil {
			if goErr != nil {
				left = append(left, goErr.Error())
			} else if len(goroutines) > len(e.goBase) {
				left = append(left, fmt.Sprintf("daemon runs %d goroutines, %d before the load; by the function each started in:\n%s",
					len(goroutines), len(e.goBase), goroutines.More(e.goBase)))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return left
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func survival(t *testing.T, ctx context.Context) drill.Survival {
	t.Helper()
	c, err := drill.DialRetry(ctx, socket, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := drill.DaemonSurvival(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDrillSystemd(t *testing.T) {
	harness.Require(t)
	setup(t)
	t.Cleanup(func() {
		exec.Command("systemctl", "stop", "corrald.service", "corrald.socket").Run()
	})
	ctx := context.Background()
	tm := drill.FromFlags()
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	cfg := drill.Config{Socket: socket, Run: run, Seed: 14}
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	tty, err := drill.Probe(pctx, socket)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	cfg.TTY = tty
	e := &env{t: t, run: run}
	e.settle(ctx)
	rep := drill.Report{Title: "systemd faults: corrald.service in the tests/harness systemd (systemd backend)"}
	rep.Header = append(rep.Header, fmt.Sprintf("Commit %s; %d clients; each fault: %v of load, %v of fault, %v after; %s; terminals in the mix: %v.",
		drill.Commit(), tm.Clients, tm.Before, tm.During, tm.After, drill.Host(), tty))
	checks := drill.Checks{Socket: socket, Leftovers: e.leftovers}
	faults := []struct {
		name string
		f    func() drill.Fault
	}{
		{"sd-kill-9", func() drill.Fault { return kill9(t, ctx) }},
		{"sd-reload", func() drill.Fault { return reload(t, ctx) }},
		{"daemon-reexec", func() drill.Fault { return reexec(t) }},
		{"dbus-restart", func() drill.Fault { return dbusRestart(t) }},
	}
	for _, f := range faults {
		if !drill.Selected(f.name) {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			fault := f.f()
			if fault.Inject == nil {
				rep.Rows = append(rep.Rows, drill.Row{Fault: f.name, Skipped: "daemon.info reports survival.handover false"})
				return
			}
			before := unitState(t)
			if f.name != "sd-kill-9" {
				// Only sd-kill-9 restarts corrald on purpose: anywhere else a
				// restart is a bug, and the first thing to know about it is
				// how systemd saw the main process end.
				after := fault.After
				fault.After = func(ctx context.Context) []string {
					var problems []string
					if after != nil {
						problems = after(ctx)
					}
					if now := unitState(t); now.NRestarts != before.NRestarts || now.MainPID != before.MainPID {
						problems = append(problems, fmt.Sprintf("corrald restarted during the phase: main pid %s -> %s, NRestarts %s -> %s, fds in its store %s -> %s (now: Result=%s, ExecMainCode=%s, ExecMainStatus=%s; corrald's journal says how the old one ended)",
							before.MainPID, now.MainPID, before.NRestarts, now.NRestarts, before.NFileDescriptorStore, now.NFileDescriptorStore, now.Result, now.ExecMainCode, now.ExecMainStatus))
					}
					return problems
				}
			}
			began := time.Now()
			row := drill.RunPhase(cfg, tm, f.name, fault, checks)
			if !row.OK() {
				row.Problems = append(row.Problems, keepJournal(f.name, began))
			}
			rep.Rows = append(rep.Rows, row)
			if !row.OK() {
				t.Errorf("%s: %d wrong, %d unexpectedly lost, %d lost records, %d lost bytes, %d left over:\n%s",
					f.name, row.Wrong, row.UnexpectedLost, row.LostRecords, row.LostBytes, row.Leftovers, strings.Join(row.Problems, "\n"))
			}
			e.settle(ctx) // a restarted daemon has a baseline of its own
		})
	}
	fmt.Println(rep.Markdown())
	if p := drill.ReportPath("2-systemd"); p != "" {
		if err := rep.Write(harness.InsidePath(p)); err != nil {
			t.Error(err)
		}
	}
}

func kill9(t *testing.T, ctx context.Context) drill.Fault {
	return drill.Fault{
		Inject: func(ctx context.Context, ph *drill.Phase) string {
			s := survival(t, ctx)
			harness.Sh(t, "systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", "corrald.service")
			ph.MarkRecoverFrom()
			note := "corrald's main process killed with SIGKILL under load; Restart=on-failure brings it back; "
			if s.FDStore {
				ph.AllowLostUnanswered()
				note += "daemon.info reports survival.fdstore true: no execution whose exec.start was answered before the kill may end lost, " +
					"and one still starting is adopted once its command was let run (its fds are parked before, with the shim's exec-error pipe, which tells the restart whether it ran); " +
					"one whose command was never let run ends start_failed (nothing ran), and only one whose shim neither ran nor failed within 3 s of the restart may end lost, with that reason"
			} else {
				ph.AllowLostUnfinished()
				note += "daemon.info reports survival.fdstore false, so executions running at the kill may end lost"
			}
			return note
		},
	}
}

func reload(t *testing.T, ctx context.Context) drill.Fault {
	s := survival(t, ctx)
	if !s.Handover {
		return drill.Fault{} // reported as not run, with the reason
	}
	return drill.Fault{
		Inject: func(ctx context.Context, ph *drill.Phase) string {
			how := "systemctl reload corrald"
			if out, err := exec.Command("systemctl", "reload", "corrald.service").CombinedOutput(); err != nil {
				// A unit without ExecReload=: the signal it would send.
				harness.Sh(t, "systemctl", "kill", "--kill-whom=main", "--signal=SIGHUP", "corrald.service")
				how = fmt.Sprintf("SIGHUP to corrald's main process (systemctl reload: %s)", strings.TrimSpace(string(out)))
			}
			ph.MarkRecoverFrom()
			return how + " under load: handover to the binary on disk; daemon.info reports survival.handover true, so none may end lost; calls in flight may answer -32005"
		},
		AllowRefused: func(code api.Code, msg string) bool { return code == api.CodeShuttingDown },
	}
}

func reexec(t *testing.T) drill.Fault {
	return drill.Fault{
		Inject: func(ctx context.Context, ph *drill.Phase) string {
			harness.Sh(t, "systemctl", "daemon-reexec")
			ph.MarkRecoverFrom()
			return "systemctl daemon-reexec under load: PID 1 re-executes, every D-Bus connection to it drops; the systemd backend must reconnect and miss no unit event (none lost, none wrong, no scope left)"
		},
	}
}

func dbusRestart(t *testing.T) drill.Fault {
	return drill.Fault{
		Inject: func(ctx context.Context, ph *drill.Phase) string {
			harness.Sh(t, "systemctl", "restart", "dbus.service")
			ph.MarkRecoverFrom()
			return "systemctl restart dbus under load: the bus goes away and comes back; the systemd backend must reconnect and miss no unit event"
		},
	}
}

// unitProps is what systemd says of corrald.service's main process.
type unitProps struct {
	MainPID, NRestarts, Result, ExecMainCode, ExecMainStatus, NFileDescriptorStore string
}

func unitState(t *testing.T) unitProps {
	t.Helper()
	out := harness.Sh(t, "systemctl", "show", "-p", "MainPID,NRestarts,Result,ExecMainCode,ExecMainStatus,NFileDescriptorStore", "corrald.service")
	var p unitProps
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "MainPID":
			p.MainPID = v
		case "NRestarts":
			p.NRestarts = v
		case "Result":
			p.Result = v
		case "ExecMainCode":
			p.ExecMainCode = v
		case "ExecMainStatus":
			p.ExecMainStatus = v
		case "NFileDescriptorStore":
			p.NFileDescriptorStore = v
		}
	}
	return p
}

// journalFields are the journal fields keepJournal keeps of each entry:
// corrald's own (systemd.JournalWriter: EVENT, EXEC_ID, ERROR, and the
// whole event in JSON) and, for what is not corrald's zerolog (systemd's
// lines about the unit, a panic or SIGQUIT dump on stderr), MESSAGE and
// PRIORITY.
const journalFields = "MESSAGE,PRIORITY,EVENT,EXEC_ID,ERROR,_PID,JSON"

// keepJournal copies corrald.service's journal since the phase began (the
// journal is in the harness's /run, gone with it) beside the report, for a
// phase that failed or left something behind, and says where. Each entry
// is a timestamped header and one FIELD=value line per field, so `grep
// EVENT=` or `grep PRIORITY=3` finds what corrald reported.
func keepJournal(fault string, since time.Time) string {
	rp := drill.ReportPath("2-systemd")
	if rp == "" {
		return "corrald's journal not kept without -drill.report"
	}
	out, err := exec.Command("journalctl", "--no-pager", "-u", "corrald.service", "-o", "verbose", "--output-fields="+journalFields,
		fmt.Sprintf("--since=@%d", since.Unix())).Output()
	if err != nil {
		return fmt.Sprintf("corrald's journal not kept: journalctl: %v", err)
	}
	name := "corrald-journal-" + fault + ".log"
	if err := os.WriteFile(harness.InsidePath(filepath.Join(filepath.Dir(rp), name)), out, 0o644); err != nil {
		return fmt.Sprintf("corrald's journal not kept: %v", err)
	}
	// By name: the report's directory is seen under another path inside
	// the harness than on the host.
	return fmt.Sprintf("corrald's journal since the phase began (%d entries): %s, beside this report", bytes.Count(out, []byte("\n    MESSAGE=")), name)
}
