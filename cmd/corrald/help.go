package main

import (
	"io"

	"github.com/spf13/pflag"

	"github.com/corral-dev/corral/cmd/internal/cli"
)

const helpSynopsis = "corrald [OPTION]..."

const helpDescription = `Supervise tool commands for AI-agent processes that ask over a Unix socket
(JSON-RPC 2.0): each in its own kill-able scope, limited, observed, killed on
time and cleaned up.

Every option may also be set in the config file as "name = value" (the
option's name without dashes); options on the command line win.`

func printHelp(w io.Writer, fs *pflag.FlagSet) {
	cli.Usage(w, helpSynopsis, "\n"+helpDescription, fs)
	io.WriteString(w, "\nSee corrald(8) and docs/corrald.md for the scope backends and start-up.\n")
}

// writeManPage writes corrald(8), from the same flags as --help.
func writeManPage(w io.Writer, fs *pflag.FlagSet) {
	cli.WriteMan(w, cli.Page{
		Name:        "corrald",
		Section:     "8",
		Summary:     "corral's supervisor daemon for AI-agent tool commands",
		Synopsis:    []string{"[OPTION]..."},
		Description: helpDescription,
		Options:     fs,
		Version:     version,
		Extra: []cli.Section{
			{Title: "Files", Text: `/etc/corral/corrald.conf: the config file, one "name = value" per line; "#" starts a comment.

/var/lib/corral: the state directory (the execution store and workspaces).

/run/corral/corrald.sock: the socket, usually passed by corrald.socket.`},
			{Title: "Environment", Text: `OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and the other OTEL_* variables of the OpenTelemetry specification: when an endpoint is set, corrald exports one trace per execution over OTLP. GOGC: the Go collector's heap growth before a collection, 50 unless set (less memory per supervised child for a little more CPU in collections).`},
			{Title: "Exit status", Text: `0 after a clean shutdown (SIGTERM or SIGINT), 1 when start-up or the event loop failed (the journal's MESSAGE says why), 2 on a usage error.`},
			{Title: "See also", Text: `corralctl(1), systemd.socket(5)`},
		},
	})
}
