package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/cmd/internal/cli"
	"github.com/corral-dev/corral/ipc"
)

// env is everything a command touches outside the process, so that tests
// can run commands in-process.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// notifySignals subscribes to SIGINT and SIGTERM for the duration of
	// `run`; nil means no signal handling.
	notifySignals func() (<-chan os.Signal, func())
	// notifyResize subscribes to SIGWINCH for `run -t`; nil means none.
	notifyResize func() (<-chan os.Signal, func())
	// collect, when set, is given each command's flag set as newFlagSet
	// makes it (see commandFlags).
	collect func(*pflag.FlagSet)
}

// command is one subcommand. run returns the exit status.
type command struct {
	usage   string
	summary string
	run     func(e *env, g *globalFlags, args []string) int
}

var commands map[string]*command

func init() {
	commands = map[string]*command{
		"run":        {"run [OPTION]... [--] CMD [ARG]...", "run a command under corrald, stream its output live and exit with its status (--json: then print the final record)", cmdRun},
		"ps":         {"ps [OPTION]...", "list executions", cmdPs},
		"status":     {"status [OPTION]... ID", "show one execution", cmdStatus},
		"logs":       {"logs [OPTION]... ID", "print an execution's output (-f: follow it)", cmdLogs},
		"wait":       {"wait [OPTION]... ID", "wait until an execution is cleaned up; exit with its status", cmdWait},
		"cancel":     {"cancel [OPTION]... ID", "cancel an execution (SIGTERM, then SIGKILL after its grace)", cmdCancel},
		"signal":     {"signal [OPTION]... ID SIG", "send a signal (name or number) to an execution's processes (--main: main process only)", cmdSignal},
		"info":       {"info [OPTION]...", "show daemon information", cmdInfo},
		"extend":     {"extend [OPTION]... ID DURATION", "give a running execution a new deadline, DURATION from now (exec.update)", cmdExtend},
		"completion": {"completion bash|zsh|fish", "print a completion script for the shell", cmdCompletion},
	}
}

const exitStatusText = `run and wait exit with the execution's status: its exit code, 124 on timeout
(wall-clock or idle),
128+N when killed by signal N, 126/127 when it could not be executed, and
125 when corralctl or the daemon failed. Other commands exit 1 on failure
and 2 on a usage error.`

// commandNames returns the commands' names, sorted.
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// globalFlagSet is the flag set of corralctl itself (before COMMAND).
func globalFlagSet(e *env, g *globalFlags) (*pflag.FlagSet, *bool) {
	fs := pflag.NewFlagSet("corralctl", pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {}
	// Flags after COMMAND are the command's.
	fs.SetInterspersed(false)
	g.register(fs)
	fs.Bool("version", false, "print the version and exit")
	return fs, cli.HelpFlag(fs)
}

func printUsage(w io.Writer) {
	fs, _ := globalFlagSet(&env{stderr: io.Discard}, &globalFlags{})
	cli.Usage(w, "corralctl [OPTION]... COMMAND [ARG]...", "\nRun commands under corrald's supervision and inspect, wait for, signal and\ncancel executions.", fs)
	fmt.Fprintf(w, "\nCommands:\n")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %s\n      %s\n", commands[n].usage, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'corralctl COMMAND --help' for a command's options.\n%s\n", exitStatusText)
}

// Main runs corralctl with args (without the program name) and returns the
// exit status.
func Main(args []string, e *env) int {
	g := &globalFlags{}
	fs, help := globalFlagSet(e, g)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(e.stderr, "corralctl: %v\nTry 'corralctl --help' for more information.\n", err)
		return exitUsage
	}
	if *help {
		printUsage(e.stdout)
		return 0
	}
	if v, _ := fs.GetBool("version"); v {
		fmt.Fprintln(e.stdout, "corralctl", version)
		return 0
	}
	rest := fs.Args()
	if len(rest) == 0 {
		printUsage(e.stderr)
		return exitUsage
	}
	if rest[0] == "help" {
		printUsage(e.stdout)
		return 0
	}
	if rest[0] == manCommand {
		return cmdMan(e, g, rest[1:])
	}
	cmd, ok := commands[rest[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "corralctl: unknown command %q\n", rest[0])
		printUsage(e.stderr)
		return exitUsage
	}
	return cmd.run(e, g, rest[1:])
}

