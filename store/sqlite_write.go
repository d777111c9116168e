package store

// The SQLite store's writes: one writer goroutine takes every queued write
// (Create, Transition, SaveOutput, DeleteCleanedBefore) in order and
// group-commits them in one transaction, then answers each caller.
//
// Two things keep the commits on an execution's path few:
//   - A transition queued while an older one of the same record still waits
//     in the queue supersedes it (coalesce): only the newest record is
//     written, and both callers are answered at its commit. The older record
//     was never answered, so no one was told of it; the store ends where the
//     two writes one after the other would have left it.
//   - Writes queued while the writer applies a batch join that batch's
//     transaction before its COMMIT (late join), instead of waiting for the
//     next commit.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/corral-dev/corral/api"
)

// writeOp is one queued write. apply runs inside the batch transaction on
// the writer goroutine and returns only statement errors (which fail the
// transaction); outcomes such as "already exists" are kept in the op. finish
// answers the caller: err is nil once the transaction committed.
type writeOp interface {
	apply(ctx context.Context, s *SQLite) error
	finish(err error)
}

func (s *SQLite) enqueue(op writeOp) bool {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return false
	}
	switch op := op.(type) {
	case *transitionOp:
		if old := s.pending[op.id]; old != nil && op.supersedes(old) {
			if i := slices.Index(s.queue, writeOp(old)); i >= 0 {
				s.queue = slices.Delete(s.queue, i, i+1)
				op.superseded = append(old.superseded, old)
				s.coalesced.Add(1)
			}
		}
		s.pending[op.id] = op
	case *createOp:
		delete(s.pending, op.rec.ID)
	}
	s.queue = append(s.queue, op)
	s.mu.Unlock()
	s.signal()
	return true
}

