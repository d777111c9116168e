package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	if _, err := parseConfig([]string{"--config", "/nonexistent/corrald.conf"}); err == nil {
		t.Error("a missing explicit config file is not an error")
	}
}
