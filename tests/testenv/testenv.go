// Package testenv is what every corral test package shares about the
// machine it runs on:
//
//   - Main, Measure and Check: the tests give back the fds and goroutines
//     they took. Every TestMain runs its tests through Main (or Measure and
//     Check around m.Run), and CheckFDs does the same for one test.
//   - Skip, Skipf and SkipSuite: the one way a test or a whole package
//     skips for want of something in the environment (root, a cgroup2
//     mount, a systemd to boot, a tool, a user). With CORRAL_STRICT=1 (CI,
//     where everything is installed) they fail instead: a skip there would
//     let a suite pass green without having run.
//   - LowerFDLimit: the process out of fds (a low soft RLIMIT_NOFILE), for
//     the tests of what corral does on EMFILE.
//   - GoroutineStacks, WaitGoroutinesSettle and GroupStacks: the goroutines
//     a test started (told apart by id, so that those ending meanwhile hide
//     none), a bounded wait for them to go, and what is left, grouped by
//     stack, for the failure message.
//
// A skip that is not about the environment (testing.Short, an opt-in such
// as CORRAL_BENCH, a fuzz input out of range) stays a plain t.Skip.
//
// The package imports nothing of corral's, so any package's tests may use
// it. Everything here runs on the calling goroutine.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// StrictEnv is the environment variable that turns environment skips into
// failures when set to "1".
const StrictEnv = "CORRAL_STRICT"

// Strict reports whether CORRAL_STRICT=1.
func Strict() bool { return os.Getenv(StrictEnv) == "1" }

// Skip skips t because the environment lacks something the test needs, or
// fails it under CORRAL_STRICT=1. args are as for t.Skip.
func Skip(t testing.TB, args ...any) {
	t.Helper()
	if Strict() {
		t.Fatal(append([]any{StrictEnv + "=1, the environment must provide this:"}, args...)...)
	} else {
		t.Skip(args...)
	}
}

// Skipf is Skip with a format.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	if Strict() {
		t.Fatalf(StrictEnv+"=1, the environment must provide this: "+format, args...)
	} else {
		t.Skipf(format, args...)
	}
}

// SkipRoot skips (or under CORRAL_STRICT=1 fails) t unless it runs as root;
// why says what needs root.
func SkipRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: "+why)
	}
}

// SkipSuite is for a TestMain that cannot run its package here: it prints
// why and returns the exit code, 0 (skipped), or 1 under CORRAL_STRICT=1.
//
//	if os.Geteuid() != 0 {
//		os.Exit(testenv.SkipSuite("integration", "needs root"))
//	}
func SkipSuite(pkg, reason string) int {
	if Strict() {
		fmt.Fprintf(os.Stderr, "%s: %s=1 and the environment cannot run these tests: %s\n", pkg, StrictEnv, reason)
		return 1
	}
	fmt.Printf("%s: skipped, %s\n", pkg, reason)
	return 0
}
