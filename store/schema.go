package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migrations are the schema changes in order; migrations[i] brings the
// schema to version i+1. Append only: a released migration never changes.
var migrations = []string{
	// v1. executions holds one row per execution: the full api.Record as JSON
	// in record (the source of truth), plus the columns the queries filter
	// on. Times are unix nanoseconds. Ids are unique across owners.
	// outputs holds the kept output of finished executions, one row per
	// stream, deleted with its execution.
	`CREATE TABLE executions (
		id         TEXT    NOT NULL PRIMARY KEY,
		owner_uid  INTEGER NOT NULL,
		state      INTEGER NOT NULL,
		outcome    TEXT,
		created_at INTEGER NOT NULL,
		cleaned_at INTEGER,
		labels     TEXT    NOT NULL DEFAULT '{}',
		argv       TEXT    NOT NULL DEFAULT '[]',
		params     BLOB,
		record     TEXT    NOT NULL
	);
	CREATE INDEX executions_state ON executions (state);
	CREATE INDEX executions_owner_created ON executions (owner_uid, created_at);
	CREATE INDEX executions_created ON executions (created_at);
	CREATE INDEX executions_cleaned ON executions (cleaned_at) WHERE cleaned_at IS NOT NULL;
	CREATE TABLE outputs (
		id          TEXT    NOT NULL,
		stream      TEXT    NOT NULL,
		head        BLOB,
		tail        BLOB,
		tail_offset INTEGER NOT NULL,
		total       INTEGER NOT NULL,
		PRIMARY KEY (id, stream)
	);`,
}

// SchemaVersion is the schema version this package writes.
var SchemaVersion = len(migrations)

// migrate brings the database on conn to SchemaVersion, one transaction per
// migration. A database newer than this package is refused rather than
// written to with assumptions that may no longer hold.
func migrate(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_version: %w", err)
	}
	var cur int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&cur); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if cur > SchemaVersion {
		return fmt.Errorf("schema version %d is newer than this corrald supports (%d)", cur, SchemaVersion)
	}
	for v := cur + 1; v <= SchemaVersion; v++ {
		if err := applyMigration(ctx, conn, v); err != nil {
			return err
		}
	}
	return nil
}

func applyMigration(ctx context.Context, conn *sql.Conn, v int) (err error) {
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("migrate to v%d: begin: %w", v, err)
	}
	defer func() {
		if err != nil {
			_, _ = conn.ExecContext(ctx, "ROLLBACK")
		}
	}()
	if _, err := conn.ExecContext(ctx, migrations[v-1]); err != nil {
		return fmt.Errorf("migrate to v%d: %w", v, err)
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO schema_version (version, applied_at) VALUES (?, ?)`, v, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("migrate to v%d: record version: %w", v, err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("migrate to v%d: commit: %w", v, err)
	}
	return nil
}
