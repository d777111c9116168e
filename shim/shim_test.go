package shim_test

import (
	"bytes"
	"errors"
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

	"github.com/corral-dev/corral/shim"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
)

// TestMain makes the test binary a shim too: Wrap starts /proc/self/exe.
// After the suite it checks that no fd (pipe, memfd, pidfd) or goroutine
// leaked.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == shim.Arg {
		shim.Main()
	}
	switch os.Getenv(pinChildEnv) {
	case "1":
		os.Exit(pinChild())
	case "stolen":
		os.Exit(pinStolenChild())
	case "below":
		os.Exit(pinBelowChild())
	}
	os.Exit(testenv.Main(m))
}

const testPath = "PATH=/usr/local/bin:/usr/bin:/bin"

// run is one wrapped command, started.
type run struct {
	cmd    *exec.Cmd
	h      *shim.Handle
	stdout *bytes.Buffer
	stderr *bytes.Buffer
}

// start wraps a fresh command with cfg, lets adjust change it, and starts it.
// Cleanup kills and reaps it and closes the Handle.
func start(t *testing.T, cfg shim.Config, adjust func(*exec.Cmd)) *run {
	t.Helper()
	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	r := &run{cmd: cmd, stdout: new(bytes.Buffer), stderr: new(bytes.Buffer)}
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	if adjust != nil {
		adjust(cmd)
	}
	h, err := shim.Wrap(cmd, cfg)
	if err != nil {
		t.Fatalf("Wrap: %v", err)
	}
	r.h = h
	err = cmd.Start()
	h.CloseChildEnds()
	if err != nil {
		h.Close()
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		h.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return r
}

// finish releases, collects the exec result and waits.
func (r *run) finish(t *testing.T) (*shim.ExecError, int) {
	t.Helper()
	if err := r.h.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	report, err := r.h.WaitExec(10 * time.Second)
	if err != nil {
		t.Fatalf("WaitExec: %v", err)
	}
	r.cmd.Wait()
	return report, r.cmd.ProcessState.ExitCode()
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root")
	}
}

func TestExecAfterRelease(t *testing.T) {
	r := start(t, shim.Config{Argv: []string{"sh", "-c", "echo hello; exit 3"}, Env: []string{testPath}, Hold: true}, nil)
	report, code := r.finish(t)
	if report != nil {
		t.Fatalf("exec report = %+v, want none", report)
	}
	if code != 3 || r.stdout.String() != "hello\n" {
		t.Errorf("exit %d, stdout %q; want 3, %q", code, r.stdout.String(), "hello\n")
	}
}

func TestNoHold(t *testing.T) {
	r := start(t, shim.Config{Argv: []string{"true"}, Env: []string{testPath}}, nil)
	report, code := r.finish(t) // Release is a no-op without Hold
	if report != nil || code != 0 {
		t.Errorf("report %+v, exit %d; want none, 0", report, code)
	}
}

func TestHoldHolds(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	r := start(t, shim.Config{Argv: []string{"touch", marker}, Env: []string{testPath}, Hold: true}, nil)

	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("command ran before Release")
	}
	self, _ := os.Readlink("/proc/self/exe")
	if exe, err := os.Readlink("/proc/" + itoa(r.cmd.Process.Pid) + "/exe"); err != nil || exe != self {
		t.Errorf("held child's exe = %q (%v), want the shim %q", exe, err, self)
	}
	if _, err := shim.ReadExecError(r.h.ErrFD()); !errors.Is(err, shim.ErrPending) {
		t.Errorf("ReadExecError while held = %v, want ErrPending", err)
	}

	if report, code := r.finish(t); report != nil || code != 0 {
		t.Fatalf("report %+v, exit %d; want none, 0", report, code)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("command did not run after Release: %v", err)
	}
}

