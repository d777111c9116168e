package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/corral-dev/corral/api"
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
		"run":    {"run [flags] -- CMD [ARG...]", "run a command under corrald, stream its output live and exit with its status (--json: then print the final record)", cmdRun},
		"ps":     {"ps [--state S] [--label k=v]... [--limit N]", "list executions", cmdPs},
		"status": {"status ID", "show one execution", cmdStatus},
		"logs":   {"logs [-f] [--stderr] ID", "print an execution's output (-f: follow it)", cmdLogs},
		"wait":   {"wait [--timeout D] ID", "wait until an execution is cleaned up; exit with its status", cmdWait},
		"cancel": {"cancel [--reason R] ID", "cancel an execution (SIGTERM, then SIGKILL after its grace)", cmdCancel},
		"signal": {"signal [--main] ID SIG", "send a signal (name or number) to an execution's processes (--main: main process only)", cmdSignal},
		"info":   {"info", "show daemon information", cmdInfo},
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: corralctl [--socket PATH] [--json] COMMAND [ARGS]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-44s %s\n", commands[n].usage, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'corralctl COMMAND --help' for a command's flags.\n"+
		"run and wait exit with the execution's status: its exit code, 124 on timeout,\n"+
		"128+N when killed by signal N, 126/127 when it could not be executed, and\n"+
		"125 when corralctl or the daemon failed. Other commands exit 1 on failure.\n")
}

// Main runs corralctl with args (without the program name) and returns the
// exit status.
func Main(args []string, e *env) int {
	g := &globalFlags{}
	fs := flag.NewFlagSet("corralctl", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() { printUsage(e.stderr) }
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
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
	cmd, ok := commands[rest[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "corralctl: unknown command %q\n", rest[0])
		printUsage(e.stderr)
		return exitUsage
	}
	return cmd.run(e, g, rest[1:])
}

// newFlagSet returns a FlagSet for a subcommand that also accepts the global
// flags.
func newFlagSet(e *env, g *globalFlags, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("corralctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: corralctl %s\n\n%s\n\nflags:\n", commands[name].usage, commands[name].summary)
		fs.PrintDefaults()
	}
	g.register(fs)
	return fs
}

// parseArgs parses a subcommand's flags (anywhere among its arguments) and
// checks the number of positional arguments. On failure it returns the exit
// status to use and ok false.
func parseArgs(e *env, fs *flag.FlagSet, args []string, nargs int, usageCode int) ([]string, int, bool) {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, usageCode, false
	}
	if len(pos) != nargs {
		fmt.Fprintf(e.stderr, "corralctl: %s takes %d argument(s), got %d\n", fs.Name(), nargs, len(pos))
		fs.Usage()
		return nil, usageCode, false
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
		return nil, err
	}
	return c, nil
}

// describe renders an error for the user; daemon errors show their code.
func describe(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
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
