package harness

// corral's own daemon inside the harness systemd, run by deploy/'s units as
// on a host: for the packages that test corrald as a service
// (tests/systemd, tests/survival, tests/drill/systemd).
//
//	func TestMain(m *testing.M) {
//		os.Exit(harness.RunInsideWithBinaries(m, "corrald", "corral-shim"))
//	}
//
//	func TestService(t *testing.T) {
//		harness.Require(t)
//		harness.Corrald{StateDir: "/run/corral-state"}.Install(t, "corrald.socket")
//		...
//	}

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/testd"
)

// EnvBinDir names the host directory of the corral commands that
// RunInsideWithBinaries built; Binary finds them inside.
const EnvBinDir = "CORRAL_HARNESS_BINDIR"

// RunInsideWithBinaries is RunInside for a package whose tests run corral's
// commands under the harness systemd. Outside, where a systemd can be
// booted, it first builds the named commands (cmd/<name>, as make build
// does: testd.Build) into a new temporary directory, names it in EnvBinDir
// for the run inside, and removes it once that run ended. Inside, and where
// no systemd can be booted (the tests skip), it is RunInside. Call it from
// TestMain's goroutine.
func RunInsideWithBinaries(m *testing.M, cmds ...string) int {
	if Inside() || Unavailable() != "" {
		return RunInside(m)
	}
	dir, err := testd.Build("corral-harness-bin-", cmds...)
	if err != nil {
		log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Str("component", "harness").Logger()
		log.Error().Err(err).Msg("build the commands to run inside the harness systemd")
		return 1
	}
	defer os.RemoveAll(dir)
	os.Setenv(EnvBinDir, dir)
	return RunInside(m)
}

// Binary is where the named command that RunInsideWithBinaries built is
// seen from inside the harness systemd.
func Binary(name string) string {
	return filepath.Join(InsidePath(os.Getenv(EnvBinDir)), name)
}

// Corrald is corrald as deploy/corrald.service runs it, with ExecStart
// pointed at the binary under test.
type Corrald struct {
	Binary         string   // the corrald to run; default Binary("corrald")
	StateDir       string   // --state-dir: made (0700) and writable by the service (ReadWritePaths)
	Args           []string // more flags, after --state-dir
	ReadWritePaths []string // more paths the service may write
}

func (c Corrald) binary() string {
	if c.Binary != "" {
		return c.Binary
	}
	return Binary("corrald")
}

// WriteDropIn points corrald.service at c: the drop-in
// corrald.service.d/test.conf in the harness's unit directory. A
// systemctl daemon-reload makes it count.
func (c Corrald) WriteDropIn(t testing.TB) {
	t.Helper()
	dropin := filepath.Join(os.Getenv(EnvUnitDir), "corrald.service.d")
	if err := os.MkdirAll(dropin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmdline := strings.Join(append([]string{c.binary(), "--state-dir", c.StateDir}, c.Args...), " ")
	rw := strings.Join(append([]string{c.StateDir}, c.ReadWritePaths...), " ")
	override := fmt.Sprintf("[Service]\nExecStart=\nExecStart=%s\nReadWritePaths=%s\n", cmdline, rw)
	if err := os.WriteFile(filepath.Join(dropin, "test.conf"), []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
}

// corraldUnits are deploy/'s units that Install puts in place.
var corraldUnits = []string{"corrald.service", "corrald.socket", "corral.slice"}

// Install installs deploy/'s corrald.service, corrald.socket and
// corral.slice in the harness's unit directory with c's drop-in
// (WriteDropIn), gives the socket its group (corral: added to /etc/group
// inside this mount namespace only, where the host has none), makes the
// state directory, reloads systemd and starts the units in start. Inside
// the harness systemd only.
func (c Corrald) Install(t testing.TB, start ...string) {
	t.Helper()
	deploy, err := deployPath()
	if err != nil {
		t.Fatal(err)
	}
	unitDir := os.Getenv(EnvUnitDir)
	if unitDir == "" {
		t.Fatal("install corrald's units: not inside a harness systemd (" + EnvUnitDir + " unset)")
	}
	for _, u := range corraldUnits {
		b, err := os.ReadFile(filepath.Join(deploy, u))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(unitDir, u), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.WriteDropIn(t)
	if exec.Command("getent", "group", "corral").Run() != nil {
		b, err := os.ReadFile("/etc/group")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("/run/corral-harness-group", append(b, []byte("corral:x:4243:\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
		Sh(t, "mount", "--bind", "/run/corral-harness-group", "/etc/group")
	}
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	Sh(t, "systemctl", "daemon-reload")
	if len(start) > 0 {
		Sh(t, "systemctl", append([]string{"start"}, start...)...)
	}
}

// deployPath is the module's deploy/ directory, found from the working
// directory up (go test runs a package's tests in its directory).
func deployPath() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "deploy"), nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("deploy/: no go.mod above the working directory")
		}
		dir = up
	}
}

// Sh runs name with args and returns its output, trimmed; when it fails,
// t fails with the output.
func Sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}
