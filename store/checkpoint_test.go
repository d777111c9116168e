package store

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

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
