// Package testd runs real corrald daemons for corral's integration-style
// test packages (tests/integration, tests/security, tests/durability,
// bench): it builds the binaries once per test binary, starts a daemon on a
// test's own socket, state directory and cgroup base, waits until the socket
// accepts, shows the tail of the daemon's log when the test fails, stops the
// daemon (SIGTERM, then SIGKILL) and checks that nothing is left behind:
// no daemon still running, no cgroup (tests/testenv checks the fds and
// goroutines of the test process). DialLoop counts the connections a
// daemon refuses while it hands its socket over (also used by
// tests/survival, whose daemon is systemd's).
//
// Typical use:
//
//	var bin string
//
//	func TestMain(m *testing.M) {
//		dir, err := testd.Build("corral-x-bin-", "corrald")
//		... // report err and exit 1
//		bin = filepath.Join(dir, "corrald")
//		code := m.Run()
//		os.RemoveAll(dir)
//		os.Exit(code)
//	}
//
//	func TestSomething(t *testing.T) {
//		dir := t.TempDir()
//		d := testd.Start(t, testd.Config{Corrald: bin, Dir: dir,
//			CgroupBase: testd.CgroupBase(t, testd.Cgroup2Mount(), "corral-x"),
//			Args: []string{"--scope", "cgroup"}})
//		c, err := ipc.Dial(d.Socket)
//		...
//	}
//
// Everything here runs on the test goroutine that calls it unless a doc
// comment says otherwise; cleanups are registered with t.Cleanup and run
// last-registered first, so a cgroup base made before a daemon starts
// outlives that daemon.
package testd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Module is the import path of corral's module; commands are built from
// Module + "/cmd/" + name.
const Module = "github.com/corral-dev/corral"

// Build builds the named corral commands ("corrald", "corralctl") cgo-free
// and with -trimpath, as `make build` does, into a new temporary directory whose name starts
// with prefix, and returns that directory. The directory is mode 0755 so
// that tests may run the binaries as unprivileged users. Call it once per
// test binary (from TestMain); the caller removes the directory with
// os.RemoveAll after the tests. On error nothing is left behind.
func Build(prefix string, cmds ...string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("build corral binaries: %w", err)
	}
	// MkdirTemp makes the directory 0700; unprivileged test users must be
	// able to reach the binaries.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build corral binaries: %w", err)
	}
	for _, name := range cmds {
		cmd := exec.Command(GoTool(), "build", "-trimpath", "-o", filepath.Join(dir, name), Module+"/cmd/"+name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("build %s: %w\n%s", name, err, out)
		}
	}
	return dir, nil
}

// GoTool is the go command on PATH. go test puts the toolchain that runs the
// test first on PATH, so this is the go that built the test binary.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// Tail returns the last n bytes of s, marked with a leading "..." when it
// cut anything.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
