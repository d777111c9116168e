// Command corralctl is the command-line client of corrald: it runs commands
// under the daemon's supervision and inspects, waits for, signals and cancels
// executions over the JSON-RPC socket (see docs/protocol.md).
//
// Exit status: `run` and `wait` exit with the execution's own status (124 on
// timeout, 128+N when killed by signal N, 126/127 when the command could not
// be executed) and with 125 when corralctl or the daemon failed. The other
// commands exit 0 on success, 1 when a call failed and 2 on a usage error.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(Main(os.Args[1:], &env{
		stdin:  os.Stdin,
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
		notifySignals: func() (<-chan os.Signal, func()) {
			// A closed stdout must be an EPIPE error that run handles (by
			// cancelling the execution), not a silent death by SIGPIPE.
			signal.Ignore(syscall.SIGPIPE)
			ch := make(chan os.Signal, 2)
			// SIGHUP too: with run -t our terminal may be in raw mode,
			// and a handled signal lets run restore it on the way out.
			signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			return ch, func() { signal.Stop(ch) }
		},
		notifyResize: func() (<-chan os.Signal, func()) {
			ch := make(chan os.Signal, 1)
			signal.Notify(ch, syscall.SIGWINCH)
			return ch, func() { signal.Stop(ch) }
		},
	}))
}