func TestCloseWithoutRelease(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	r := start(t, shim.Config{Argv: []string{"touch", marker}, Env: []string{testPath}, Hold: true}, nil)
	r.h.Close()
	r.cmd.Wait()
	if code := r.cmd.ProcessState.ExitCode(); code != shim.ExitParentGone {
		t.Errorf("exit = %d, want %d", code, shim.ExitParentGone)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("command ran although the parent closed the Handle")
	}
	if r.stderr.Len() != 0 {
		t.Errorf("stderr = %q, want quiet", r.stderr.String())
	}
	if err := r.h.Release(); !errors.Is(err, shim.ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
}

func TestAbort(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	r := start(t, shim.Config{Argv: []string{"touch", marker}, Env: []string{testPath}, Hold: true}, nil)
	r.h.Abort()
	// It says so on its error pipe (what a restarted corrald that was
	// handed that pipe reads: nothing ran).
	if report, err := r.h.WaitExec(10 * time.Second); report == nil || report.Op != shim.OpParentGone || err != nil {
		t.Errorf("WaitExec after Abort = %+v, %v; want a %q report", report, err, shim.OpParentGone)
	}
	r.cmd.Wait()
	if code := r.cmd.ProcessState.ExitCode(); code != shim.ExitParentGone {
		t.Errorf("exit = %d, want %d", code, shim.ExitParentGone)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("command ran although the shim was aborted")
	}
	if err := r.h.Release(); !errors.Is(err, shim.ErrAborted) {
		t.Errorf("Release after Abort = %v, want ErrAborted", err)
	}
}

func TestExecFailures(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "notexec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		argv      []string
		dir       string
		wantOp    string
		wantErrno string
		wantCode  int
	}{
		{"missing in PATH", []string{"corral-no-such-command"}, "", "lookpath", "ENOENT", 127},
		{"missing absolute", []string{filepath.Join(dir, "missing")}, "", "exec", "ENOENT", 127},
		{"not executable", []string{notExec}, "", "exec", "EACCES", 126},
		{"bad cwd", []string{"true"}, filepath.Join(dir, "nodir"), "chdir", "ENOENT", 126},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := start(t, shim.Config{Argv: tt.argv, Env: []string{testPath}, Dir: tt.dir, Hold: true}, nil)
			report, code := r.finish(t)
			if report == nil {
				t.Fatalf("no exec report; exit %d", code)
			}
			if report.Op != tt.wantOp || report.Errno != tt.wantErrno || code != tt.wantCode {
				t.Errorf("report %+v, exit %d; want op %s, errno %s, exit %d", report, code, tt.wantOp, tt.wantErrno, tt.wantCode)
			}
			if report.ExitCode() != code {
				t.Errorf("report.ExitCode() = %d, process exit %d", report.ExitCode(), code)
			}
			if tt.wantErrno == "ENOENT" && !errors.Is(report, unix.ENOENT) {
				t.Errorf("errors.Is(%v, ENOENT) = false", report)
			}
		})
	}
}

func TestPathFromChildEnv(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "corral-test-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho from-child-path\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The daemon's PATH lacks dir: exec.Command fails its own lookup (cmd.Err),
	// which Wrap must clear.
	r := start(t, shim.Config{Argv: []string{"corral-test-tool"}, Env: []string{"PATH=" + dir + ":/usr/bin:/bin"}, Hold: true}, nil)
	report, code := r.finish(t)
	if report != nil || code != 0 || r.stdout.String() != "from-child-path\n" {
		t.Errorf("report %+v, exit %d, stdout %q; want none, 0, %q", report, code, r.stdout.String(), "from-child-path\n")
	}
}

func TestEnvExactly(t *testing.T) {
	t.Setenv("CORRAL_DAEMON_SECRET", "leak")
	env := []string{"A=1", testPath, "B=two words"}
	r := start(t, shim.Config{Argv: []string{"env"}, Env: env, Hold: true}, nil)
	if report, code := r.finish(t); report != nil || code != 0 {
		t.Fatalf("report %+v, exit %d", report, code)
	}
	got := strings.Split(strings.TrimSuffix(r.stdout.String(), "\n"), "\n")
	if !slices.Equal(got, env) {
		t.Errorf("child env = %q, want exactly %q", got, env)
	}
}

