// Package cli renders corrald's and corralctl's flags for people and for
// shells: GNU-style --help, man pages and completion scripts, all from the
// same pflag definitions, so that none of them can disagree with what the
// programs accept.
//
// Everything here is called from main's goroutine at start-up or by a
// generator; nothing keeps state.
package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// HelpFlag defines -h/--help on fs and returns its value. A program checks
// it after Parse and prints its help on stdout with exit status 0, as the
// GNU coding standards ask.
func HelpFlag(fs *pflag.FlagSet) *bool {
	return fs.BoolP("help", "h", false, "print this help and exit")
}

// Usage writes GNU-style help: a "Usage:" line, an optional description
// and the options, one per line as "  -f, --follow   text" or
// "      --socket=PATH   text".
func Usage(w io.Writer, synopsis, description string, fs *pflag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s\n", synopsis)
	if description != "" {
		fmt.Fprintf(w, "%s\n", strings.TrimRight(description, "\n"))
	}
	if fs != nil && fs.HasAvailableFlags() {
		fmt.Fprintf(w, "\nOptions:\n")
		WriteFlags(w, fs)
	}
}

// Help layout: the text column, and the width the text is wrapped to.
const (
	textColumn = 30
	lineWidth  = 80
)

// WriteFlags writes fs's visible flags in the layout of Usage.
func WriteFlags(w io.Writer, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		left := "      --" + f.Name
		if f.Shorthand != "" {
			left = "  -" + f.Shorthand + ", --" + f.Name
		}
		varname, usage := VarName(f)
		if varname != "" {
			left += "=" + varname
		}
		if d := defaultText(f); d != "" {
			usage += " (default " + d + ")"
		}
		lines := wrapWords(usage, lineWidth-textColumn)
		if len(left)+2 > textColumn {
			fmt.Fprintf(w, "%s\n", left)
		} else {
			fmt.Fprintf(w, "%-*s%s\n", textColumn, left, lines[0])
			lines = lines[1:]
		}
		for _, l := range lines {
			fmt.Fprintf(w, "%*s%s\n", textColumn, "", l)
		}
	})
}

// wrapWords splits s into lines of at most width bytes, breaking at spaces
// (a longer word stands alone on its line).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}

// varNameKey is the flag annotation that names a flag's value in help.
const varNameKey = "corral_varname"

// VarNames sets the placeholder help shows for the values of the named
// flags ("--store=KIND"), where the usage text has no `NAME` of its own.
func VarNames(fs *pflag.FlagSet, names map[string]string) {
	for flag, v := range names {
		if err := fs.SetAnnotation(flag, varNameKey, []string{v}); err != nil {
			panic("cli.VarNames: " + err.Error()) // a typo in a flag name
		}
	}
}

// VarName returns the placeholder of f's value and its usage text: a
// `NAME` quoted in the usage, else one set by VarNames, else one from the
// value's type (DURATION, N, SIZE...); "" for a boolean.
func VarName(f *pflag.Flag) (string, string) {
	name, usage := pflag.UnquoteUsage(f)
	if strings.Contains(f.Usage, "`") {
		return name, usage
	}
	if v := f.Annotations[varNameKey]; len(v) == 1 {
		return v[0], usage
	}
	switch name {
	case "":
		return "", usage
	case "duration":
		return "DURATION", usage
	case "int", "uint", "int32", "uint32":
		return "N", usage
	}
	return strings.ToUpper(name), usage
}

// Command is one subcommand, for man pages and completions.
type Command struct {
	Name    string
	Usage   string // "logs [-f] [--stderr] ID"
	Summary string
	Flags   *pflag.FlagSet
	// Args says what the positional arguments complete to: "" nothing,
	// "command" a program and its arguments (after --).
	Args string
}

// Section is a titled block of text in a man page; paragraphs are
// separated by blank lines, and a line starting with two spaces is kept as
// it is (an example).
type Section struct {
	Title string
	Text  string
}

