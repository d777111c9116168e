package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/rs/zerolog"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// FileName is the database file inside the state directory.
const FileName = "corral.db"

// Synchronous settings for Options.Synchronous.
const (
	// SyncFull fsyncs the WAL on every commit: an acknowledged write
	// survives a kill -9 of the daemon and a power loss. Group commit pays
	// one fsync per batch, not per write. The default.
	SyncFull = "FULL"
	// SyncNormal leaves the WAL to the page cache until a checkpoint: an
	// acknowledged write survives a kill -9 of the daemon, not a power loss
	// or kernel crash.
	SyncNormal = "NORMAL"
)

// Options tune Open. Zero fields mean the default.
type Options struct {
	Synchronous string        // SyncFull (default) or SyncNormal
	MaxBatch    int           // writes per transaction (group commit); default 512
	BusyTimeout time.Duration // how long a statement waits for a lock; default 5s
	ReadConns   int           // read pool size; default 4
	// SkipCheck skips PRAGMA quick_check at Open, which reads the whole
	// file (fast for the sizes retention keeps, slow for gigabytes).
	SkipCheck bool
}

// Stats counts the writer's work, for tests, benchmarks and daemon.info.
type Stats struct {
	Commits  int64 // transactions committed
	Writes   int64 // write requests committed
	Failures int64 // transactions that failed (each failed write is retried alone once)
	// Coalesced counts transitions superseded in the queue by a newer one
	// of the same record (answered at its commit, never written).
	Coalesced int64
	// ForcedCheckpoints counts the checkpoints the writer ran itself
	// because the WAL had grown past its bound (checkpoint.go).
	ForcedCheckpoints int64
}

// SQLite is the Store kept in a SQLite database in WAL mode. One writer
// goroutine owns the write connection: it takes every queued write (up to
// MaxBatch) into one transaction, commits it, then answers each write's
// channel (group commit). Reads use a separate pool of read-only connections
// and run concurrently with the writer. All methods are safe for concurrent
// use by any goroutine; the write methods never block on disk.
type SQLite struct {
	path     string
	log      zerolog.Logger
	maxBatch int

	wdb  *sql.DB   // owns conn; closed by Close
	conn *sql.Conn // the write connection; after Open only the writer goroutine's, through the driver (wconn.go)
	rdb  *sql.DB   // read pool
	cdb  *sql.DB   // the checkpointer's connection (checkpoint.go)
	lock *os.File  // flock on the state directory, held until Close

	w *wconn // the writer's statements on conn's driver connection (wconn.go); writer goroutine only

	mu      sync.Mutex // guards queue, pending and closing
	queue   []writeOp
	pending map[string]*transitionOp // the newest queued transition of each record
	closing bool
	wake    chan struct{} // capacity 1: coalesces wake-ups of the writer
	stopped chan struct{} // closed when the writer goroutine has returned

	healthMu sync.Mutex
	health   error

	commits, writes, failures, coalesced atomic.Int64

	ckptWake          chan struct{} // capacity 1
	ckptStop          chan struct{}
	ckptDone          chan struct{}
	walWritten        atomic.Int64 // frames the writer handed to the WAL since Open (checkpoint.go)
	pagesWritten      uint32       // the write connection's SQLITE_DBSTATUS_CACHE_WRITE at the last commit; writer goroutine only
	lookMu            sync.Mutex   // guards look
	look              walLook      // the last look at the WAL
	walLimit          int64        // walLimit; set before the first write
	ckptFrames        int64        // ckptFrames; set before the first write
	ckptRounds        atomic.Int64 // times the checkpointer was woken (tests)
	ckptRuns          atomic.Int64 // PASSIVE checkpoints it ran (tests)
	forcedCheckpoints atomic.Int64
}

var _ Store = (*SQLite)(nil)

// Open opens (creating if needed) the store at <dir>/corral.db with the
// default Options. See OpenOptions.
func Open(dir string, log zerolog.Logger) (*SQLite, error) {
	return OpenOptions(dir, log, Options{})
}