func TestOnlyStdioSurvivesExec(t *testing.T) {
	r := start(t, shim.Config{Argv: []string{"sleep", "30"}, Env: []string{testPath}, Hold: true}, nil)
	if err := r.h.Release(); err != nil {
		t.Fatal(err)
	}
	if report, err := r.h.WaitExec(10 * time.Second); report != nil || err != nil {
		t.Fatalf("WaitExec = %+v, %v", report, err)
	}
	// Right after exec the dynamic loader briefly holds the libraries it
	// maps (fd 3 on /usr/lib/.../libc.so.6), so one look can catch it. A
	// descriptor leaked by the shim never goes away: wait for the set to
	// settle on stdio and report what stayed if it does not.
	var fds []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		fds = fds[:0]
		ents, err := os.ReadDir("/proc/" + itoa(r.cmd.Process.Pid) + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			target, _ := os.Readlink("/proc/" + itoa(r.cmd.Process.Pid) + "/fd/" + e.Name())
			fds = append(fds, e.Name()+"->"+target)
		}
		if len(fds) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var names []string
	for _, f := range fds {
		names = append(names, strings.SplitN(f, "->", 2)[0])
	}
	if !slices.Equal(names, []string{"0", "1", "2"}) {
		t.Errorf("fds after exec = %v, want only 0, 1 and 2", fds)
	}
}

func TestRlimits(t *testing.T) {
	r := start(t, shim.Config{
		Argv:    []string{"sh", "-c", "ulimit -n; ulimit -Hn"},
		Env:     []string{testPath},
		Hold:    true,
		Rlimits: []shim.Rlimit{{Resource: unix.RLIMIT_NOFILE, Cur: 100, Max: 200}},
	}, nil)
	if report, code := r.finish(t); report != nil || code != 0 {
		t.Fatalf("report %+v, exit %d", report, code)
	}
	if got := r.stdout.String(); got != "100\n200\n" {
		t.Errorf("ulimit -n, -Hn = %q, want %q", got, "100\n200\n")
	}
}

func TestCreds(t *testing.T) {
	needRoot(t)
	// The shim changes the credentials of the thread that execs only: the
	// command must still have every id (real, effective, saved and
	// filesystem) and only the groups asked for, as the kernel shows them.
	r := start(t, shim.Config{
		Argv: []string{"sh", "-c", "id -u; id -g; id -G; grep -E '^(Uid|Gid|Groups):' /proc/$$/status"}, Env: []string{testPath}, Hold: true,
		SetCreds: true, UID: 65534, GID: 65534, Groups: []uint32{65534},
	}, nil)
	if report, code := r.finish(t); report != nil || code != 0 {
		t.Fatalf("report %+v, exit %d, stderr %q", report, code, r.stderr.String())
	}
	want := "65534\n65534\n65534\n" +
		"Uid:\t65534\t65534\t65534\t65534\n" +
		"Gid:\t65534\t65534\t65534\t65534\n" +
		"Groups:\t65534 \n"
	if got := r.stdout.String(); got != want {
		t.Errorf("id -u, -g, -G and /proc status = %q, want %q", got, want)
	}
}

func TestEnterDirAsRoot(t *testing.T) {
	needRoot(t)
	// A workspace under a directory only root may traverse, as the daemon's
	// state directory is.
	private := filepath.Join(t.TempDir(), "private")
	work := filepath.Join(private, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(work, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		asRoot    bool
		wantOut   string
		wantErrno string
	}{
		{"entered as root, then dropped", true, work + "\n", ""},
		{"entered as the user", false, "", "EACCES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := start(t, shim.Config{
				Argv: []string{"sh", "-c", "pwd -P; id -u >/dev/null"}, Env: []string{testPath}, Dir: work, Hold: true,
				SetCreds: true, UID: 65534, GID: 65534, EnterDirAsRoot: tt.asRoot,
			}, nil)
			report, code := r.finish(t)
			if tt.wantErrno != "" {
				if report == nil || report.Op != "chdir" || report.Errno != tt.wantErrno || code != shim.ExitCannotExec {
					t.Errorf("report %+v, exit %d; want chdir %s, exit %d", report, code, tt.wantErrno, shim.ExitCannotExec)
				}
				return
			}
			if report != nil || code != 0 || r.stdout.String() != tt.wantOut {
				t.Errorf("report %+v, exit %d, stdout %q; want none, 0, %q", report, code, r.stdout.String(), tt.wantOut)
			}
		})
	}
}

