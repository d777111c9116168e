package store

// Checkpoints out of the writer's commits. The write connection runs with
// wal_autocheckpoint(0): a COMMIT never copies the WAL into the database (a
// checkpoint with its two fsyncs, which put 20 ms tails on the commit that
// crossed the 1000-page mark). Instead a checkpointer goroutine, on a
// connection of its own, runs a PASSIVE checkpoint at most every
// checkpointEvery after the writer committed: it copies alongside the
// writer, never blocking it. A passive checkpoint may never catch up with
// a writer that never pauses (the WAL starts over only when a write begins
// with every frame copied), so the WAL is bounded: once the checkpointer
// saw it past walLimit frames, the writer itself runs a TRUNCATE checkpoint
// between two batches, as a COMMIT's auto-checkpoint did, but rarely.

import (
	"context"
	"time"
)

const (
	checkpointEvery = 100 * time.Millisecond
	walLimit        = 4000 // frames (pages): 16 MiB at the default 4 KiB page
)

// checkpointer runs until ckptStop is closed.
func (s *SQLite) checkpointer() {
	defer close(s.ckptDone)
	ctx := context.Background()
	for {
		select {
		case <-s.ckptStop:
			return
		case <-s.ckptWake:
		}
		var busy, log, done int64
		if err := s.cdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &done); err != nil {
			s.log.Warn().Err(err).Str("path", s.path).Msg("store checkpoint")
		} else {
			s.walFrames.Store(log)
		}
		select {
		case <-s.ckptStop:
			return
		case <-time.After(checkpointEvery):
		}
	}
}

// afterCommit is the writer's part, after it answered a batch: wake the
// checkpointer, or checkpoint itself when the WAL has grown past
// s.walLimit (walLimit; tests lower it). Writer goroutine only.
func (s *SQLite) afterCommit() {
	if s.walFrames.Load() < s.walLimit {
		select {
		case s.ckptWake <- struct{}{}:
		default:
		}
		return
	}
	var busy, log, done int64
	err := s.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done)
	if err != nil || busy != 0 {
		s.log.Warn().Err(err).Str("path", s.path).Int64("frames", log).Msg("store checkpoint (truncate) did not complete")
		return
	}
	s.walFrames.Store(0)
	s.forcedCheckpoints.Add(1)
}
