package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
)

// runRedialFor is how long run, wait and logs -f redial a corrald that went
// away mid-run, counted from the loss; a reload takes well under a second, a
// restart by systemd a few.
var runRedialFor = 15 * time.Second

// Back-off between redial attempts: from redialFirst, doubling, up to
// redialMax.
const (
	redialFirst = 100 * time.Millisecond
	redialMax   = time.Second
)

// reconnector redials corrald for one command that holds a connection for an
// execution's life (run, wait, logs -f). Its budget (runRedialFor) runs from
// the first loss across every attempt and every connection that breaks
// before it has been up for a whole budget, so a peer that accepts and then
// closes at once (corrald at its connection limit, an old image still
// accepting) costs at most one budget, with a back-off between attempts,
// not a loop. A connection counts only once corrald answered on it.
type reconnector struct {
	e  *env
	g  *globalFlags
	id string // the execution, asked for on each new connection

	lostAt     time.Time // start of the current budget; zero: none running
	answeredAt time.Time // when the last new connection answered
	attempts   int       // attempts in the current budget
}

// redial returns a connection to corrald on which it answered for the
// execution (exec.get), or an error once ctx ends or the budget is spent.
// what says what the command goes on doing ("following ID on"), printed
// once corrald answered. lost is the error that broke the last connection.
func (r *reconnector) redial(ctx context.Context, lost error, what string) (*ipc.Client, error) {
	now := time.Now()
	if r.lostAt.IsZero() || (!r.answeredAt.IsZero() && now.Sub(r.answeredAt) > runRedialFor) {
		// A new loss (the last connection lived longer than a budget): a
		// new budget.
		r.lostAt, r.attempts = now, 0
	}
	ctx, cancel := context.WithDeadline(ctx, r.lostAt.Add(runRedialFor))
	defer cancel()
	last := lost
	for {
		if r.attempts > 0 {
			wait := redialFirst << min(r.attempts-1, 4)
			select {
			case <-ctx.Done():
				return nil, r.giveUp(ctx, last)
			case <-time.After(min(wait, redialMax)):
			}
		}
		r.attempts++
		c, err := dial(ctx, r.e, r.g)
		if err != nil {
			last = err
			if ctx.Err() != nil {
				return nil, r.giveUp(ctx, last)
			}
			continue
		}
		_, err = c.Get(ctx, r.id)
		if err == nil {
			r.answeredAt = time.Now()
			fmt.Fprintf(r.e.stderr, "corralctl: connection to corrald lost (restart or reload?); reconnected, %s\n", what)
			return c, nil
		}
		c.Close()
		var ae *api.Error
		switch {
		case !errors.As(err, &ae), ae.Code == api.CodeOverCapacity:
			// Broke (closed, reset, a failed send) or was refused before
			// answering: a failed dial.
			last = err
			if ctx.Err() != nil {
				return nil, r.giveUp(ctx, last)
			}
		case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
			return nil, fmt.Errorf("the corrald that answered after the connection was lost does not know %s; it may be a different daemon (restarted without its state, or another --state-dir) rather than the one that ran it: %s", r.id, describe(err))
		default:
			return nil, fmt.Errorf("get %s after reconnecting: %s", r.id, describe(err))
		}
	}
}

// giveUp is the error of a redial that ended with ctx: the budget spent, or
// the command's own end (its --timeout, a signal).
func (r *reconnector) giveUp(ctx context.Context, last error) error {
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) && time.Since(r.lostAt) >= runRedialFor {
		return fmt.Errorf("not reconnected within %s: %s", runRedialFor, describe(last))
	}
	return fmt.Errorf("not reconnected: %w (last attempt: %s)", ctx.Err(), describe(last))
}

// redialText is what run, wait and logs -f do when corrald reloads or
// restarts under them, for their --help and the man page.
const redialText = `When corrald reloads or restarts under run, wait or logs -f (the execution
survives it), they redial the socket and go on: run and logs -f from the
output they have written, wait with what is left of its --timeout. The
redial gives up 15 s after the connection was lost (backing off between
attempts; a connection counts once corrald answered on it for the
execution) and the command exits 125 (logs -f: 1). A SIGINT/SIGTERM in
the gap is sent as the cancel once corrald is reached again. run -t, and
run -i until all of its stdin reached corrald (EOF), do not redial (their
input goes over the lost connection): they exit 125 and name the commands
to reattach (corralctl logs -f ID, wait ID) while the execution runs on.`