func TestNoNewPrivs(t *testing.T) {
	for _, nnp := range []bool{false, true} {
		r := start(t, shim.Config{
			Argv: []string{"grep", "^NoNewPrivs:", "/proc/self/status"}, Env: []string{testPath}, Hold: true,
			NoNewPrivs: nnp,
		}, nil)
		if report, code := r.finish(t); report != nil || code != 0 {
			t.Fatalf("report %+v, exit %d", report, code)
		}
		want := "NoNewPrivs:\t0\n"
		if nnp {
			want = "NoNewPrivs:\t1\n"
		}
		if got := r.stdout.String(); got != want {
			t.Errorf("NoNewPrivs=%v: status line %q, want %q", nnp, got, want)
		}
	}
}

func TestLoopbackUp(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Skip(t, "ip(8) not installed")
	}
	for _, up := range []bool{false, true} {
		r := start(t, shim.Config{
			Argv: []string{"ip", "-o", "link", "show", "lo"}, Env: []string{testPath}, Hold: true,
			LoopbackUp: up,
		}, func(c *exec.Cmd) {
			c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		})
		if report, code := r.finish(t); report != nil || code != 0 {
			t.Fatalf("report %+v, exit %d, stderr %q", report, code, r.stderr.String())
		}
		out := r.stdout.String()
		flags := out[strings.Index(out, "<")+1 : strings.Index(out, ">")]
		if got := slices.Contains(strings.Split(flags, ","), "UP"); got != up {
			t.Errorf("LoopbackUp=%v: lo flags <%s>, UP = %v", up, flags, got)
		}
	}
}

