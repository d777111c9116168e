// Package store is corral's durable execution store: every execution record,
// its start params and the kept output of finished executions, so that records
// and idempotency keys survive a daemon restart.
//
// The default implementation is SQLite (modernc.org/sqlite, pure Go) in WAL
// mode at <state-dir>/corral.db, opened with Open. NewMemory is the same
// contract without a disk, for tests and runs without a state directory.
//
// Writes are asynchronous: Create, Transition and SaveOutput queue the write
// and return at once with a buffered channel (capacity 1) that receives the
// answer once the write is durable. They never block on disk, so the reactor
// may call them from its loop goroutine; it must tell waiting clients about a
// transition only after the channel says so. Reads (Get, Output, List,
// Unfinished) are synchronous, may run on any goroutine and may wait on disk,
// so the loop should call them from a helper goroutine.
//
// Choices the reactor relies on:
//
//   - Ids are unique across owners (the primary key is the id alone), so
//     exec.get finds a record by id and then checks its owner. exec.start with
//     a known id is the reactor's to settle: the same owner gets the stored
//     record (or -32004 if argv differs), another owner -32004 ("id in use").
//     Create answers ErrExists as the backstop.
//   - A transition applies when the stored state is at or before the state the
//     caller moved from (UPDATE ... WHERE id = ? AND state <= from). States are
//     ordered, so a late or duplicate transition is a no-op and a record never
//     moves backwards, while a record left behind by a failed write catches up
//     with the next transition.
//   - Durability: WAL with synchronous=FULL by default, so an acknowledged write
//     survives a kill -9 and a power loss; group commit makes it one fsync per
//     batch. SyncNormal survives a kill -9 but not a power loss.
//   - Checkpoints (copying the WAL into the database) run on a goroutine
//     and connection of their own beside the writer, not inside its
//     commits, and only once ckptFrames frames are uncopied (a checkpoint
//     that copied every frame makes the next commit start the WAL over and
//     sync its new header): the writer counts the frames its commits wrote
//     and wakes the checkpointer only then, not after every commit; past
//     walLimit frames the writer checkpoints itself, so the WAL stays
//     bounded under a writer that never pauses (checkpoint.go).
//   - One process at a time: Open takes an exclusive flock on
//     <dir>/corral.lock (dropped by the kernel if the daemon dies), so a
//     second daemon on the same state directory fails to start instead of
//     marking the first one's executions lost.
//   - A failed write (disk full, read-only, I/O error) answers its channel with
//     the error and makes Health non-nil until a later write succeeds; nothing
//     of the failed transaction is kept. Writes batched with a failing one are
//     retried alone, so one bad write fails alone.
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/rs/zerolog"
)

