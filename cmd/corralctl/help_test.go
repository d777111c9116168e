package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli/clitest"
)

// TestHelpIsGNUStyle: `corralctl --help` and `corralctl COMMAND --help`
// print GNU-style help on stdout and exit 0, listing every flag the
// command accepts as --name.
func TestHelpIsGNUStyle(t *testing.T) {
	g, _ := globalFlagSet(&env{stderr: &strings.Builder{}}, &globalFlags{})
	r := corralctl(t, "/nonexistent.sock", "", nil, "--help")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("corralctl --help = exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
	}
	for _, p := range clitest.CheckHelp(r.stdout, g) {
		t.Errorf("corralctl --help: %s", p)
	}
	for _, name := range commandNames() {
		if !strings.Contains(r.stdout, "\n  "+commands[name].usage+"\n") {
			t.Errorf("corralctl --help does not list %q", commands[name].usage)
		}
		t.Run(name, func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				r := corralctl(t, "/nonexistent.sock", "", nil, name, h)
				if r.code != 0 || r.stderr != "" {
					t.Fatalf("corralctl %s %s = exit %d, stderr %q; want 0 and nothing", name, h, r.code, r.stderr)
				}
				if !strings.HasPrefix(r.stdout, "Usage: corralctl "+commands[name].usage+"\n") {
					t.Errorf("corralctl %s %s starts %.60q", name, h, r.stdout)
				}
				for _, p := range clitest.CheckHelp(r.stdout, commandFlags(name)) {
					t.Errorf("corralctl %s %s: %s", name, h, p)
				}
			}
		})
	}
	if fs := commandFlags("run"); fs.Lookup("timeout") == nil || fs.ShorthandLookup("i") == nil {
		t.Errorf("commandFlags(run) lacks --timeout or -i: the flag sets are not the commands' own")
	}
}

// TestFlagsAreGNU: long flags take one or two dashes' worth of GNU forms
// (--name value, --name=value), short ones combine, and a single-dash long
// flag is an error that points at --help.
func TestFlagsAreGNU(t *testing.T) {
	r := corralctl(t, "/nonexistent.sock", "", nil, "ps", "-state", "running")
	if r.code != exitUsage || !strings.Contains(r.stderr, "Try 'corralctl ps --help'") {
		t.Errorf("ps -state running = exit %d, stderr %q; want %d and a pointer to --help", r.code, r.stderr, exitUsage)
	}
	r = corralctl(t, "/nonexistent.sock", "", nil, "--socket=/nonexistent.sock", "ps", "--limit=3")
	if r.code != exitErrorGeneric || !strings.Contains(r.stderr, "/nonexistent.sock") {
		t.Errorf("--socket=PATH ps --limit=3 = exit %d, stderr %q; want a dial error on that socket", r.code, r.stderr)
	}
}

// TestFlagValueErrorsPointAtHelp: a flag value corralctl refuses itself
// (a negative --tasks, an unknown --network or --state) is reported as the
// other flag errors are, naming the flag, what it takes and --help, before
// anything is sent to corrald.
func TestFlagValueErrorsPointAtHelp(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--tasks", "-3", "--", "true"}, exitFailure, `corralctl run: invalid argument "-3" for "--tasks" flag: negative`},
		{[]string{"run", "--tasks=lots", "--", "true"}, exitFailure, `corralctl run: invalid argument "lots" for "--tasks" flag: must be an integer`},
		{[]string{"run", "--network", "bogus", "--", "true"}, exitFailure, `corralctl run: invalid argument "bogus" for "--network" flag: want host or none`},
		{[]string{"ps", "--state", "bogus"}, exitUsage, `corralctl ps: invalid argument "bogus" for "--state" flag: want started, running, canceling, exited or cleaned`},
	}
	for _, tt := range tests {
		r := corralctl(t, "/nonexistent.sock", "", nil, tt.args...)
		hint := "\nTry 'corralctl " + tt.args[0] + " --help' for more information.\n"
		if r.code != tt.code || r.stderr != tt.want+hint {
			t.Errorf("corralctl %s = exit %d, stderr %q; want %d and %q", strings.Join(tt.args, " "), r.code, r.stderr, tt.code, tt.want+hint)
		}
	}
}