func (s *SQLite) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take removes up to max queued writes. A taken transition can no longer
// be superseded.
func (s *SQLite) take(max int) (ops []writeOp, closing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(s.queue), max)
	if n == 0 {
		return nil, s.closing
	}
	ops = make([]writeOp, n)
	copy(ops, s.queue)
	rest := copy(s.queue, s.queue[n:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	for _, op := range ops {
		if t, ok := op.(*transitionOp); ok && s.pending[t.id] == t {
			delete(s.pending, t.id)
		}
	}
	return ops, s.closing
}

// startWriter starts the writer goroutine on the write connection's driver
// connection (wconn.go) and returns once it has prepared its statements, or
// failed to.
func (s *SQLite) startWriter() error {
	ready := make(chan error, 1)
	go func() {
		defer close(s.stopped)
		started := false
		err := s.conn.Raw(func(dc any) error {
			w, err := prepareWrites(context.Background(), dc)
			if err != nil {
				return err
			}
			started = true
			s.w = w
			s.startCount()
			ready <- nil
			s.writer()
			return w.close()
		})
		if !started {
			ready <- fmt.Errorf("start writer: %w", err)
		} else if err != nil {
			s.log.Warn().Err(err).Str("path", s.path).Msg("store: close the writer's statements")
		}
	}()
	return <-ready
}

// writer is the goroutine that owns the write connection. While it commits
// one batch the next one queues up, so the number of commits (fsyncs) per
// second stays bounded while writes per commit grow with load.
func (s *SQLite) writer() {
	for {
		ops, closing := s.take(s.maxBatch)
		if len(ops) == 0 {
			if closing {
				return
			}
			<-s.wake
			continue
		}
		s.runBatch(ops)
		s.afterCommit()
	}
}

func (s *SQLite) runBatch(ops []writeOp) {
	ops, err := s.commit(ops, true)
	if err != nil && len(ops) > 1 {
		// One bad write must not fail the others: retry each alone.
		s.log.Warn().Err(err).Int("writes", len(ops)).Msg("store batch failed; retrying writes one by one")
		for _, op := range ops {
			_, err := s.commit([]writeOp{op}, false)
			op.finish(err)
		}
		return
	}
	for _, op := range ops {
		op.finish(err)
	}
}

// commit applies ops in one transaction; with join, writes queued meanwhile
// (up to maxBatch in all) join it before the COMMIT. It returns every write
// the transaction held (applied or not when it failed). On failure nothing
// of it is kept.
//
// A lone write of one statement (oneStatement) is that statement alone, in
// SQLite's autocommit: the statement is its own transaction, begun and
// committed in its one step, with no BEGIN IMMEDIATE and COMMIT of its own
// to run (the commit of a followed execution's exit is one, issue 11 (b)).
// Nothing joins it: what was queued meanwhile is the next batch. The
// writer is the only writer, so the statement's write lock, taken after
// its read began, is never refused for a newer snapshot (SQLITE_BUSY).
func (s *SQLite) commit(ops []writeOp, join bool) (_ []writeOp, err error) {
	ctx := context.Background()
	defer func() {
		if err != nil {
			s.failures.Add(1)
			// COMMIT may fail leaving the transaction open (SQLITE_BUSY)
			// or already rolled back (SQLITE_FULL): roll back either way
			// so the connection is usable for the next batch.
			_, _ = wexec(ctx, s.w.rollback)
			s.setHealth(err)
		}
	}()
	if len(ops) == 1 {
		if o, ok := ops[0].(oneStatement); ok && o.oneStatement() {
			if err := ops[0].apply(ctx, s); err != nil {
				return ops, fmt.Errorf("store %s: %w", s.path, err)
			}
			s.committed(ops)
			return ops, nil
		}
	}
	if _, err := wexec(ctx, s.w.begin); err != nil {
		return ops, fmt.Errorf("store %s: begin: %w", s.path, err)
	}
	for i := 0; i < len(ops); i++ {
		if err := ops[i].apply(ctx, s); err != nil {
			return ops, fmt.Errorf("store %s: %w", s.path, err)
		}
		if join && i == len(ops)-1 && len(ops) < s.maxBatch {
			more, _ := s.take(s.maxBatch - len(ops))
			ops = append(ops, more...)
		}
	}
	if _, err := wexec(ctx, s.w.commit); err != nil {
		return ops, fmt.Errorf("store %s: commit: %w", s.path, err)
	}
	s.committed(ops)
	return ops, nil
}

// oneStatement is a write that may say it writes with one statement.
type oneStatement interface {
	oneStatement() bool
}

func (op *createOp) oneStatement() bool     { return true }
func (op *saveOutputOp) oneStatement() bool { return true }

// oneStatement: the UPDATE alone, with no kept output to write with it
// (the state read after an UPDATE that changed nothing writes nothing).
func (op *transitionOp) oneStatement() bool { return len(op.outs) == 0 }

// committed counts the commit of ops. Writer goroutine only.
func (s *SQLite) committed(ops []writeOp) {
	s.commits.Add(1)
	n := int64(len(ops))
	for _, op := range ops {
		if t, ok := op.(*transitionOp); ok {
			n += int64(len(t.superseded))
		}
	}
	s.writes.Add(n)
	s.setHealth(nil)
}

// --- writes ---

type createOp struct {
	rec    api.Record
	row    []any
	exists bool
	ch     chan error
}

func (s *SQLite) Create(rec api.Record, params []byte) <-chan error {
	b, err := encodeRecord(rec)
	if err != nil {
		return done(err)
	}
	labels, argv, err := encodeColumns(rec)
	if err != nil {
		return done(err)
	}
	op := &createOp{rec: rec, ch: make(chan error, 1), row: []any{
		rec.ID, int64(rec.Owner.UID), int(rec.State), outcomeCol(rec), rec.CreatedAt.UnixNano(),
		nanos(cleanedAt(rec, time.Now())), labels, argv, params, string(b),
	}}
	if !s.enqueue(op) {
		return done(fmt.Errorf("create %s: %w", rec.ID, ErrClosed))
	}
	return op.ch
}

func (op *createOp) apply(ctx context.Context, s *SQLite) error {
	n, err := wexec(ctx, s.w.insert, op.row...)
	if err != nil {
		return fmt.Errorf("create %s: %w", op.rec.ID, err)
	}
	op.exists = n == 0
	return nil
}

func (op *createOp) finish(err error) {
	if err == nil && op.exists {
		err = fmt.Errorf("create %s: %w", op.rec.ID, ErrExists)
	}
	op.ch <- err
}

type transitionOp struct {
	id   string
	from api.State
	to   api.State
	row  []any
	json []byte // rec encoded: row's record column, and Result.JSON
	outs []Output
	res  Result
	ch   chan Result  // the answer, when fn is nil
	fn   func(Result) // TransitionFunc's done, called on the writer goroutine
	// superseded are the older queued transitions of the same record that
	// this one replaced (oldest first): answered with this one's result,
	// before it.
	superseded []*transitionOp
}

// supersedes reports whether op, queued after old (same record, old not
// yet taken by the writer), can be written in old's stead: op moves on from
// where old leaves the record (so writing op alone ends where old then op
// would), and op's kept output covers every stream old would write.
func (op *transitionOp) supersedes(old *transitionOp) bool {
	if old.to > op.from {
		return false
	}
	for _, o := range old.outs {
		if !slices.ContainsFunc(op.outs, func(n Output) bool { return n.Stream == o.Stream }) {
			return false
		}
	}
	return true
}

func (s *SQLite) Transition(from api.State, rec api.Record, outs ...Output) <-chan Result {
	ch := make(chan Result, 1)
	s.transition(from, rec, outs, func(res Result) { ch <- res }, ch)
	return ch
}

var _ Notifier = (*SQLite)(nil)

// TransitionFunc is Transition answering through done (see Notifier).
func (s *SQLite) TransitionFunc(from api.State, rec api.Record, done func(Result), outs ...Output) {
	s.transition(from, rec, outs, done, nil)
}

// transition queues the update; an immediate failure is answered with
// fail at once, the write's result with ch (when not nil) or fn.
func (s *SQLite) transition(from api.State, rec api.Record, outs []Output, fail func(Result), ch chan Result) {
	if err := checkTransition(from, rec, outs); err != nil {
		fail(Result{Err: err})
		return
	}
	b, err := encodeRecord(rec)
	if err != nil {
		fail(Result{Err: err})
		return
	}
	// Only what a transition can change is rewritten: the owner, the
	// creation time, the labels and argv columns are the Create's (and
	// SET-ting an indexed column costs its index's update even when the
	// value is the same).
	op := &transitionOp{id: rec.ID, from: from, to: rec.State, outs: outs, ch: ch, json: b, row: []any{
		int(rec.State), outcomeCol(rec), nanos(cleanedAt(rec, time.Now())), string(b),
		rec.ID, int(from),
	}}
	if ch == nil {
		op.fn = fail
	}
	if !s.enqueue(op) {
		fail(Result{Err: fmt.Errorf("transition %s: %w", rec.ID, ErrClosed)})
	}
}

func (op *transitionOp) apply(ctx context.Context, s *SQLite) error {
	op.res = Result{}
	n, err := wexec(ctx, s.w.update, op.row...)
	if err != nil {
		return fmt.Errorf("transition %s %s -> %s: %w", op.id, op.from, op.to, err)
	}
	if n == 0 {
		var st int64
		row, err := wquery(ctx, s.w.state, op.id)
		if err == nil {
			err = int64s(row, &st)
		}
		if err != nil && !errors.Is(err, errNoRows) {
			return fmt.Errorf("transition %s: read state: %w", op.id, err)
		}
		op.res.State = api.State(st)
		return nil
	}
	op.res = Result{Applied: true, State: op.to}
	for _, o := range op.outs {
		k := o.Kept
		if _, err := wexec(ctx, s.w.output, op.id, o.Stream, k.Head, k.Tail, k.TailOffset, k.Total); err != nil {
			return fmt.Errorf("transition %s: save %s: %w", op.id, o.Stream, err)
		}
	}
	return nil
}

func (op *transitionOp) finish(err error) {
	res := op.res
	if err != nil {
		res = Result{Err: err}
	}
	for _, old := range op.superseded {
		old.answer(res)
	}
	op.answer(res)
}

// answer gives op's caller res, with op's own record's JSON (a superseded
// op is answered with the result of the op that replaced it, but its
// caller sent a record of its own).
func (op *transitionOp) answer(res Result) {
	if res.Err == nil {
		res.JSON = op.json
	}
	if op.fn != nil {
		op.fn(res)
		return
	}
	op.ch <- res
}

type saveOutputOp struct {
	id      string
	out     Output
	missing bool
	ch      chan error
}

func (s *SQLite) SaveOutput(id string, out Output) <-chan error {
	if err := checkStream(out.Stream); err != nil {
		return done(fmt.Errorf("save output %s: %w", id, err))
	}
	op := &saveOutputOp{id: id, out: out, ch: make(chan error, 1)}
	if !s.enqueue(op) {
		return done(fmt.Errorf("save output %s: %w", id, ErrClosed))
	}
	return op.ch
}

func (op *saveOutputOp) apply(ctx context.Context, s *SQLite) error {
	k := op.out.Kept
	n, err := wexec(ctx, s.w.saveOutput, op.id, op.out.Stream, k.Head, k.Tail, k.TailOffset, k.Total, op.id)
	if err != nil {
		return fmt.Errorf("save output %s %s: %w", op.id, op.out.Stream, err)
	}
	op.missing = n == 0
	return nil
}

func (op *saveOutputOp) finish(err error) {
	if err == nil && op.missing {
		err = fmt.Errorf("save output %s: %w", op.id, ErrNotFound)
	}
	op.ch <- err
}

type deleteOp struct {
	before int64
	n      int
	ch     chan deleteResult
}

type deleteResult struct {
	n   int
	err error
}

// DeleteCleanedBefore queues the deletion like any write and waits for it.
func (s *SQLite) DeleteCleanedBefore(t time.Time) (int, error) {
	op := &deleteOp{before: t.UnixNano(), ch: make(chan deleteResult, 1)}
	if !s.enqueue(op) {
		return 0, fmt.Errorf("delete cleaned: %w", ErrClosed)
	}
	r := <-op.ch
	return r.n, r.err
}

func (op *deleteOp) apply(ctx context.Context, s *SQLite) error {
	if _, err := wexec(ctx, s.w.delOutputs, int(api.StateCleaned), op.before); err != nil {
		return fmt.Errorf("delete cleaned outputs: %w", err)
	}
	n, err := wexec(ctx, s.w.delExecs, int(api.StateCleaned), op.before)
	if err != nil {
		return fmt.Errorf("delete cleaned: %w", err)
	}
	op.n = int(n)
	return nil
}

func (op *deleteOp) finish(err error) {
	if err != nil {
		op.ch <- deleteResult{err: err}
		return
	}
	op.ch <- deleteResult{n: op.n}
}
