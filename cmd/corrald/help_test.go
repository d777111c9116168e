package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli/clitest"
)

// TestHelpIsGNUStyle: corrald --help lists every flag as --name, GNU style.
func TestHelpIsGNUStyle(t *testing.T) {
	fs := newFlagSet(&config{}, io.Discard)
	var b strings.Builder
	printHelp(&b, fs)
	if !strings.HasPrefix(b.String(), "Usage: corrald [OPTION]...\n") {
		t.Errorf("help starts %.40q", b.String())
	}
	for _, p := range clitest.CheckHelp(b.String(), fs) {
		t.Error(p)
	}
	if strings.Contains(b.String(), "man-page") {
		t.Error("help lists the hidden --man-page")
	}
}

// TestManPage: corrald(8) renders without groff warnings and documents
// every flag.
func TestManPage(t *testing.T) {
	fs := newFlagSet(&config{}, io.Discard)
	var b strings.Builder
	writeManPage(&b, fs)
	if !strings.HasPrefix(b.String(), ".TH CORRALD 8 ") {
		t.Fatalf("man page starts %.40q", b.String())
	}
	text, warnings, err := clitest.CheckMan(b.String())
	if err != nil || warnings != "" {
		t.Fatalf("groff: %v\n%s", err, warnings)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && !strings.Contains(text, "--"+f.Name) {
			t.Errorf("corrald(8) lacks --%s", f.Name)
		}
	})
}

// TestFlagForms: --name value, --name=value and, for command lines written
// for Go's flag package, -name value all set a flag; an unknown one is an
// error.
func TestFlagForms(t *testing.T) {
	c, err := parseConfig([]string{"--config=/dev/null", "--state-dir", "/a", "-socket", "/b.sock", "-retention=2h", "--socket-mode", "0600"})
	if err != nil {
		t.Fatalf("parseConfig = %v", err)
	}
	if c.stateDir != "/a" || c.socket != "/b.sock" || c.retention.String() != "2h0m0s" || c.socketMode != 0o600 {
		t.Errorf("state-dir %q socket %q retention %v socket-mode %o", c.stateDir, c.socket, c.retention, c.socketMode)
	}
	for _, args := range [][]string{{"--bogus"}, {"--socket-mode", "999"}, {"stray"}} {
		if _, err := parseConfig(append([]string{"--config=/dev/null"}, args...)); err == nil {
			t.Errorf("parseConfig(%q) = nil error", args)
		}
	}
}
