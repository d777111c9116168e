package store

// The writer's statements on the driver's own connection. The writer
// goroutine runs inside sql.Conn.Raw for its whole life (writer), so the
// write connection is the driver's there and nobody else's, and every
// statement of a commit, BEGIN IMMEDIATE, COMMIT and ROLLBACK included, is
// prepared once when the writer starts and executed through the driver:
// database/sql's work per statement (the connection's lock, the conversion
// of each argument, and a parse of BEGIN and COMMIT on every commit, which
// it does not prepare) is off the path between a transition's queueing and
// its answer (issue 11, (b): every state a follower is told of waits for
// its commit).

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"modernc.org/sqlite"
)

// wconn is the write connection's prepared statements. Writer goroutine
// only.
type wconn struct {
	conn                                      any             // the driver's connection the statements are on
	status                                    sqlite.DBStatus // conn's counters (checkpoint.go's count of frames written)
	begin, commit, rollback                   driver.Stmt
	insert, update, state, output, saveOutput driver.Stmt
	delOutputs, delExecs, truncate            driver.Stmt
	all                                       []driver.Stmt // to close
}

// prepareWrites prepares the writer's statements on dc, the driver's
// connection.
func prepareWrites(ctx context.Context, dc any) (*wconn, error) {
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, fmt.Errorf("prepare: driver connection %T cannot prepare with a context", dc)
	}
	ds, ok := dc.(sqlite.DBStatus)
	if !ok {
		return nil, fmt.Errorf("prepare: driver connection %T has no sqlite3_db_status", dc)
	}
	w := &wconn{conn: dc, status: ds}
	var err error
	prep := func(dst *driver.Stmt, q string) {
		if err != nil {
			return
		}
		var st driver.Stmt
		if st, err = pc.PrepareContext(ctx, q); err != nil {
			err = fmt.Errorf("prepare %q: %w", q, err)
			return
		}
		_, okx := st.(driver.StmtExecContext)
		_, okq := st.(driver.StmtQueryContext)
		if !okx || !okq {
			err = fmt.Errorf("prepare %q: driver statement %T lacks ExecContext or QueryContext", q, st)
		}
		w.all = append(w.all, st)
		*dst = st
	}
	prep(&w.begin, `BEGIN IMMEDIATE`)
	prep(&w.commit, `COMMIT`)
	prep(&w.rollback, `ROLLBACK`)
	prep(&w.insert, `INSERT INTO executions
		(id, owner_uid, state, outcome, created_at, cleaned_at, labels, argv, params, record)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`)
	prep(&w.update, `UPDATE executions SET state = ?, outcome = ?, cleaned_at = ?, record = ?
		WHERE id = ? AND state <= ?`)
	prep(&w.state, `SELECT state FROM executions WHERE id = ?`)
	prep(&w.output, `INSERT OR REPLACE INTO outputs (id, stream, head, tail, tail_offset, total)
		VALUES (?, ?, ?, ?, ?, ?)`)
	prep(&w.saveOutput, `INSERT OR REPLACE INTO outputs (id, stream, head, tail, tail_offset, total)
		SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM executions WHERE id = ?)`)
	prep(&w.delOutputs, `DELETE FROM outputs WHERE id IN
		(SELECT id FROM executions WHERE state = ? AND cleaned_at < ?)`)
	prep(&w.delExecs, `DELETE FROM executions WHERE state = ? AND cleaned_at < ?`)
	prep(&w.truncate, `PRAGMA wal_checkpoint(TRUNCATE)`)
	if err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *wconn) close() error {
	var errs []error
	for _, st := range w.all {
		errs = append(errs, st.Close())
	}
	w.all = nil
	return errors.Join(errs...)
}

// args gives a statement's arguments as the driver takes them, converted
// as database/sql converts them for a driver without a converter of its own
// (an int to int64; nil, int64, string, []byte as they are).
func args(vs []any) ([]driver.NamedValue, error) {
	nv := make([]driver.NamedValue, len(vs))
	for i, v := range vs {
		if !driver.IsValue(v) {
			c, err := driver.DefaultParameterConverter.ConvertValue(v)
			if err != nil {
				return nil, fmt.Errorf("argument %d: %w", i+1, err)
			}
			v = c
		}
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv, nil
}

// wexec runs st with vs and returns the rows it changed.
func wexec(ctx context.Context, st driver.Stmt, vs ...any) (int64, error) {
	nv, err := args(vs)
	if err != nil {
		return 0, err
	}
	res, err := st.(driver.StmtExecContext).ExecContext(ctx, nv)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// errNoRows is wquery's answer for a query that returned no row.
var errNoRows = errors.New("no rows")

// wquery runs st with vs and returns its first row's columns as the
// driver gives them (int64, float64, []byte, string or nil).
func wquery(ctx context.Context, st driver.Stmt, vs ...any) (_ []driver.Value, err error) {
	nv, err := args(vs)
	if err != nil {
		return nil, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(ctx, nv)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	dest := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errNoRows
		}
		return nil, err
	}
	return dest, nil
}

// int64s converts a row's integer columns.
func int64s(row []driver.Value, dst ...*int64) error {
	if len(row) < len(dst) {
		return fmt.Errorf("row has %d columns, want %d", len(row), len(dst))
	}
	for i, d := range dst {
		n, ok := row[i].(int64)
		if !ok {
			return fmt.Errorf("column %d is %T, want an integer", i, row[i])
		}
		*d = n
	}
	return nil
}
