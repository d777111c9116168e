package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// Exit statuses of corralctl itself, as timeout(1) and env(1) use them.
const (
	exitTimeout      = 124 // the execution hit its wall-clock timeout
	exitFailure      = 125 // corralctl or the daemon failed; nothing ran to an outcome
	exitCannotExec   = 126 // the command was found but could not be executed
	exitNotFound     = 127 // the command was not found
	exitSignalBase   = 128 // + signal number when killed by a signal
	exitUsage        = 2   // bad command line, for commands other than run and wait
	exitErrorGeneric = 1   // a failed call, for commands other than run and wait
)

// signalNumber returns the number of a signal given as "SIGKILL", "KILL",
// "kill" or "9", or 0 when it is unknown.
func signalNumber(name string) int {
	if n, err := strconv.Atoi(name); err == nil {
		if n > 0 && n < 65 {
			return n
		}
		return 0
	}
	up := strings.ToUpper(name)
	if !strings.HasPrefix(up, "SIG") {
		up = "SIG" + up
	}
	return int(unix.SignalNum(up))
}

// signalName normalises a signal given as a name or number to "SIGTERM"
// form; ok is false when it is unknown.
func signalName(s string) (string, bool) {
	n := signalNumber(s)
	if n == 0 {
		return "", false
	}
	if name := unix.SignalName(unix.Signal(n)); name != "" {
		return name, true
	}
	return "", false
}

// exitStatus maps a finished execution to the exit status of `corralctl
// run` and `corralctl wait`, with a note for stderr when the outcome needs
// explaining (empty for an ordinary exit or signal death):
//
//	exited                        -> its exit code
//	timeout, idle_timeout         -> 124, as timeout(1)
//	signaled, cancelled,
//	memory_limit, cpu_limit       -> 128 + the signal number that killed it
//	start_failed                  -> 127 for ENOENT, else 126, as a shell
//	lost, or no outcome           -> 125
//
// A cancelled or limited execution whose main process exited by itself
// during the grace period still counts as killed: 128+SIGTERM for cancelled,
// 128+SIGKILL for the limits, unless its exit code already says it failed.
func exitStatus(rec api.Record) (int, string) {
	if rec.Outcome == nil {
		return exitFailure, fmt.Sprintf("execution %s has no outcome yet (state %s)", rec.ID, rec.State)
	}
	bySignal := func(dflt unix.Signal) int {
		if rec.Signal != nil {
			if n := signalNumber(*rec.Signal); n > 0 {
				return exitSignalBase + n
			}
		}
		if rec.ExitCode != nil && *rec.ExitCode != 0 {
			return *rec.ExitCode
		}
		return exitSignalBase + int(dflt)
	}
	detail := ""
	if rec.Error != nil && *rec.Error != "" {
		detail = ": " + *rec.Error
	}
	switch *rec.Outcome {
	case api.OutcomeExited:
		if rec.ExitCode == nil {
			return exitFailure, fmt.Sprintf("execution %s exited without an exit code", rec.ID)
		}
		return *rec.ExitCode, ""
	case api.OutcomeSignaled:
		return bySignal(unix.SIGKILL), ""
	case api.OutcomeTimeout:
		return exitTimeout, fmt.Sprintf("execution %s timed out", rec.ID)
	case api.OutcomeIdleTimeout:
		return exitTimeout, fmt.Sprintf("execution %s timed out: no output for %s", rec.ID, formatDuration(time.Duration(rec.IdleTimeoutMS)*time.Millisecond))
	case api.OutcomeCancelled:
		return bySignal(unix.SIGTERM), fmt.Sprintf("execution %s cancelled%s", rec.ID, reasonSuffix(rec))
	case api.OutcomeMemoryLimit:
		return bySignal(unix.SIGKILL), fmt.Sprintf("execution %s killed: memory limit reached", rec.ID)
	case api.OutcomeCPULimit:
		return bySignal(unix.SIGKILL), fmt.Sprintf("execution %s killed: CPU time limit reached", rec.ID)
	case api.OutcomeStartFailed:
		code := exitCannotExec
		if rec.StartErrno == "ENOENT" || (rec.StartErrno == "" && rec.Error != nil && strings.Contains(strings.ToLower(*rec.Error), "no such file")) {
			code = exitNotFound
		}
		return code, fmt.Sprintf("cannot run %s%s", argv0(rec), detail)
	case api.OutcomeLost:
		return exitFailure, fmt.Sprintf("execution %s lost (the daemon restarted while it ran)%s", rec.ID, detail)
	}
	return exitFailure, fmt.Sprintf("execution %s has an unknown outcome %q%s", rec.ID, *rec.Outcome, detail)
}

func reasonSuffix(rec api.Record) string {
	if rec.CancelReason != "" {
		return " (" + rec.CancelReason + ")"
	}
	return ""
}

func argv0(rec api.Record) string {
	if len(rec.Argv) == 0 {
		return "command"
	}
	return strconv.Quote(rec.Argv[0])
}
