package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/rs/zerolog"
)

// LostError is the error text of an execution the daemon lost track of.
const LostError = "corrald restarted while the execution ran"

// Lost returns rec as it ends when the daemon restarted while it ran: exited
// with outcome lost at now. The caller moves it on to cleaned once the
// execution's tree and scope are gone.
func Lost(rec api.Record, now time.Time) api.Record {
	rec.State = api.StateExited
	rec.Outcome = ptrTo(api.OutcomeLost)
	rec.ExitCode, rec.Signal = nil, nil
	rec.Error = ptrTo(LostError)
	rec.ExitedAt = &now
	if rec.StartedAt != nil {
		rec.DurationMS = now.Sub(*rec.StartedAt).Milliseconds()
	}
	return rec
}

// Recover settles, at start-up and before any new execution starts, the
// records an earlier daemon left unfinished (Unfinished): started, running
// and canceling ones move to exited with outcome lost; then clean is called
// for each (it must kill what is left of the tree and remove its scope and
// workspace, and may be called for an execution that left nothing), and on
// success the record moves to cleaned. A record whose clean fails stays
// exited, is logged and is retried at the next start-up. Recover waits for
// every write, so it must not run on the loop goroutine. It returns the
// number of records it cleaned.
func Recover(s Store, log zerolog.Logger, now time.Time, clean func(api.Record) error) (int, error) {
	return RecoverWith(s, log, now, RecoverOptions{}, clean)
}

// RecoverOptions refine Recover.
type RecoverOptions struct {
	// Skip leaves the records it accepts alone: the daemon adopts them
	// (their children survived the restart).
	Skip func(api.Record) bool
	// Why, when set, gives the error text of a lost record (what made
	// survival impossible) instead of LostError. It is given the record
	// as it was found (its state before it was lost).
	Why func(api.Record) string
	// NeverRan, when set, says which records never ran their command
	// (corrald died before it let it run): they end start_failed, with
	// Why's error, instead of lost.
	NeverRan func(api.Record) bool
}

// RecoverWith is Recover with options.
func RecoverWith(s Store, log zerolog.Logger, now time.Time, opts RecoverOptions, clean func(api.Record) error) (int, error) {
	recs, err := s.Unfinished()
	if err != nil {
		return 0, fmt.Errorf("recover: %w", err)
	}
	n := 0
	var errs []error
	for _, rec := range recs {
		if opts.Skip != nil && opts.Skip(rec) {
			continue
		}
		from := rec.State
		if from != api.StateExited {
			found := rec
			rec = Lost(rec, now)
			if opts.Why != nil {
				if why := opts.Why(found); why != "" {
					rec.Error = &why
				}
			}
			if opts.NeverRan != nil && opts.NeverRan(rec) {
				rec.Outcome = ptrTo(api.OutcomeStartFailed)
			}
			if r := <-s.Transition(from, rec); r.Err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", rec.ID, r.Err))
				continue
			} else if !r.Applied {
				continue // moved on meanwhile; nothing to settle
			}
			log.Warn().Str("exec_id", rec.ID).Stringer("was", from).Str("outcome", string(*rec.Outcome)).
				Msg("execution lost across a restart")
		}
		if err := clean(rec); err != nil {
			log.Error().Err(err).Str("exec_id", rec.ID).Msg("recover: clean up failed; left exited")
			continue
		}
		rec.State = api.StateCleaned
		rec.CleanedAt = &now
		if r := <-s.Transition(api.StateExited, rec); r.Err != nil {
			errs = append(errs, fmt.Errorf("recover %s: %w", rec.ID, r.Err))
			continue
		} else if r.Applied {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// Status is what daemon.info reports for s: "memory", "ok", or
// "degraded: <last write error>".
func Status(s Store) string {
	if _, ok := s.(*Memory); ok {
		return "memory"
	}
	if err := s.Health(); err != nil {
		return "degraded: " + err.Error()
	}
	return "ok"
}

func ptrTo[T any](v T) *T { return &v }
