package main

import (
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli"
)

// manCommand prints corralctl(1); it is left out of the help, since only
// packaging (make install, make deb) needs it.
const manCommand = "__man"

// commandFlags returns the flag set command name defines, by running it
// with --help against an env that collects the set and discards the help:
// every command makes its set with newFlagSet and defines all its flags
// before it parses, so the set is the one it really accepts.
func commandFlags(name string) *pflag.FlagSet {
	var got *pflag.FlagSet
	e := &env{
		stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard,
		getenv: func(string) string { return "" },
		collect: func(fs *pflag.FlagSet) {
			if got == nil {
				got = fs
			}
		},
	}
	commands[name].run(e, &globalFlags{}, []string{"--help"})
	return got
}

// positional says what a command's arguments complete to.
var positional = map[string]string{
	"run":        "command",
	"completion": "words:bash zsh fish",
}

// describeCommands returns every command with its flags, sorted by name.
func describeCommands() []cli.Command {
	var out []cli.Command
	for _, n := range commandNames() {
		out = append(out, cli.Command{
			Name: n, Usage: commands[n].usage, Summary: commands[n].summary,
			Flags: commandFlags(n), Args: positional[n],
		})
	}
	return out
}

func cmdCompletion(e *env, g *globalFlags, args []string) int {
	fs := newFlagSet(e, g, "completion")
	pos, code, ok := parseArgs(e, fs, args, 1, exitUsage)
	if !ok {
		return code
	}
	global, _ := globalFlagSet(&env{stderr: io.Discard}, &globalFlags{})
	switch pos[0] {
	case "bash":
		cli.WriteBash(e.stdout, "corralctl", global, describeCommands())
	case "zsh":
		cli.WriteZsh(e.stdout, "corralctl", global, describeCommands())
	case "fish":
		cli.WriteFish(e.stdout, "corralctl", global, describeCommands())
	default:
		return fail(e, exitUsage, "completion: unknown shell %q (want bash, zsh or fish)", pos[0])
	}
	return 0
}

func cmdMan(e *env, _ *globalFlags, _ []string) int {
	global, _ := globalFlagSet(&env{stderr: io.Discard}, &globalFlags{})
	cli.WriteMan(e.stdout, cli.Page{
		Name:     "corralctl",
		Section:  "1",
		Summary:  "run and inspect commands under corrald's supervision",
		Synopsis: []string{"[OPTION]... COMMAND [ARG]..."},
		Description: `corralctl is the command-line client of corrald(8): it runs commands under the daemon's supervision and inspects, waits for, signals and cancels executions over the daemon's JSON-RPC socket.

Options may come anywhere among a command's arguments; "--" ends them. For run, the options end at the command: everything after it is the command's own.`,
		Options:  global,
		Commands: describeCommands(),
		Version:  version,
		Extra: []cli.Section{
			{Title: "Exit status", Text: exitStatusText},
			{Title: "Reload and restart of corrald", Text: redialText},
			{Title: "Environment", Text: `CORRAL_SOCKET: the socket when --socket is not given (default /run/corral/corrald.sock).

TRACEPARENT: a W3C trace context; run passes it to corrald, whose trace of the execution then becomes a child of the caller's span.`},
			{Title: "Examples", Text: `  corralctl run --timeout 10s -- make test
  corralctl run --detach --label tool_call=42 -- python3 job.py
  corralctl logs -f exec-1
  source <(corralctl completion bash)`},
			{Title: "See also", Text: "corrald(8)"},
		},
	})
	return 0
}
