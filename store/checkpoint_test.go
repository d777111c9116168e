package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// A writer that never pauses still keeps the WAL bounded: past the limit
// the writer checkpoints itself, so the file does not grow with the writes.
func TestWALBoundedUnderBusyWriter(t *testing.T) {
	s := openTemp(t, t.TempDir())
	s.walLimit = 200 // frames
	const writers, each = 8, 150
	big := strings.Repeat("x", 8<<10) // two pages of record per write
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rec := newRecord(fmt.Sprintf("w%d", w), 1000, w, map[string]string{"pad": big})
			if err := <-s.Create(rec, nil); err != nil {
				t.Error(err)
				return
			}
			rec.State = api.StateRunning
			for i := range each {
				rec.Usage.CPUUserMS = int64(i)
				from := api.StateRunning
				if i == 0 {
					from = api.StateStarted
				}
				if r := <-s.Transition(from, rec); r.Err != nil || !r.Applied {
					t.Errorf("transition %d: %+v", i, r)
					return
				}
			}
		})
	}
	var maxWAL int64
	stop := make(chan struct{})
	var mw sync.WaitGroup
	mw.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if fi, err := os.Stat(s.Path() + "-wal"); err == nil {
				maxWAL = max(maxWAL, fi.Size())
			}
		}
	})
	wg.Wait()
	close(stop)
	mw.Wait()
	written := int64(writers * each * len(big))
	st := s.Stats()
	t.Logf("%d writes in %d commits, %d forced checkpoints; WAL at most %d KiB for %d KiB of records",
		st.Writes, st.Commits, st.ForcedCheckpoints, maxWAL>>10, written>>10)
	// The bound: the limit, plus the batch that crossed it (at most 8
	// writes of 2 record pages, their leaf and index pages here).
	if limit := int64(4096) * (s.walLimit + 8*writers); maxWAL > limit {
		t.Errorf("WAL grew to %d KiB, want at most %d KiB", maxWAL>>10, limit>>10)
	}
}

// walSalt is the salt in the WAL file's header (bytes 16-23): SQLite draws
// a new one each time the WAL starts over from its first frame, the write
// whose COMMIT syncs the new header.
func walSalt(t *testing.T, s *SQLite) uint64 {
	t.Helper()
	f, err := os.Open(s.Path() + "-wal")
	if err != nil {
		t.Fatalf("open the WAL: %v", err)
	}
	defer f.Close()
	var hdr [24]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatalf("read the WAL header: %v", err)
	}
	return binary.BigEndian.Uint64(hdr[16:])
}

// Commits spaced so that a checkpointer woken after each commit would have
// a round after each one, as an execution's commits are at an agent's
// pace: below ckptFrames uncopied frames the checkpointer is not woken at
// all (it used to be after every commit, and read <db>-shm right as the
// commit's answer went out), and the WAL does not start over. A
// checkpoint that copies every frame makes the next write restart the WAL,
// and that write's COMMIT fsyncs the new WAL header, even with
// synchronous=NORMAL: a checkpoint after every commit put an fsync on about
// every other commit on the exit path (bench (b)'s slow samples).
func TestNoCheckpointPerCommit(t *testing.T) {
	s, err := OpenOptions(t.TempDir(), testLogger(t), Options{Synchronous: SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	rec := newRecord("spaced", 1000, 1, nil)
	if err := <-s.Create(rec, nil); err != nil {
		t.Fatal(err)
	}
	salt := walSalt(t, s)
	rec.State = api.StateRunning
	const commits = 5
	for i := range commits {
		time.Sleep(2 * checkpointEvery)
		rec.Usage.CPUUserMS = int64(i)
		from := api.StateRunning
		if i == 0 {
			from = api.StateStarted
		}
		if r := <-s.Transition(from, rec); r.Err != nil || !r.Applied {
			t.Fatalf("transition %d: %+v", i, r)
		}
	}
	time.Sleep(2 * checkpointEvery)
	if got := walSalt(t, s); got != salt {
		t.Errorf("the WAL started over in %d spaced commits (a WAL header fsync in that commit), want not", commits)
	}
	if n := s.ckptRounds.Load(); n != 0 {
		t.Errorf("the checkpointer was woken %d times in %d commits below %d frames, want never", n, commits+1, s.ckptFrames)
	}
	if frames, copied, err := s.walIndex(); err != nil || frames == 0 || copied != 0 {
		t.Errorf("wal-index: %d frames, %d copied, %v; want the commits' frames, none copied", frames, copied, err)
	}
}

// Once ckptFrames frames are uncopied the checkpointer copies the WAL into
// the database, once, not again after the commits stopped.
func TestCheckpointOncePastFrames(t *testing.T) {
	s := openTemp(t, t.TempDir())
	s.ckptFrames = 30
	big := strings.Repeat("x", 8<<10) // two pages of record per write
	rec := newRecord("big", 1000, 1, map[string]string{"pad": big})
	if err := <-s.Create(rec, nil); err != nil {
		t.Fatal(err)
	}
	rec.State = api.StateRunning
	for i := 0; ; i++ {
		frames, copied, err := s.walIndex()
		if err != nil {
			t.Fatal(err)
		}
		if frames-copied >= s.ckptFrames {
			break
		}
		if i > 100 {
			t.Fatalf("WAL at %d frames, %d copied after %d commits", frames, copied, i)
		}
		rec.Usage.CPUUserMS = int64(i)
		from := api.StateRunning
		if i == 0 {
			from = api.StateStarted
		}
		if r := <-s.Transition(from, rec); r.Err != nil || !r.Applied {
			t.Fatalf("transition %d: %+v", i, r)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		frames, copied, err := s.walIndex()
		if err != nil {
			t.Fatal(err)
		}
		if copied == frames {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("WAL at %d frames, %d copied after 10s; want all copied past %d", frames, copied, s.ckptFrames)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(3 * checkpointEvery) // room for a second round, were one coming
	if n := s.ckptRuns.Load(); n != 1 {
		t.Errorf("%d checkpoints for one crossing of %d frames, want 1", n, s.ckptFrames)
	}
}