// OpenOptions opens (creating dir and the database if needed, mode 0700 and
// 0600) the store at <dir>/corral.db, migrates its schema to SchemaVersion
// and starts the writer goroutine. It fails when another process holds the
// directory's lock, and refuses a file that is not a SQLite database, a
// corrupt one (PRAGMA quick_check) or one with a newer schema.
func OpenOptions(dir string, log zerolog.Logger, o Options) (*SQLite, error) {
	if o.Synchronous == "" {
		o.Synchronous = SyncFull
	}
	if o.Synchronous != SyncFull && o.Synchronous != SyncNormal {
		return nil, fmt.Errorf("open store: synchronous %q: want %s or %s", o.Synchronous, SyncFull, SyncNormal)
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.ReadConns <= 0 {
		o.ReadConns = 4
	}
	path := filepath.Join(dir, FileName)
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open store %s: path must not contain '?' or '#'", path)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// Create the file ourselves so that it (and the -wal and -shm files,
	// which SQLite creates with the database's mode) is not world-readable:
	// records hold command lines and labels.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()

	s := &SQLite{
		lock:       lock,
		path:       path,
		log:        log,
		maxBatch:   o.MaxBatch,
		wake:       make(chan struct{}, 1),
		pending:    make(map[string]*transitionOp),
		ckptWake:   make(chan struct{}, 1),
		walLimit:   walLimit,
		ckptFrames: ckptFrames,
		ckptStop:   make(chan struct{}),
		ckptDone:   make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	if err := s.open(o); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := s.startWriter(); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	go s.checkpointer()
	log.Info().Str("path", path).Str("synchronous", o.Synchronous).Int("schema", SchemaVersion).Msg("store opened")
	return s, nil
}

func (s *SQLite) open(o Options) error {
	ctx := context.Background()
	busy := fmt.Sprintf("_pragma=busy_timeout(%d)", o.BusyTimeout.Milliseconds())
	var err error
	s.wdb, err = sql.Open("sqlite", s.path+"?"+busy+
		"&_pragma=journal_mode(WAL)&_pragma=synchronous("+o.Synchronous+")"+
		// Truncate a WAL grown by a burst back to 64 MiB after checkpoints.
		"&_pragma=journal_size_limit(67108864)"+
		// No checkpoint inside a COMMIT: see checkpoint.go.
		"&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		return err
	}
	s.wdb.SetMaxOpenConns(1)
	s.conn, err = s.wdb.Conn(ctx)
	if err != nil {
		return err
	}
	var mode string
	if err := s.conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	// quick_check reads every page: cheap for a database that retention
	// keeps small, and a corrupt file is found now rather than mid-run.
	if !o.SkipCheck {
		var check string
		if err := s.conn.QueryRowContext(ctx, "PRAGMA quick_check(3)").Scan(&check); err != nil {
			return fmt.Errorf("check database: %w", err)
		}
		if check != "ok" {
			check = strings.ReplaceAll(strings.TrimPrefix(check, "*** in database main ***\n"), "\n", "; ")
			return fmt.Errorf("database is corrupt: %s", check)
		}
	}
	if err := migrate(ctx, s.conn); err != nil {
		return err
	}
	s.rdb, err = sql.Open("sqlite", s.path+"?"+busy+"&_pragma=query_only(1)")
	if err != nil {
		return err
	}
	s.rdb.SetMaxOpenConns(o.ReadConns)
	s.rdb.SetMaxIdleConns(o.ReadConns)
	if err := s.rdb.PingContext(ctx); err != nil {
		return err
	}
	s.cdb, err = sql.Open("sqlite", s.path+"?"+busy)
	if err != nil {
		return err
	}
	s.cdb.SetMaxOpenConns(1)
	return s.cdb.PingContext(ctx)
}

// Path returns the database file.
func (s *SQLite) Path() string { return s.path }

// Stats returns the writer's counters.
func (s *SQLite) Stats() Stats {
	return Stats{Commits: s.commits.Load(), Writes: s.writes.Load(), Failures: s.failures.Load(), Coalesced: s.coalesced.Load(),
		ForcedCheckpoints: s.forcedCheckpoints.Load()}
}

// Health returns nil, or the last write error while no write has succeeded
// since.
func (s *SQLite) Health() error {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	return s.health
}

func (s *SQLite) setHealth(err error) {
	s.healthMu.Lock()
	prev := s.health
	s.health = err
	s.healthMu.Unlock()
	switch {
	case err != nil && prev == nil:
		s.log.Error().Err(err).Str("path", s.path).Msg("store degraded: write failed")
	case err == nil && prev != nil:
		s.log.Info().Str("path", s.path).Msg("store healthy again")
	}
}

// Close waits for queued writes, stops the writer and closes the database.
func (s *SQLite) Close() error {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	s.mu.Unlock()
	if already {
		<-s.stopped
		return nil
	}
	s.signal()
	<-s.stopped
	close(s.ckptStop)
	<-s.ckptDone
	if err := s.closeDBs(); err != nil {
		return fmt.Errorf("close store %s: %w", s.path, err)
	}
	return nil
}

func (s *SQLite) closeDBs() error {
	var errs []error
	if s.conn != nil {
		errs = append(errs, s.conn.Close())
	}
	if s.wdb != nil {
		errs = append(errs, s.wdb.Close())
	}
	if s.rdb != nil {
		errs = append(errs, s.rdb.Close())
	}
	if s.cdb != nil {
		errs = append(errs, s.cdb.Close())
	}
	if s.lock != nil {
		// Closing the fd drops the flock, after the database is closed.
		errs = append(errs, s.lock.Close())
	}
	return errors.Join(errs...)
}

// --- reads ---

func (s *SQLite) Get(id string) (api.Record, bool, error) {
	var b []byte
	err := s.rdb.QueryRow(`SELECT record FROM executions WHERE id = ?`, id).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return api.Record{}, false, nil
	}
	if err != nil {
		return api.Record{}, false, fmt.Errorf("get %s: %w", id, err)
	}
	rec, err := decodeRecord(b)
	if err != nil {
		return api.Record{}, false, fmt.Errorf("get %s: %w", id, err)
	}
	return rec, true, nil
}

func (s *SQLite) Params(id string) ([]byte, bool, error) {
	var b []byte
	err := s.rdb.QueryRow(`SELECT params FROM executions WHERE id = ?`, id).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("params %s: %w", id, err)
	}
	return b, true, nil
}

