package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/tests/testenv"
)

func TestOpenShimRefusesWhatRootShouldNotRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	good := write("good", 0o755)
	tests := []struct {
		name, path, want string
		rootOnly         bool
	}{
		{"relative", "corral-shim", "absolute", false},
		{"missing", filepath.Join(dir, "missing"), "no such file", false},
		{"directory", dir, "not a regular file", false},
		{"not executable", write("noexec", 0o644), "not executable", false},
		{"group-writable", write("gw", 0o775), "writable by group or others", true},
		{"world-writable", write("ww", 0o757), "writable by group or others", true},
	}
	if os.Geteuid() == 0 {
		other := write("other", 0o755)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		tests = append(tests, struct {
			name, path, want string
			rootOnly         bool
		}{"owned by another user", other, "not root", true})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.rootOnly && os.Geteuid() != 0 {
				testenv.Skip(t, "ownership checks apply to a root daemon")
			}
			f, err := openShim(tt.path)
			if err == nil {
				f.Close()
				t.Fatalf("openShim(%s) accepted it", tt.path)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("openShim(%s) = %v, want it to say %q", tt.path, err, tt.want)
			}
		})
	}
	f, err := openShim(good)
	if err != nil {
		t.Fatalf("openShim(%s) = %v", good, err)
	}
	f.Close()
}

func TestPinShimChoices(t *testing.T) {
	log := zerolog.Nop()
	if what, err := pinShim("self", log); what != "self" || err != nil {
		t.Errorf(`pinShim("self") = %q, %v; want "self"`, what, err)
	}
	// Nothing named corral-shim next to the test binary: corrald itself.
	exe, _ := os.Executable()
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), shimName)); !errors.Is(err, os.ErrNotExist) {
		testenv.Skipf(t, "%s exists next to the test binary", shimName)
	}
	if what, err := pinShim("", log); what != "self" || err != nil {
		t.Errorf(`pinShim("") without corral-shim = %q, %v; want "self"`, what, err)
	}
	// An explicit --shim that cannot be used is an error, not a fallback.
	missing := filepath.Join(t.TempDir(), shimName)
	if _, err := pinShim(missing, log); err == nil || !strings.Contains(err.Error(), "--shim") {
		t.Errorf("pinShim(%s) = %v, want an error naming --shim", missing, err)
	}
}
