// Command corrald is corral's supervisor daemon: it runs tool commands for
// AI-agent processes that ask over a Unix socket (JSON-RPC 2.0), each in its
// own kill-able scope, limited, observed, killed on time and cleaned up.
//
// See docs/corrald.md for flags and docs/protocol.md for the API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/corral-dev/corral/shim"
	"github.com/corral-dev/corral/systemd"
)

// defaultGCPercent is corrald's GOGC when the environment sets none.
const defaultGCPercent = 50

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The shim, when corrald runs as its own (--shim self, or no
	// corral-shim next to it). It must run before
	// anything else touches the process (flags, threads' state, fds).
	if len(os.Args) > 1 && os.Args[1] == shim.Arg {
		shim.Main()
	}
	// The Go heap may grow to (1 + GOGC/100) times what is live before a
	// collection; what is live is mostly the running executions' state, so
	// that slack is most of the daemon's memory per supervised child: 9.5
	// KiB per running child at the default 100, 7.4 at 50 (bench (c)).
	// GOGC in the environment still decides.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	// Whatever started corrald may have leaked fds without O_CLOEXEC, and
	// a handover's previous image passes its own without it: none of them
	// may reach a child. Before anything could fork.
	inheritErr := markInheritedCloexec()
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, errHelpShown) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "corrald: %v\nTry 'corrald --help' for more information.\n", err)
		os.Exit(2)
	}
	if cfg.showVersion {
		fmt.Println("corrald", version)
		return
	}
	log := newLogger(cfg)
	if inheritErr != nil {
		log.Warn().Err(inheritErr).Msg("mark inherited fds close-on-exec")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The log entries still queued for the journal (systemd.JournalWriter)
	// would die with the process.
	defer systemd.FlushJournal(2 * time.Second)
	if err := run(ctx, cfg, log); err != nil {
		// The reason goes in the message itself: it is the journal's
		// MESSAGE, the one line `systemctl status` shows.
		log.Error().Err(err).Msg("corrald failed: " + err.Error())
		systemd.FlushJournal(2 * time.Second)
		os.Exit(1)
	}
}