func (s *SQLite) Output(id, stream string) (KeptOutput, bool, error) {
	var k KeptOutput
	err := s.rdb.QueryRow(`SELECT head, tail, tail_offset, total FROM outputs WHERE id = ? AND stream = ?`, id, stream).
		Scan(&k.Head, &k.Tail, &k.TailOffset, &k.Total)
	if errors.Is(err, sql.ErrNoRows) {
		return KeptOutput{}, false, nil
	}
	if err != nil {
		return KeptOutput{}, false, fmt.Errorf("output %s %s: %w", id, stream, err)
	}
	return k, true, nil
}

func (s *SQLite) List(f ListFilter) ([]api.Record, error) {
	var where []string
	var args []any
	if f.OwnerUID != nil {
		where = append(where, "owner_uid = ?")
		args = append(args, int64(*f.OwnerUID))
	}
	if f.State != nil {
		where = append(where, "state = ?")
		args = append(args, int(*f.State))
	}
	for k, v := range f.Labels {
		where = append(where, "EXISTS (SELECT 1 FROM json_each(executions.labels) WHERE key = ? AND value = ?)")
		args = append(args, k, v)
	}
	q := `SELECT record FROM executions`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at DESC, id DESC"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	recs, err := s.queryRecords(q, args...)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return recs, nil
}

func (s *SQLite) Unfinished() ([]api.Record, error) {
	recs, err := s.queryRecords(`SELECT record FROM executions WHERE state IN (?, ?, ?, ?) ORDER BY created_at, id`,
		int(unfinishedStates[0]), int(unfinishedStates[1]), int(unfinishedStates[2]), int(unfinishedStates[3]))
	if err != nil {
		return nil, fmt.Errorf("unfinished: %w", err)
	}
	return recs, nil
}

func (s *SQLite) queryRecords(q string, args ...any) ([]api.Record, error) {
	rows, err := s.rdb.Query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []api.Record
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		rec, err := decodeRecord(b)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// --- column helpers ---

func encodeColumns(rec api.Record) (labels, argv string, err error) {
	l := rec.Labels
	if l == nil {
		l = map[string]string{}
	}
	lb, err := json.Marshal(l)
	if err != nil {
		return "", "", fmt.Errorf("encode labels of %s: %w", rec.ID, err)
	}
	ab, err := json.Marshal(rec.Argv)
	if err != nil {
		return "", "", fmt.Errorf("encode argv of %s: %w", rec.ID, err)
	}
	return string(lb), string(ab), nil
}

func outcomeCol(rec api.Record) any {
	if rec.Outcome == nil {
		return nil
	}
	return string(*rec.Outcome)
}

func nanos(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}
