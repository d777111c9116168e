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
//
// The checkpointer copies only once the WAL holds ckptFrames frames: once a
// checkpoint has copied every frame, the next write transaction starts the
// WAL over, and SQLite syncs the new WAL header in that transaction's COMMIT
// (sqlite3WalFrames, also with synchronous=NORMAL): an fsync on the writer's
// path, 1.5 ms p50 and up to 95 ms on this host's disk. Copied after every
// commit (at most every 100 ms), as it was, that was every commit after an
// idle gap: about two fsyncs per execution in bench (b) at sync normal
// (strace), and the slowest samples of (b) had their time in the exited
// commit. At ckptFrames the restart comes once per hundreds of commits.

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"time"
)

const (
	checkpointEvery = 100 * time.Millisecond
	walLimit        = 4000 // frames (pages): 16 MiB at the default 4 KiB page
	ckptFrames      = 1000 // frames before the checkpointer copies: SQLite's own wal_autocheckpoint default
)

// walIndex reads the WAL's frame count (mxFrame) and how many of those frames
// are in the database already (nBackfill) from the wal-index header, the
// first bytes of <db>-shm (https://www.sqlite.org/walformat.html, "The
// WAL-Index Header": mxFrame at byte 16 of the first header copy, nBackfill
// at byte 96, native byte order). A read racing a writer may see an older
// value; the checkpointer only uses it to decide whether to checkpoint.
func (s *SQLite) walIndex() (frames, backfilled int64, err error) {
	f, err := os.Open(s.path + "-shm")
	if err != nil {
		return 0, 0, fmt.Errorf("wal-index: %w", err)
	}
	defer f.Close()
	var hdr [100]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return 0, 0, fmt.Errorf("wal-index %s-shm: %w", s.path, err)
	}
	return int64(binary.NativeEndian.Uint32(hdr[16:])), int64(binary.NativeEndian.Uint32(hdr[96:])), nil
}

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
		frames, backfilled, err := s.walIndex()
		if err == nil {
			s.walFrames.Store(frames)
		}
		// Without a wal-index to read, checkpoint as if it were due.
		if err != nil || (frames >= s.ckptFrames && backfilled < frames) {
			var busy, log, done int64
			if err := s.cdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &done); err != nil {
				s.log.Warn().Err(err).Str("path", s.path).Msg("store checkpoint")
			} else {
				s.walFrames.Store(log)
			}
		}
		s.ckptLooks.Add(1)
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
	row, err := wquery(context.Background(), s.w.truncate)
	if err == nil {
		err = int64s(row, &busy, &log, &done)
	}
	if err != nil || busy != 0 {
		s.log.Warn().Err(err).Str("path", s.path).Int64("frames", log).Msg("store checkpoint (truncate) did not complete")
		return
	}
	s.walFrames.Store(0)
	s.forcedCheckpoints.Add(1)
}
