// Package clitest checks help text and man pages made by package cli, for
// the tests of corrald and corralctl.
package clitest

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
)

// optionLine is a GNU-style option line: "  -f, --follow" or
// "      --socket=PATH", then the text after two spaces or on the next line.
var optionLine = regexp.MustCompile(`^(  -[A-Za-z0-9], |      )--([a-z][a-z0-9-]*)(=[A-Z][A-Z0-9_=]*)?(  |$)`)

// singleDashLong is a Go flag-package style line: "  -state-dir string".
var singleDashLong = regexp.MustCompile(`^\s+-[a-z][a-z-]+\b`)

// CheckHelp returns what is wrong with help as GNU-style help for fs: it
// must start with "Usage: " and have an "Options:" section in which every
// visible flag of fs appears once as --name (with its shorthand, if any),
// and no option is written Go-style with one dash.
func CheckHelp(help string, fs *pflag.FlagSet) []string {
	var problems []string
	if !strings.HasPrefix(help, "Usage: ") {
		problems = append(problems, fmt.Sprintf("help does not start with \"Usage: \": %.40q", help))
	}
	_, opts, ok := strings.Cut(help, "\nOptions:\n")
	if !ok {
		return append(problems, "no \"Options:\" section")
	}
	seen := map[string]int{}
	for _, l := range strings.Split(opts, "\n") {
		if l == "" {
			break // the end of the section
		}
		if singleDashLong.MatchString(l) {
			problems = append(problems, fmt.Sprintf("single-dash long option: %q", l))
			continue
		}
		if !strings.HasPrefix(strings.TrimLeft(l, " "), "-") {
			continue // a continuation line
		}
		m := optionLine.FindStringSubmatch(l)
		if m == nil {
			problems = append(problems, fmt.Sprintf("not a GNU-style option line: %q", l))
			continue
		}
		seen[m[2]]++
		if f := fs.Lookup(m[2]); f == nil {
			problems = append(problems, fmt.Sprintf("help lists --%s, which the program does not define", m[2]))
		} else if f.Shorthand != "" && !strings.HasPrefix(l, "  -"+f.Shorthand+", ") {
			problems = append(problems, fmt.Sprintf("--%s: shorthand -%s not shown: %q", m[2], f.Shorthand, l))
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && seen[f.Name] != 1 {
			problems = append(problems, fmt.Sprintf("--%s listed %d times, want once", f.Name, seen[f.Name]))
		}
	})
	return problems
}

// CheckMan renders a man page with groff, which warns about malformed
// roff, and returns the rendered text and the warnings.
func CheckMan(page string) (string, string, error) {
	cmd := exec.Command("groff", "-man", "-Tutf8", "-ww", "-rLL=80n", "-P", "-cbou")
	cmd.Stdin = strings.NewReader(page)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", errb.String(), fmt.Errorf("groff: %w", err)
	}
	return out.String(), errb.String(), nil
}
