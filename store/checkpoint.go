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

	"modernc.org/sqlite"
)

const (
	checkpointEvery = 100 * time.Millisecond
	walLimit        = 4000 // frames (pages): 16 MiB at the default 4 KiB page
	ckptFrames      = 1000 // uncopied frames before the checkpointer copies: SQLite's own wal_autocheckpoint default
)

// walIndex reads the WAL's frame count (mxFrame) and how many of those frames
// are in the database already (nBackfill) from the wal-index header, the
// first bytes of <db>-shm (https://www.sqlite.org/walformat.html, "The
// WAL-Index Header": mxFrame at byte 16 of the first header copy, nBackfill
// at byte 96, native byte order). A read racing a writer may see an older
// value. Read once at Open (a WAL left by an earlier process), and by tests.
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

// walLook is what the last look at the WAL found: its frames, how many of
// them were copied into the database, and walWritten when the look began
// (every frame written before then is in frames).
type walLook struct {
	frames, copied, at int64
}

// setLook records l unless a newer look (a later at) is recorded already.
func (s *SQLite) setLook(l walLook) {
	s.lookMu.Lock()
	if l.at >= s.look.at {
		s.look = l
	}
	s.lookMu.Unlock()
}

// walEstimate returns the WAL's length and its uncopied frames, from the
// last look and the frames written since. A WAL whose frames the look
// found all copied is taken to have started over at the next write, as
// SQLite does unless a reader still holds a snapshot from before the copy
// (then the WAL goes on growing from its end, longer than this says, until
// the next look, due after ckptFrames more frames, finds its length).
// Taking it to keep its old frames instead doubled the writer's forced
// TRUNCATEs in BenchmarkLifecycle (27-30 for the old checkpointer's 14-15).
func (s *SQLite) walEstimate() (length, uncopied int64) {
	s.lookMu.Lock()
	l := s.look
	s.lookMu.Unlock()
	since := max(s.walWritten.Load()-l.at, 0)
	if l.copied >= l.frames {
		return since, since
	}
	return l.frames + since, l.frames - l.copied + since
}

// countFrames adds the frames the write connection handed to the WAL since
// the last call to walWritten. Writer goroutine only (the driver's
// connection is the writer's, wconn.go).
func (s *SQLite) countFrames() {
	cur, _, err := s.w.status.Status(sqlite.DBStatusCacheWrite, false)
	if err != nil { // only for an op SQLite does not know
		s.log.Warn().Err(err).Str("path", s.path).Msg("store: count the frames written")
		return
	}
	// A C int that wraps after 2^31 pages: the difference mod 2^32.
	s.walWritten.Add(int64(uint32(int32(cur)) - s.pagesWritten))
	s.pagesWritten = uint32(int32(cur))
}

// startCount sets where countFrames counts from, and the first look: the
// WAL an earlier process left, as the wal-index says. Writer goroutine,
// before its first commit.
func (s *SQLite) startCount() {
	if cur, _, err := s.w.status.Status(sqlite.DBStatusCacheWrite, false); err == nil {
		s.pagesWritten = uint32(int32(cur))
	}
	frames, copied, err := s.walIndex()
	if err != nil {
		s.log.Warn().Err(err).Str("path", s.path).Msg("store: read the WAL's length (taken as empty until the first checkpoint)")
		return
	}
	s.setLook(walLook{frames: frames, copied: copied})
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
		s.ckptRounds.Add(1)
		// A wake sent before the last round's look was recorded may be
		// stale: copying less than ckptFrames would make the next commit
		// start the WAL over (and sync its header) for nothing.
		if _, uncopied := s.walEstimate(); uncopied < s.ckptFrames {
			continue
		}
		at := s.walWritten.Load()
		var busy, log, done int64
		if err := s.cdb.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &done); err != nil {
			// The writer wakes the checkpointer again after its next
			// commit, still due; past walLimit it checkpoints itself.
			s.log.Warn().Err(err).Str("path", s.path).Msg("store checkpoint")
		} else if log >= 0 && done >= 0 { // -1, -1: the checkpoint did not start (busy)
			s.setLook(walLook{frames: log, copied: done, at: at})
			s.ckptRuns.Add(1)
		}
		select {
		case <-s.ckptStop:
			return
		case <-time.After(checkpointEvery):
		}
	}
}

// afterCommit is the writer's part, after it answered a batch: count the
// frames the batch wrote, wake the checkpointer when ckptFrames of them
// are uncopied, or checkpoint itself when the WAL has grown past s.walLimit
// (walLimit; tests lower it). Writer goroutine only.
func (s *SQLite) afterCommit() {
	s.countFrames()
	length, uncopied := s.walEstimate()
	if length < s.walLimit {
		if uncopied >= s.ckptFrames {
			select {
			case s.ckptWake <- struct{}{}:
			default:
			}
		}
		return
	}
	at := s.walWritten.Load()
	var busy, log, done int64
	row, err := wquery(context.Background(), s.w.truncate)
	if err == nil {
		err = int64s(row, &busy, &log, &done)
	}
	if err != nil || busy != 0 {
		s.log.Warn().Err(err).Str("path", s.path).Int64("frames", log).Msg("store checkpoint (truncate) did not complete")
		return
	}
	s.setLook(walLook{at: at})
	s.forcedCheckpoints.Add(1)
}
