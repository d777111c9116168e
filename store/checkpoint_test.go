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
	// The bound: the limit, plus what the writer commits between the
	// checkpointer's looks (a batch holds at most 8 writes here).
	if limit := int64(4096) * (s.walLimit + 4*writers*8); maxWAL > limit {
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

// waitLook waits until the checkpointer has had a round after the one it
// was at (looks).
func waitLook(t *testing.T, s *SQLite, looks int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.ckptLooks.Load() <= looks {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpointer round within 10s (at %d)", looks)
		}
		time.Sleep(time.Millisecond)
	}
}

// Commits spaced so that the checkpointer has a round after each one, as an
// execution's are at an agent's pace: the WAL must not start over at each
// of them. A checkpoint that copies every frame makes the next write
// restart the WAL, and that write's COMMIT fsyncs the new WAL header, even
// with synchronous=NORMAL: a checkpoint after every commit put an fsync on
// about every other commit on the exit path (bench (b)'s slow samples).
func TestShortWALNotRestartedPerCommit(t *testing.T) {
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
	looks := s.ckptLooks.Load()
	if err := <-s.Create(rec, nil); err != nil {
		t.Fatal(err)
	}
	waitLook(t, s, looks)
	rec.State = api.StateRunning
	salts := map[uint64]bool{}
	const commits = 10
	for i := range commits {
		looks := s.ckptLooks.Load()
		rec.Usage.CPUUserMS = int64(i)
		from := api.StateRunning
		if i == 0 {
			from = api.StateStarted
		}
		if r := <-s.Transition(from, rec); r.Err != nil || !r.Applied {
			t.Fatalf("transition %d: %+v", i, r)
		}
		salts[walSalt(t, s)] = true
		waitLook(t, s, looks)
	}
	if len(salts) > 1 {
		t.Errorf("the WAL started over %d times in %d spaced commits (a WAL header fsync in each of those commits), want none", len(salts)-1, commits)
	}
	if frames, _, err := s.walIndex(); err != nil || frames == 0 {
		t.Errorf("wal-index: %d frames, %v; want the commits' frames", frames, err)
	}
}

// Past ckptFrames the checkpointer does copy the WAL into the database.
func TestCheckpointPastFrames(t *testing.T) {
	s := openTemp(t, t.TempDir())
	s.ckptFrames = 20
	big := strings.Repeat("x", 8<<10) // two pages of record per write
	rec := newRecord("big", 1000, 1, map[string]string{"pad": big})
	if err := <-s.Create(rec, nil); err != nil {
		t.Fatal(err)
	}
	rec.State = api.StateRunning
	for i := range 20 {
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
		frames, backfilled, err := s.walIndex()
		if err != nil {
			t.Fatal(err)
		}
		if frames >= s.ckptFrames && backfilled == frames {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WAL at %d frames, %d copied after 10s; want all copied past %d", frames, backfilled, s.ckptFrames)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