// newFlagSet returns the flag set of command name, which also accepts the
// global flags and -h/--help. Flags may come anywhere among the command's
// arguments ("status ID --json"); "--" ends them.
func newFlagSet(e *env, g *globalFlags, name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("corralctl "+name, pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {}
	g.register(fs)
	cli.HelpFlag(fs)
	if e.collect != nil {
		e.collect(fs)
	}
	return fs
}

// commandUsage writes command name's GNU-style help.
func commandUsage(w io.Writer, fs *pflag.FlagSet) {
	name := strings.TrimPrefix(fs.Name(), "corralctl ")
	s := commands[name].summary
	cli.Usage(w, "corralctl "+commands[name].usage, "\n"+strings.ToUpper(s[:1])+s[1:]+".", fs)
	if name == "run" || name == "wait" || name == "logs" {
		fmt.Fprintf(w, "\n%s\n", redialText)
	}
}

// helpAsked prints the command's help on stdout when --help was given.
func helpAsked(e *env, fs *pflag.FlagSet) bool {
	if h, err := fs.GetBool("help"); err == nil && h {
		commandUsage(e.stdout, fs)
		return true
	}
	return false
}

// usageError reports a flag error once, with a pointer to --help, and
// returns code.
func usageError(e *env, fs *pflag.FlagSet, err error, code int) int {
	fmt.Fprintf(e.stderr, "%s: %v\nTry '%s --help' for more information.\n", fs.Name(), err, fs.Name())
	return code
}

// parseArgs parses a subcommand's flags (anywhere among its arguments) and
// checks the number of positional arguments. On failure or --help it
// returns the exit status to use and ok false.
func parseArgs(e *env, fs *pflag.FlagSet, args []string, nargs int, usageCode int) ([]string, int, bool) {
	if err := fs.Parse(args); err != nil {
		return nil, usageError(e, fs, err, usageCode), false
	}
	if helpAsked(e, fs) {
		return nil, 0, false
	}
	pos := fs.Args()
	if len(pos) != nargs {
		return nil, usageError(e, fs, fmt.Errorf("takes %d argument(s), got %d", nargs, len(pos)), usageCode), false
	}
	return pos, 0, true
}

// socketPath is --socket, else $CORRAL_SOCKET, else the default.
func (g *globalFlags) socketPath(e *env) string {
	if g.socket != "" {
		return g.socket
	}
	if p := e.getenv(ipc.SocketEnv); p != "" {
		return p
	}
	return ipc.DefaultSocketPath
}

func dial(ctx context.Context, e *env, g *globalFlags) (*ipc.Client, error) {
	c, err := ipc.DialContext(ctx, g.socketPath(e))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "connection refused") {
			return nil, fmt.Errorf("%w (is corrald running?)", err)
		}
		return nil, withSocketHint(err, g.socketPath(e))
	}
	return c, nil
}

// withSocketHint adds to a connect error refused for want of permission what
// to do about it: corrald's socket is mode 0660, for its group.
func withSocketHint(err error, path string) error {
	if !errors.Is(err, os.ErrPermission) {
		return err
	}
	group := "corral"
	if fi, serr := os.Stat(path); serr == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			group = strconv.FormatUint(uint64(st.Gid), 10)
			if g, gerr := user.LookupGroupId(group); gerr == nil {
				group = g.Name
			}
		}
	}
	return fmt.Errorf("%w (the socket is for members of group %s: ask an administrator to add you (usermod -aG %s $USER, then log in again), or use a corrald of your own with --socket)", err, group, group)
}

// describe renders an error for the user; daemon errors show their code.
func describe(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Code == api.CodeNotFound {
			// corrald says the same of another user's execution and of
			// an expired record, so say which they can be.
			return fmt.Sprintf("%v (code %d): it does not exist, is another user's, or its record has expired; corralctl ps lists yours", err, ae.Code)
		}
		return fmt.Sprintf("%v (code %d)", err, ae.Code)
	}
	return err.Error()
}

// fail prints "corralctl: ..." to stderr and returns code.
func fail(e *env, code int, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "corralctl: "+format+"\n", args...)
	return code
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return nil
}