func writeCompletion(t *testing.T, shell string) string {
	t.Helper()
	r := corralctl(t, "/nonexistent.sock", "", nil, "completion", shell)
	if r.code != 0 || r.stderr != "" || r.stdout == "" {
		t.Fatalf("completion %s = exit %d, stderr %q, %d bytes", shell, r.code, r.stderr, len(r.stdout))
	}
	f := filepath.Join(t.TempDir(), "corralctl."+shell)
	if err := os.WriteFile(f, []byte(r.stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestCompletionBash: the script parses (bash -n), registers itself
// (complete -p) and completes commands, flags, flag values and the
// command run runs.
func TestCompletionBash(t *testing.T) {
	f := writeCompletion(t, "bash")
	if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	out, err := exec.Command("bash", "-c", `source "$1" && complete -p corralctl`, "bash", f).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "complete -F _corralctl corralctl" {
		t.Fatalf("complete -p corralctl = %q, %v; want \"complete -F _corralctl corralctl\"", out, err)
	}
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "subdir"), 0o755)
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	for _, tt := range []struct {
		words string // the words on the line; the last one is being completed
		want  []string
		not   []string
	}{
		{"corralctl ''", []string{"run", "ps", "logs", "completion"}, nil},
		{"corralctl lo", []string{"logs"}, []string{"run"}},
		{"corralctl --", []string{"--socket", "--json", "--help"}, []string{"--timeout"}},
		{"corralctl --socket /x l", []string{"logs"}, nil},
		{"corralctl logs --f", []string{"--follow"}, nil},
		{"corralctl run --ti", []string{"--timeout"}, nil},
		{"corralctl ps --state r", []string{"running"}, []string{"exited"}},
		{"corralctl run --network ''", []string{"host", "none"}, nil},
		{"corralctl run --cwd " + dir + "/", []string{dir + "/subdir"}, []string{dir + "/file"}},
		{"corralctl run --timeout 5s -- ech", []string{"echo"}, nil},
		{"corralctl run --timeout 5s ech", []string{"echo"}, nil},
		{"corralctl run -- ls " + dir + "/fi", []string{dir + "/file"}, nil},
		{"corralctl completion ''", []string{"bash", "zsh", "fish"}, nil},
	} {
		script := `source "$1"; COMP_WORDS=(` + tt.words + `); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _corralctl; printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command("bash", "-c", script, "bash", f).CombinedOutput()
		if err != nil {
			t.Errorf("complete %q: %v\n%s", tt.words, err, out)
			continue
		}
		got := map[string]bool{}
		for _, w := range strings.Fields(string(out)) {
			got[w] = true
		}
		for _, w := range tt.want {
			if !got[w] {
				t.Errorf("complete %q = %q, want it to offer %q", tt.words, strings.Fields(string(out)), w)
			}
		}
		for _, w := range tt.not {
			if got[w] {
				t.Errorf("complete %q = %q, want it not to offer %q", tt.words, strings.Fields(string(out)), w)
			}
		}
	}
}

// TestCompletionZshFish: the zsh and fish scripts parse in their shells,
// and fish offers the commands and a command's flags.
func TestCompletionZshFish(t *testing.T) {
	for _, sh := range []string{"zsh", "fish"} {
		if _, err := exec.LookPath(sh); err != nil {
			t.Fatalf("%s is not installed (.ci/run installs it): %v", sh, err)
		}
	}
	z := writeCompletion(t, "zsh")
	if out, err := exec.Command("zsh", "-n", z).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
	// Loaded after compinit, it registers itself for corralctl.
	out, err := exec.Command("zsh", "-fc", `autoload -U compinit && compinit -u -D && source "$1" && print -r -- ${_comps[corralctl]}`, "zsh", z).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "_corralctl" {
		t.Errorf("zsh: _comps[corralctl] = %q, %v; want _corralctl", out, err)
	}
	fi := writeCompletion(t, "fish")
	if out, err := exec.Command("fish", "--no-execute", fi).CombinedOutput(); err != nil {
		t.Errorf("fish --no-execute: %v\n%s", err, out)
	}
	for _, tt := range []struct{ line, want string }{
		{"corralctl lo", "logs"},
		{"corralctl logs --fo", "--follow"},
		{"corralctl ps --state=", "--state=running"},
	} {
		out, err := exec.Command("fish", "--no-config", "-c", "source $argv[1]; complete -C $argv[2]", fi, tt.line).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("fish complete -C %q = %q, %v; want %q offered", tt.line, out, err, tt.want)
		}
	}
}

// TestManPage: corralctl(1) renders without groff warnings and documents
// every command and every flag.
func TestManPage(t *testing.T) {
	r := corralctl(t, "/nonexistent.sock", "", nil, manCommand)
	if r.code != 0 || !strings.HasPrefix(r.stdout, ".TH CORRALCTL 1 ") {
		t.Fatalf("corralctl %s = exit %d, starts %.40q", manCommand, r.code, r.stdout)
	}
	text, warnings, err := clitest.CheckMan(r.stdout)
	if err != nil || warnings != "" {
		t.Fatalf("groff: %v\n%s", err, warnings)
	}
	for _, name := range commandNames() {
		if !strings.Contains(text, commands[name].usage) {
			t.Errorf("man page lacks %q", commands[name].usage)
		}
		commandFlags(name).VisitAll(func(f *pflag.Flag) {
			if !f.Hidden && !strings.Contains(text, "--"+f.Name) {
				t.Errorf("man page lacks %s's --%s", name, f.Name)
			}
		})
	}
}
