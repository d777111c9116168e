package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// tmux is a private tmux server (its own socket) for one test.
type tmux struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is needed (apt package tmux; .ci/run installs it): %v", err)
	}
	tm := &tmux{t: t, socket: fmt.Sprintf("corral-it-%d-%d", os.Getpid(), time.Now().UnixNano())}
	t.Cleanup(func() { _ = tm.cmd("kill-server").Run() })
	return tm
}

func (tm *tmux) cmd(args ...string) *exec.Cmd {
	return exec.Command("tmux", append([]string{"-L", tm.socket, "-f", "/dev/null"}, args...)...)
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := tm.cmd(args...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// screen is what the pane shows now.
func (tm *tmux) screen() string { return tm.run("capture-pane", "-p", "-t", "t") }

// waitFor waits until the pane shows want, n times at least (capture-pane
// drops trailing spaces: a prompt "p$ " shows as "p$").
func (tm *tmux) waitFor(want string, n int) string {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := tm.screen()
		if strings.Count(s, want) >= n {
			return s
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("pane does not show %q %d times:\n%s", want, n, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runCorralctl starts, in a new tmux session "t" of x columns and y rows,
// a shell that saves its terminal's modes (stty -g) to dir/before, runs
// `corralctl run <args>` against d, prints "EXIT=<its status>", saves the
// modes again to dir/after and sleeps; it returns dir (the test's own).
func (tm *tmux) runCorralctl(d *daemon, x, y int, args string) (dir string) {
	tm.t.Helper()
	dir = tm.t.TempDir()
	script := fmt.Sprintf(`stty -g > %[1]s/before
CORRAL_SOCKET=%[2]s %[3]s run %[4]s
echo "EXIT=$?"
stty -g > %[1]s/after
exec sleep 600
`, dir, d.Socket, filepath.Join(binDir, "corralctl"), args)
	if err := os.WriteFile(filepath.Join(dir, "outer.sh"), []byte(script), 0o755); err != nil {
		tm.t.Fatal(err)
	}
	tm.run("new-session", "-d", "-s", "t", "-x", strconv.Itoa(x), "-y", strconv.Itoa(y), "sh "+filepath.Join(dir, "outer.sh"))
	return dir
}

// modesRestored waits up to 10s for runCorralctl's dir/after and fails the
// test unless the terminal's modes there are those of dir/before (when
// says at what point, "after corralctl").
func modesRestored(t *testing.T, dir, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var before, after []byte
	for {
		before, _ = os.ReadFile(filepath.Join(dir, "before"))
		after, _ = os.ReadFile(filepath.Join(dir, "after"))
		if len(after) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(before) == 0 || string(before) != string(after) {
		t.Fatalf("terminal modes %s = %q, want as before %q", when, after, before)
	}
}

// `corralctl run -it -- sh` in a real terminal (tmux): the command's prompt
// appears, typed keys are echoed and run, a window resize reaches the
// command's terminal, Ctrl-C interrupts the command's foreground job (it is
// a byte to the command, not a signal to corralctl), and once the command
// exits corralctl has put the terminal's modes back as they were.
func TestRunInteractiveInTmux(t *testing.T) {
	d := startDaemon(t, "--scope", "pgroup")
	tm := newTmux(t)
	dir := tm.runCorralctl(d, 100, 30, `-it --env PS1='corral$ ' -- sh`)
	tm.waitFor("corral$", 1)

	tm.run("send-keys", "-t", "t", "echo $((6*7))", "Enter")
	s := tm.waitFor("corral$", 2)
	if !strings.Contains(s, "corral$ echo $((6*7))") || !strings.Contains(s, "\n42\n") {
		t.Fatalf("typed line not echoed and run:\n%s", s)
	}
	tm.run("send-keys", "-t", "t", "stty size", "Enter")
	tm.waitFor("30 100", 1)

	tm.run("resize-window", "-t", "t", "-x", "120", "-y", "40")
	// The resize travels as SIGWINCH -> exec.resize; poll until it landed.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(tm.screen(), "40 120") {
		if time.Now().After(deadline) {
			t.Fatalf("stty size never showed 40 120 after the resize:\n%s", tm.screen())
		}
		tm.run("send-keys", "-t", "t", "stty size", "Enter")
		time.Sleep(300 * time.Millisecond)
	}

	// Ctrl-C: the command's sleep is interrupted, corralctl stays.
	// TERM came from corralctl's own environment (tmux sets it).
	tm.run("send-keys", "-t", "t", "clear; echo term=$TERM", "Enter")
	tm.waitFor("term=tmux", 1)
	tm.run("send-keys", "-t", "t", "sleep 100", "Enter")
	tm.waitFor("sleep 100", 1)
	time.Sleep(300 * time.Millisecond)
	tm.run("send-keys", "-t", "t", "C-c")
	tm.waitFor("^C", 1)
	tm.run("send-keys", "-t", "t", "echo after-sleep $?", "Enter")
	s = tm.waitFor("after-sleep 130", 1)
	if strings.Contains(s, "EXIT=") || strings.Contains(s, "cancelling") {
		t.Fatalf("Ctrl-C reached corralctl instead of the command:\n%s", s)
	}

	tm.run("send-keys", "-t", "t", "exit 0", "Enter")
	tm.waitFor("EXIT=0", 1)
	modesRestored(t, dir, "after corralctl")
}

// A signal to corralctl while it holds its terminal in raw mode: the
// execution is cancelled and corralctl exits, and the terminal's modes are
// back as they were.
func TestRunInteractiveRestoresModesOnSignal(t *testing.T) {
	d := startDaemon(t, "--scope", "pgroup")
	tm := newTmux(t)
	marker := fmt.Sprintf("MARK=%d", time.Now().UnixNano())
	dir := tm.runCorralctl(d, 80, 24, "-it --env "+marker+" -- sh -c 'echo started; sleep 100'")
	tm.waitFor("started", 1)
	pid := pidWithArg(t, marker)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s := tm.waitFor("EXIT=", 1)
	if !strings.Contains(s, "EXIT=143") {
		t.Errorf("corralctl after SIGTERM (cancelled sleep): want EXIT=143 (128+SIGTERM):\n%s", s)
	}
	modesRestored(t, dir, "after a signalled corralctl")
}

// pidWithArg finds the process whose command line has the argument arg.
func pidWithArg(t *testing.T, arg string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			args := strings.Split(string(b), "\x00")
			if len(args) > 0 && strings.HasSuffix(args[0], "corralctl") && slices.Contains(args, arg) {
				return pid
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no corralctl process with argument %q", arg)
	return 0
}

// Input from a pipe into a terminal execution (-it without a local
// terminal): typed into the command's terminal; EOF of the pipe is the
// terminal's EOF, so the shell ends.
func TestRunTerminalInputFromPipe(t *testing.T) {
	d := startDaemon(t, "--scope", "pgroup")
	cmd := exec.Command(filepath.Join(binDir, "corralctl"), "run", "-it", "--", "sh")
	cmd.Env = append(os.Environ(), "CORRAL_SOCKET="+d.Socket)
	cmd.Stdin = strings.NewReader("echo $((20+22))\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("corralctl run -it -- sh < pipe: %v (output %q)", err, out)
	}
	if !strings.Contains(string(out), "42\r\n") {
		t.Fatalf("output %q does not show the typed command's result", out)
	}
}

// corralctl's terminal commands against a real daemon: run -t without a
// local terminal, --idle-timeout (exit 124), extend, status showing the
// terminal, idle limit and deadline, and logs -f of a terminal execution.
func TestCorralctlTerminalCommands(t *testing.T) {
	d := startDaemon(t, "--scope", "pgroup")

	code, out, errs := d.ctl("run", "-t", "--", "sh", "-c", "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo on-a-tty")
	if code != 0 || out != "on-a-tty\r\n" {
		t.Fatalf("run -t = %d, %q (stderr %q); want 0 and on-a-tty", code, out, errs)
	}
	code, _, errs = d.ctl("run", "--idle-timeout", "300ms", "--", "sleep", "30")
	if code != 124 || !strings.Contains(errs, "no output") {
		t.Fatalf("run --idle-timeout 300ms -- sleep 30 = %d (stderr %q), want 124", code, errs)
	}

	code, out, errs = d.ctl("run", "--detach", "-t", "--idle-timeout", "1m", "--timeout", "1h", "--", "sh", "-c", "sleep 1; echo hi-from-tty; sleep 30")
	if code != 0 {
		t.Fatalf("run --detach = %d (stderr %q)", code, errs)
	}
	id := strings.TrimSpace(out)
	code, out, errs = d.ctl("status", id)
	if code != 0 || !strings.Contains(out, "Terminal:") || !strings.Contains(out, "24x80") ||
		!strings.Contains(out, "Idle timeout:") || !strings.Contains(out, "Deadline:") {
		t.Fatalf("status = %d:\n%s\n(stderr %q); want terminal, idle timeout and deadline", code, out, errs)
	}
	code, out, errs = d.ctl("extend", id, "5s")
	if code != 0 || !strings.Contains(out, "deadline") {
		t.Fatalf("extend = %d, %q (stderr %q)", code, out, errs)
	}
	logs := make(chan string, 1)
	go func() {
		_, out, _ := d.ctl("logs", "-f", id)
		logs <- out
	}()
	rec, err := d.Client().Wait(context.Background(), api.WaitParams{ID: id})
	if err != nil || rec.Outcome == nil || *rec.Outcome != api.OutcomeTimeout || rec.DurationMS > 20000 {
		t.Fatalf("after extend 5s: %v outcome %v after %d ms; want timeout at the new deadline", err, rec.Outcome, rec.DurationMS)
	}
	select {
	case out := <-logs:
		if !strings.Contains(out, "hi-from-tty") {
			t.Fatalf("logs -f of a terminal execution = %q", out)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("logs -f did not end with the execution")
	}
	code, _, errs = d.ctl("extend", id, "10s")
	if code == 0 || !strings.Contains(errs, "exited") {
		t.Fatalf("extend of a finished execution = %d (stderr %q), want a failure", code, errs)
	}
}

// 100 MB through a terminal: counted exactly, the daemon's RSS bounded.
func TestHundredMegabytesThroughTerminalKeepsDaemonRSSBounded(t *testing.T) {
	d := startDaemon(t, "--scope", "cgroup")
	c := d.Client()
	before := d.rss()
	rec, err := c.Start(context.Background(), api.StartParams{Argv: []string{"head", "-c", "100000000", "/dev/zero"}, TTY: true, TimeoutMS: 120000})
	if err != nil {
		t.Fatal(err)
	}
	rec, peak := d.waitPeakRSS(c, rec.ID)
	if rec.Stdout.TotalBytes != 1e8 || !rec.Stdout.Truncated || rec.Stdout.KeptBytes != api.DefaultOutputLimitBytes || rec.Stderr.TotalBytes != 0 {
		t.Errorf("stdout = %+v stderr %+v, want 1e8 counted on stdout", rec.Stdout, rec.Stderr)
	}
	if rec.Outcome == nil || *rec.Outcome != api.OutcomeExited {
		t.Errorf("outcome %v", rec.Outcome)
	}
	if grew := peak - before; grew > 48<<20 {
		t.Errorf("daemon RSS grew by %d MiB during 100 MB through a terminal", grew>>20)
	}
	t.Logf("daemon RSS before %d MiB, peak %d MiB", before>>20, peak>>20)
}