// Page is a man page.
type Page struct {
	Name        string // corrald
	Section     string // 8
	Summary     string // the NAME line's text after the dash
	Synopsis    []string
	Description string
	Options     *pflag.FlagSet
	Commands    []Command
	Extra       []Section
	Version     string
}

// WriteMan writes p in man(7) roff.
func WriteMan(w io.Writer, p Page) {
	fmt.Fprintf(w, ".TH %s %s \"\" \"corral %s\" \"corral manual\"\n", strings.ToUpper(p.Name), p.Section, roff(p.Version))
	fmt.Fprintf(w, ".SH NAME\n%s \\- %s\n", p.Name, roff(p.Summary))
	fmt.Fprintf(w, ".SH SYNOPSIS\n")
	for i, s := range p.Synopsis {
		if i > 0 {
			fmt.Fprintf(w, ".br\n")
		}
		fmt.Fprintf(w, "\\fB%s\\fR %s\n", p.Name, roff(s))
	}
	if p.Description != "" {
		fmt.Fprintf(w, ".SH DESCRIPTION\n")
		writeText(w, p.Description)
	}
	if p.Options != nil && p.Options.HasAvailableFlags() {
		fmt.Fprintf(w, ".SH OPTIONS\n")
		writeFlags(w, p.Options)
	}
	if len(p.Commands) > 0 {
		fmt.Fprintf(w, ".SH COMMANDS\n")
		for _, c := range p.Commands {
			fmt.Fprintf(w, ".SS %s\n", roff(c.Usage))
			writeText(w, c.Summary)
			if c.Flags != nil {
				own := ownFlags(c.Flags, p.Options)
				if own.HasAvailableFlags() {
					writeFlags(w, own)
				}
			}
		}
	}
	for _, s := range p.Extra {
		fmt.Fprintf(w, ".SH %s\n", strings.ToUpper(s.Title))
		writeText(w, s.Text)
	}
}

// ownFlags returns the flags of fs that global does not also define.
func ownFlags(fs, global *pflag.FlagSet) *pflag.FlagSet {
	own := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if global != nil && global.Lookup(f.Name) != nil {
			return
		}
		own.AddFlag(f)
	})
	return own
}

func writeFlags(w io.Writer, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		varname, usage := VarName(f)
		fmt.Fprintf(w, ".TP\n")
		if f.Shorthand != "" {
			fmt.Fprintf(w, "\\fB\\-%s\\fR, ", f.Shorthand)
		}
		fmt.Fprintf(w, "\\fB\\-\\-%s\\fR", roff(f.Name))
		if varname != "" {
			fmt.Fprintf(w, " \\fI%s\\fR", roff(varname))
		}
		fmt.Fprintf(w, "\n%s", roff(usage))
		if d := defaultText(f); d != "" {
			fmt.Fprintf(w, " (default %s)", roff(d))
		}
		fmt.Fprintf(w, "\n")
	})
}

// defaultText is the flag's default as the help shows it, or "" when the
// default is the type's zero value or the usage text already says it.
func defaultText(f *pflag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
		return ""
	}
	if strings.Contains(f.Usage, "(default") {
		return ""
	}
	return f.DefValue
}

func writeText(w io.Writer, text string) {
	for i, para := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if i > 0 {
			fmt.Fprintf(w, ".PP\n")
		}
		lines := strings.Split(para, "\n")
		if strings.HasPrefix(lines[0], "  ") {
			fmt.Fprintf(w, ".nf\n.RS 4\n")
			for _, l := range lines {
				fmt.Fprintf(w, "%s\n", roff(strings.TrimPrefix(l, "  ")))
			}
			fmt.Fprintf(w, ".RE\n.fi\n")
			continue
		}
		for _, l := range lines {
			fmt.Fprintf(w, "%s\n", roff(strings.TrimSpace(l)))
		}
	}
}

// roff escapes s for a text line: backslashes, dashes (which man would
// otherwise print as hyphens), and a leading control character.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}