func TestWrapRejects(t *testing.T) {
	tests := []struct {
		name string
		cmd  *exec.Cmd
		cfg  shim.Config
	}{
		{"empty argv", exec.Command("true"), shim.Config{}},
		{"extra files", &exec.Cmd{ExtraFiles: []*os.File{os.Stdin}}, shim.Config{Argv: []string{"true"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if h, err := shim.Wrap(tt.cmd, tt.cfg); err == nil {
				h.Close()
				t.Error("Wrap succeeded, want an error")
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// pinChildEnv makes the test binary run pinChild instead of the tests.
const pinChildEnv = "CORRAL_SHIM_PIN_CHILD"

// pinChild is a fresh process that, like a daemon that has opened little
// yet, opens its shim binary at a low fd, pins it with UseBinary and runs
// a command through it. It prints the fd the file was opened at and exits
// 0 when the command ran.
func pinChild() int {
	exe, err := os.Executable()
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	f, err := os.Open(exe)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	os.Stdout.WriteString(strconv.Itoa(int(f.Fd())) + "\n")
	err = shim.UseBinary(f, nil)
	f.Close()
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	if err := runPinned(nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// runPinned runs true through the pinned shim, held as under systemd:
// three ExtraFiles, onto fds 3, 4 and 5. stdout, if not nil, is the
// command's stdout.
func runPinned(stdout *os.File) error {
	cmd := &exec.Cmd{Stdout: stdout}
	// Held, as under systemd: three ExtraFiles, onto fds 3, 4 and 5.
	h, err := shim.Wrap(cmd, shim.Config{Argv: []string{"true"}, Env: []string{testPath}, Hold: true})
	if err != nil {
		return err
	}
	defer h.Close()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	h.CloseChildEnds()
	rerr := h.Release()
	rep, err := h.WaitExec(10 * time.Second)
	werr := cmd.Wait()
	if rep != nil || err != nil || werr != nil || rerr != nil {
		return fmt.Errorf("%s: release %v, report %+v, WaitExec %v, Wait %v", cmd.Path, rerr, rep, err, werr)
	}
	return nil
}

// pinStolenChild pins its shim, then does what a double close elsewhere
// in a daemon does to it: closes the pinned number and lets a pipe take
// it. A command must still run through the shim, and the loss must be
// reported naming what the number is now. It prints the reports.
func pinStolenChild() int {
	exe, err := os.Executable()
	if err == nil {
		var f *os.File
		if f, err = os.Open(exe); err == nil {
			err = shim.UseBinary(f, func(err error) { fmt.Println("lost:", err) })
			f.Close()
		}
	}
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	fd := pinnedFD(exe)
	if fd < 0 {
		os.Stderr.WriteString("no pinned fd\n")
		return 1
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	// The stray close, and the number reused: atomically, as dup3 does.
	if err := unix.Dup3(p[0], fd, unix.O_CLOEXEC); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	if err := runPinned(nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	if err := runPinned(nil); err != nil { // and again, from the new pin
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// pinBelowChild pins its shim, then starts a command whose stdout is the
// fd numbered just below the pinned one: what a daemon with that many fds
// open hands a child (its newest pipe). It prints the pinned fd.
func pinBelowChild() int {
	exe, err := os.Executable()
	if err == nil {
		var f *os.File
		if f, err = os.Open(exe); err == nil {
			err = shim.UseBinary(f, nil)
			f.Close()
		}
	}
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	pinned := pinnedFD(exe)
	os.Stdout.WriteString(strconv.Itoa(pinned) + "\n")
	below := pinned - 1
	if pinned < 0 || !fdFree(below) {
		os.Stderr.WriteString(fmt.Sprintf("cannot set up: pinned fd %d, fd below it in use or none\n", pinned))
		return 1
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	if err := unix.Dup3(p[1], below, unix.O_CLOEXEC); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	unix.Close(p[1])
	out := os.NewFile(uintptr(below), "stdout")
	defer out.Close()
	defer unix.Close(p[0])
	if err := runPinned(out); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// pinnedFD is the fd >= 3 of this process that is exe: the pin.
func pinnedFD(exe string) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == exe && fd >= 3 {
			return fd
		}
	}
	return -1
}

func fdFree(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == unix.EBADF
}

// TestPinnedShimRunsWhenAChildFdIsJustBelowIt: the bug behind CI's
// intermittent "fork/exec /proc/self/fd/100: permission denied". In the
// child, between fork and exec, the Go runtime parks its exec-error pipe
// (and any fd it must move) just above the highest fd the child is given.
// When a daemon has about 100 fds open, the child's stdout or a shim pipe
// is fd 99 and the pipe lands on fd 100: exec of /proc/self/fd/100 then
// opens a pipe and fails with EACCES, while fd 100 is still corral-shim in
// the daemon. The shim must run whatever numbers the child's fds have.
func TestPinnedShimRunsWhenAChildFdIsJustBelowIt(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{pinChildEnv + "=below", testPath}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("a command through a shim pinned at fd %s, its stdout the fd below: %v: %s", strings.TrimSpace(string(out)), err, stderr.String())
	}
}

// TestPinnedShimStolenIsReportedAndRepinned: when something closes the
// pinned shim's descriptor and the number is reused (a pipe here), the
// next start does not fail with EACCES from exec /proc/self/fd/N: the loss
// is reported once, naming what the number is now, and the shim is pinned
// again from its path.
func TestPinnedShimStolenIsReportedAndRepinned(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{pinChildEnv + "=stolen", testPath}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("a command through a shim whose pinned fd was stolen: %v: %s%s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "is now pipe:[") || !strings.Contains(lines[0], "pinned again at fd") {
		t.Errorf("reports %q; want one, naming the pipe and the new pin", lines)
	}
}

// TestUseBinaryPinsAboveRearrangedFDs: a shim binary opened at a low fd
// (where a daemon that has opened little puts it) still starts children.
// In the child, os/exec moves ExtraFiles onto fds 3, 4 and 5 before the
// exec reads /proc/self/fd/<n>, so a pin among them would exec the wrong
// file (found when corrald inside a fresh systemd opened corral-shim at
// fd 5: "fork/exec /proc/self/fd/5: permission denied").
func TestUseBinaryPinsAboveRearrangedFDs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{pinChildEnv + "=1", testPath}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("a command through a shim pinned from fd %s: %v: %s", strings.TrimSpace(string(out)), err, stderr.String())
	}
	if fd, _ := strconv.Atoi(strings.TrimSpace(string(out))); fd > 5 {
		t.Logf("the child opened its shim at fd %d, above the fds os/exec rearranges: this run did not test the low case", fd)
	}
}
