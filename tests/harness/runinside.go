package harness

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/testenv"
)

// RunInside is for TestMain of integration test packages:
//
//	func TestMain(m *testing.M) { os.Exit(harness.RunInside(m)) }
//
// Outside (EnvInside unset) it boots a harness systemd, re-runs this test
// binary with the same arguments inside it (stdout and stderr passed
// through, EnvInside=1 and EnvUnitDir set), closes the systemd and returns
// the inner exit code. Inside it returns testenv.Main(m): the tests, then
// the fd and goroutine leak check. When no systemd can be
// booted here (not root, systemd missing) it logs why and runs the tests
// outside with EnvUnavailable set, so that Require skips them. A boot that
// fails where it should work is a failure (exit code 1), not a skip.
//
// RunInside must be called from the main goroutine of the test binary.
func RunInside(m *testing.M) int {
	if os.Getenv(EnvInside) != "" {
		return testenv.Main(m)
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Str("component", "harness").Logger()
	if reason := Unavailable(); reason != "" {
		log.Warn().Str("reason", reason).Msg("no harness systemd; integration tests will skip")
		os.Setenv(EnvUnavailable, reason)
		return testenv.Main(m)
	}
	sd, err := Boot(Options{})
	if err != nil {
		log.Error().Err(err).Msg("boot harness systemd")
		return 1
	}
	code, err := runSelfInside(sd)
	if cerr := sd.Close(); cerr != nil {
		log.Error().Err(cerr).Msg("close harness systemd")
		if code == 0 {
			code = 1
		}
	}
	if err != nil {
		log.Error().Err(err).Msg("run tests inside harness systemd")
		return 1
	}
	return code
}

func runSelfInside(sd *Systemd) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 1, err
	}
	args := make([]string, 0, len(os.Args)-1)
	for _, a := range os.Args[1:] {
		args = append(args, insidePathArg(a))
	}
	cmd := sd.Command(context.Background(), InsidePath(exe), args...)
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "GOCOVERDIR" {
			kv = k + "=" + InsidePath(v)
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, EnvInside+"=1", EnvUnitDir+"="+InsideUnitDir)
	cmd.Stdin = nil
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, err
	}
	return 0, nil
}

// InsidePath maps a host path under /tmp or /var/tmp (hidden inside by
// fresh tmpfs mounts) to where the host's directory is visible inside.
// Other paths are returned unchanged.
func InsidePath(p string) string {
	for _, m := range []struct{ host, inside string }{
		{"/tmp", InsideHostTmp},
		{"/var/tmp", InsideHostVarTmp},
	} {
		if p == m.host || strings.HasPrefix(p, m.host+"/") {
			return m.inside + strings.TrimPrefix(p, m.host)
		}
	}
	return p
}

// insidePathArg maps the value of a "-flag=/tmp/..." argument (go test's
// -test.testlogfile, -test.coverprofile, -test.outputdir...).
func insidePathArg(a string) string {
	if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") {
		return k + "=" + InsidePath(v)
	}
	return a
}

// Inside reports whether this process runs inside a harness systemd
// (started by RunInside).
func Inside() bool { return os.Getenv(EnvInside) != "" }

// Require skips t unless it runs inside a harness systemd (RunInside),
// giving the reason the harness was unavailable where known.
func Require(t testing.TB) {
	t.Helper()
	if Inside() {
		return
	}
	if reason := os.Getenv(EnvUnavailable); reason != "" {
		testenv.Skipf(t, "needs the systemd test harness: %s", reason)
	}
	testenv.Skip(t, "needs the systemd test harness: run the package's TestMain with harness.RunInside")
}

// SkipUnlessBootable skips t when Boot cannot work here (not root, systemd
// missing), for tests that call Boot themselves.
func SkipUnlessBootable(t testing.TB) {
	t.Helper()
	if reason := Unavailable(); reason != "" {
		testenv.Skipf(t, "cannot boot a harness systemd: %s", reason)
	}
	if Inside() {
		testenv.Skip(t, "already inside a harness systemd; not nesting another")
	}
}
