// Package pyclient runs the Python client's unittest suite
// (clients/python/tests) against a real corrald, one subtest per Python
// test, and checks that the package installs with pip and no network.
// Needs root (it runs a cgroup-backed corrald and a client as corral-a).
package pyclient

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

const (
	testUser  = "corral-a"
	maxPerUID = 16
)

var (
	binDir     string
	cgroupRoot string
	pyDir      string // clients/python
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(testenv.SkipSuite("pyclient", "needs root (runs corrald, a client as corral-a)"))
	}
	var undo func()
	if _, err := user.Lookup(testUser); err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", testUser).CombinedOutput(); err != nil {
			fmt.Printf("pyclient: useradd %s: %v: %s\n", testUser, err, out)
			os.Exit(1)
		}
		undo = func() { _ = exec.Command("userdel", testUser).Run() }
	}
	dir, err := testd.Build("corral-py-bin-", "corrald", "corral-shim")
	if err != nil {
		fmt.Printf("pyclient: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	cgroupRoot = testd.Cgroup2Mount()
	wd, _ := os.Getwd()
	pyDir = filepath.Join(wd, "..", "..", "clients", "python")
	code := testenv.Main(m)
	os.RemoveAll(dir)
	if undo != nil {
		undo()
	}
	os.Exit(code)
}

// resultLine is unittest -v's line for one test: "test_x (mod.Class.test_x) ... ok".
var resultLine = regexp.MustCompile(`^(test\w*) \(([\w.]+?)\)(?: \.\.\. )?(.*)$`)

// TestPythonClient runs clients/python/tests with unittest against a
// corrald whose socket every user may use.
func TestPythonClient(t *testing.T) {
	if cgroupRoot == "" {
		t.Fatal("no cgroup2 hierarchy for --scope cgroup")
	}
	sockDir, err := os.MkdirTemp("", "corral-py-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := testd.Start(t, testd.Config{
		Corrald: filepath.Join(binDir, "corrald"), Dir: sockDir,
		CgroupBase: testd.CgroupBase(t, cgroupRoot, "corral-py"),
		Args: []string{"--scope", "cgroup", "--socket-mode", "0666", "--socket-group", "",
			"--max-per-uid", fmt.Sprint(maxPerUID)},
	})

	cmd := exec.Command("python3", "-m", "unittest", "-v", "test_client")
	cmd.Dir = filepath.Join(pyDir, "tests")
	cmd.Env = append(os.Environ(), "CORRAL_SOCKET="+d.Socket, fmt.Sprintf("CORRAL_TEST_MAX_PER_UID=%d", maxPerUID),
		"CORRAL_TEST_USER="+testUser, fmt.Sprintf("CORRAL_TEST_DAEMON_PID=%d", d.Pid()), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	text := string(out)
	results := map[string]string{}
	var order []string
	sc := bufio.NewScanner(strings.NewReader(text))
	pending := "" // a test whose status a warning line pushed further down
	for sc.Scan() {
		line := sc.Text()
		if m := resultLine.FindStringSubmatch(line); m != nil {
			pending = m[2]
			order = append(order, pending)
			line = m[3]
		}
		if pending == "" {
			continue
		}
		if st := strings.TrimSpace(line); st == "ok" || st == "FAIL" || st == "ERROR" || strings.HasPrefix(st, "skipped") ||
			st == "expected failure" || st == "unexpected success" {
			results[pending] = st
			pending = ""
		}
	}
	for _, name := range order {
		status := results[name]
		t.Run(name, func(t *testing.T) {
			if status != "ok" {
				// Skips count as failures: nothing may be left untested.
				t.Errorf("%s: %s\n%s", name, status, failureOf(text, name))
			}
		})
	}
	if err != nil {
		t.Errorf("python3 -m unittest: %v\n%s", err, testd.Tail(text, 8000))
	}
	if len(order) < 30 {
		t.Errorf("only %d Python tests reported:\n%s", len(order), testd.Tail(text, 4000))
	}
}

// failureOf is the traceback unittest printed for the test name.
func failureOf(out, name string) string {
	i := strings.Index(out, "("+name+")\n---")
	if i < 0 {
		return ""
	}
	rest := out[i:]
	if j := strings.Index(rest[1:], "\n======"); j >= 0 {
		rest = rest[:j+1]
	}
	return rest
}

// TestPipInstallOffline: `pip install clients/python` works with no
// package index at all (the in-tree build backend needs nothing).
func TestPipInstallOffline(t *testing.T) {
	target := t.TempDir()
	cmd := exec.Command("python3", "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
		"--target", target, pyDir)
	cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", pyDir, err, out)
	}
	check := exec.Command("python3", "-c", "import corral, corral.aio; print(corral.__version__, corral.__file__)")
	check.Dir = "/"
	check.Env = append(os.Environ(), "PYTHONPATH="+target)
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("import the installed corral: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "0.") || !strings.Contains(string(out), target) {
		t.Errorf("installed corral = %q, want a version and a path under %s", out, target)
	}
}