// Store is the interface the reactor consumes. All methods are safe for
// concurrent use by any goroutine.
//
// Write ordering: writes are applied in the order their calls returned, so a
// Transition queued after a Create of the same id always sees the record.
type Store interface {
	// Create queues the insertion of a new record (rec.State is normally
	// started) with the exec.start params it came from (JSON, kept for audit
	// and the idempotency comparison; may be nil). Ids are unique across all
	// owners: a record with the same id, whoever owns it, answers ErrExists.
	Create(rec api.Record, params []byte) <-chan error

	// Transition queues a conditional update of the record rec.ID to rec,
	// which the caller moved from state from to rec.State. It applies only
	// when the stored record has not moved past from (stored state <= from),
	// so a late or duplicate transition is a no-op and a record never moves
	// backwards; a stored state behind from (an earlier write failed) catches
	// up. rec.State must be a legal successor of from (see Legal), or from
	// itself for an update without a state change; anything else answers
	// ErrIllegal without writing. outs are written in the same transaction
	// (typically the kept output with the exited transition). A record's
	// identity (id, owner, created_at, argv, labels) is the Create's: what
	// List filters on is not rewritten by a Transition.
	Transition(from api.State, rec api.Record, outs ...Output) <-chan Result

	// Every store also answers transitions by callback (see Notifier): the
	// reactor persists through TransitionFunc alone.
	Notifier

	// SaveOutput queues replacing the kept output of one stream of record id.
	// It answers ErrNotFound when the record does not exist.
	SaveOutput(id string, out Output) <-chan error

	// Get returns the record id, whoever owns it; ok is false when there is
	// none. Ownership checks are the caller's.
	Get(id string) (rec api.Record, ok bool, err error)

	// Params returns the exec.start params stored with record id.
	Params(id string) (params []byte, ok bool, err error)

	// Output returns the kept output of stream ("stdout" or "stderr") of
	// record id; ok is false when none was saved.
	Output(id, stream string) (out KeptOutput, ok bool, err error)

	// List returns the records matching f, newest (created_at) first.
	List(f ListFilter) ([]api.Record, error)

	// Unfinished returns the records in started, running, canceling or
	// exited, oldest first: what start-up recovery must settle.
	Unfinished() ([]api.Record, error)

	// DeleteCleanedBefore deletes the records (and their kept output) that
	// reached cleaned before t and returns how many. It waits for the write
	// to be durable, so it must not be called from the loop goroutine.
	DeleteCleanedBefore(t time.Time) (int, error)

	// Health returns nil, or the error of the last failed write while no
	// write has succeeded since (the store is degraded).
	Health() error

	// Close waits for every queued write to finish, then releases the store.
	// Writes queued after Close answer ErrClosed.
	Close() error
}

// Notifier is the part of Store that answers a Transition with a call
// instead of a channel. TransitionFunc is Transition, except that done
// is called with the result: on the store's writer goroutine once the
// write is durable or failed, in the order the writes were queued; before
// TransitionFunc returns when the write fails at once (an illegal
// transition, a closed store) or the store has no writer (Memory). done
// must not block. It spares a caller that would park a goroutine on each
// channel one thread wake-up per write.
type Notifier interface {
	TransitionFunc(from api.State, rec api.Record, done func(Result), outs ...Output)
}

// Result is the answer to a Transition.
type Result struct {
	// Applied is true when the record was updated; false when the stored
	// record had already moved past from (a late or duplicate transition)
	// or does not exist.
	Applied bool
	// State is the stored state after the call: rec.State when Applied,
	// otherwise the state that prevented it (0 when there is no record).
	State api.State
	// Err is set when the write failed (nothing was written) or the
	// transition is illegal.
	Err error
	// JSON is the caller's rec as the store encoded it (encoding/json;
	// the same bytes json.Marshal(rec) gives), set whenever Err is nil,
	// applied or not: a caller that sends the record on (an exec.state
	// notification) need not encode it again. The caller must not modify
	// it.
	JSON []byte
}

// Stream names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// KeptOutput is what is kept of one output stream: Head holds the stream's
// bytes from offset 0, Tail the bytes from TailOffset to the end, Total the
// number of bytes the child wrote. The bytes between len(Head) and
// TailOffset were dropped; when TailOffset == len(Head), nothing was.
type KeptOutput struct {
	Head       []byte
	Tail       []byte
	TailOffset int64
	Total      int64
}

// Info returns the stream's api.StreamInfo.
func (k KeptOutput) Info() api.StreamInfo {
	kept := int64(len(k.Head) + len(k.Tail))
	return api.StreamInfo{TotalBytes: k.Total, KeptBytes: kept, Truncated: k.Total > kept}
}

