// Package insidetest checks harness.RunInside end to end: its tests run
// inside a harness systemd.
package insidetest

import (
	"os"
	"strings"
	"testing"

	"github.com/corral-dev/corral/tests/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.RunInside(m)) }

func TestRunsInsideSystemd(t *testing.T) {
	harness.Require(t)
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(comm)); got != "systemd" {
		t.Errorf("/proc/1/comm = %q, want systemd", got)
	}
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		t.Errorf("/run/systemd/system: %v", err)
	}
	if got := os.Getenv(harness.EnvUnitDir); got != harness.InsideUnitDir {
		t.Errorf("$%s = %q, want %q", harness.EnvUnitDir, got, harness.InsideUnitDir)
	}
	if _, err := os.Stat(harness.InsideUnitDir + "/dbus.service"); err != nil {
		t.Errorf("unit dir: %v", err)
	}
	wd, _ := os.Getwd()
	if !strings.HasSuffix(wd, "/tests/harness/insidetest") {
		t.Errorf("working directory = %q, want the package directory", wd)
	}
}
