package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/scope"
)

func TestConfigFileFillsFlagsNotGiven(t *testing.T) {
	f := filepath.Join(t.TempDir(), "corrald.conf")
	conf := "# corral\nsocket = /tmp/from-file.sock\nretention = 2h\nscope = \"pgroup\"\nmax-running = 7\n"
	if err := os.WriteFile(f, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig([]string{"--config", f, "--scope", "cgroup"})
	if err != nil {
		t.Fatalf("parseConfig = %v", err)
	}
	if c.socket != "/tmp/from-file.sock" || c.retention != 2*time.Hour || c.maxRunning != 7 {
		t.Errorf("from file: socket %q retention %v max-running %d", c.socket, c.retention, c.maxRunning)
	}
	if c.scope != "cgroup" {
		t.Errorf("scope = %q: the flag must win over the file", c.scope)
	}
	if c.stateDir != "/var/lib/corral" {
		t.Errorf("state-dir = %q, want the default", c.stateDir)
	}
}

func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ name, conf, want string }{
		{"unknown setting", "sockett = x\n", `unknown setting "sockett"`},
		{"no equals", "socket /x\n", "want name = value"},
		{"bad value", "retention = soon\n", "retention"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "c.conf")
			os.WriteFile(f, []byte(tc.conf), 0o600)
			_, err := parseConfig([]string{"--config", f})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line 1") {
				t.Errorf("parseConfig = %v, want an error naming line 1 and %q", err, tc.want)
			}
		})
	}
	for _, arg := range []string{"--retention=0s", "--retention=-1h"} {
		if _, err := parseConfig([]string{"--config=/dev/null", arg}); err == nil || !strings.Contains(err.Error(), "--retention") {
			t.Errorf("parseConfig(%s) = %v, want an error naming --retention", arg, err)
		}
	}
	if _, err := parseConfig([]string{"--config", "/nonexistent/corrald.conf"}); err == nil {
		t.Error("a missing explicit config file is not an error")
	}
}

// heldBackend is a scope.Backend that only declares PlaceHeld, for poolSize.
type heldBackend struct{ scope.Backend }

func (heldBackend) Name() string               { return "held" }
func (heldBackend) Placement() scope.Placement { return scope.PlaceHeld }

func TestPoolSizeDefaults(t *testing.T) {
	for _, tt := range []struct {
		flag int
		b    scope.Backend
		want int
	}{
		{-1, heldBackend{}, 4},     // every command waits in a shim for its scope
		{-1, scope.NewPgroup(), 2}, // only non-root and network none need a shim
		{0, heldBackend{}, 0},      // an explicit size wins
		{7, scope.NewPgroup(), 7},
	} {
		if got := poolSize(tt.flag, tt.b); got != tt.want {
			t.Errorf("poolSize(%d, %s) = %d, want %d", tt.flag, tt.b.Name(), got, tt.want)
		}
	}
}