// Read returns up to limit kept bytes (all of them when limit <= 0) from
// offset, as exec.output answers: when offset lies in the dropped middle, gap
// is true and data starts at the first kept byte after it; start says where
// data begins. At or past the end it returns no data and start == Total.
func (k KeptOutput) Read(offset, limit int64) (data []byte, start int64, gap bool) {
	offset = max(offset, 0)
	if offset >= k.Total {
		return nil, k.Total, false
	}
	if limit <= 0 {
		limit = k.Total
	}
	if head := int64(len(k.Head)); offset < head {
		return bytes.Clone(k.Head[offset:min(head, offset+limit)]), offset, false
	}
	if offset < k.TailOffset {
		gap, offset = true, k.TailOffset // in the dropped middle
	}
	from := offset - k.TailOffset
	if from >= int64(len(k.Tail)) {
		return nil, k.Total, gap
	}
	return bytes.Clone(k.Tail[from:min(int64(len(k.Tail)), from+limit)]), offset, gap
}

// Output is the kept output of one stream of an execution.
type Output struct {
	Stream string // Stdout or Stderr
	Kept   KeptOutput
}

// ListFilter selects records for List. Zero fields match everything.
type ListFilter struct {
	OwnerUID *uint32
	State    *api.State
	Labels   map[string]string // all must match
	Limit    int               // 0 means no limit
}

// Errors. Each is wrapped with context; test with errors.Is.
var (
	// ErrExists answers Create for an id that is already stored.
	ErrExists = errors.New("execution id already exists")
	// ErrNotFound answers SaveOutput for an unknown id.
	ErrNotFound = errors.New("execution not found")
	// ErrIllegal answers a Transition whose target is not a legal
	// successor of from.
	ErrIllegal = errors.New("illegal state transition")
	// ErrClosed answers writes queued after Close.
	ErrClosed = errors.New("store closed")
)

// Legal reports whether a Transition from from to to is allowed: a move the
// lifecycle allows (api.State.CanMoveTo), or an update in place of a state
// that is not terminal.
func Legal(from, to api.State) bool {
	if from == to {
		return from.Valid() && !from.Terminal()
	}
	return from.CanMoveTo(to)
}

func checkTransition(from api.State, rec api.Record, outs []Output) error {
	if !Legal(from, rec.State) {
		return fmt.Errorf("transition %s %s -> %s: %w", rec.ID, from, rec.State, ErrIllegal)
	}
	for _, o := range outs {
		if err := checkStream(o.Stream); err != nil {
			return fmt.Errorf("transition %s: %w", rec.ID, err)
		}
	}
	return nil
}

func checkStream(s string) error {
	if s != Stdout && s != Stderr {
		return fmt.Errorf("unknown stream %q", s)
	}
	return nil
}

// unfinishedStates are the states recovery must settle.
var unfinishedStates = []api.State{api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited}

// cleanedAt is the time a cleaned record counts from for retention.
func cleanedAt(rec api.Record, now time.Time) *time.Time {
	if rec.State != api.StateCleaned {
		return nil
	}
	if rec.CleanedAt != nil {
		return rec.CleanedAt
	}
	return &now
}

func encodeRecord(rec api.Record) ([]byte, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode record %s: %w", rec.ID, err)
	}
	return b, nil
}

func decodeRecord(b []byte) (api.Record, error) {
	var rec api.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return api.Record{}, fmt.Errorf("decode record: %w", err)
	}
	return rec, nil
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func done[T any](v T) <-chan T {
	c := make(chan T, 1)
	c <- v
	return c
}

// DefaultSweepInterval is the sweep interval StartSweeper uses when given 0.
func DefaultSweepInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), time.Minute)
}

// StartSweeper starts a goroutine that deletes, every interval (0: the
// default), the records cleaned more than retention ago. It stops when ctx
// ends; the returned channel is closed once it has.
func StartSweeper(ctx context.Context, s Store, log zerolog.Logger, retention, interval time.Duration) <-chan struct{} {
	if interval <= 0 {
		interval = DefaultSweepInterval(retention)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := s.DeleteCleanedBefore(time.Now().Add(-retention))
			switch {
			case err != nil:
				log.Error().Err(err).Msg("retention sweep")
			case n > 0:
				log.Debug().Int("deleted", n).Dur("retention", retention).Msg("retention sweep")
			}
		}
	}()
	return stopped
}
