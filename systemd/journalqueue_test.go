package systemd

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// stalledWriter is a journal that does not read until open is closed.
type stalledWriter struct {
	open chan struct{}
	mu   sync.Mutex
	got  []string
}

func (w *stalledWriter) Write(p []byte) (int, error) {
	<-w.open
	w.mu.Lock()
	w.got = append(w.got, string(bytes.TrimSpace(p)))
	w.mu.Unlock()
	return len(p), nil
}

func (w *stalledWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

// A journal that does not read holds up no Write: past the queue's length
// entries are dropped, and once it reads again it gets the queued ones in
// order, then a notice of how many were dropped, then what came after.
func TestQueuedWriterNeverBlocks(t *testing.T) {
	w := &stalledWriter{open: make(chan struct{})}
	q := newQueuedWriter(w, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20; i++ {
			fmt.Fprintf(q, `{"message":"m%d"}`+"\n", i)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a journal that does not read")
	}
	if q.flush(50 * time.Millisecond) {
		t.Error("flush reported everything written while the journal does not read")
	}
	close(w.open)
	if !q.flush(10 * time.Second) {
		t.Fatal("flush: entries still queued 10 s after the journal reads again")
	}
	fmt.Fprintf(q, `{"message":"after"}`+"\n")
	if !q.flush(10 * time.Second) {
		t.Fatal("flush: the entry after the stall still queued after 10 s")
	}
	// Walk the journal: every entry kept in order, and each gap (the
	// entries dropped) reported by a notice where it is, with its count.
	got := w.lines()
	next, kept := 0, 0
	for i, line := range got {
		var k, n int
		switch {
		case i == len(got)-1:
			if line != `{"message":"after"}` {
				t.Errorf("last entry = %s, want the one written after the stall", line)
			}
			if next != 20 {
				t.Errorf("entries kept and reported dropped before the last: %d, want 20 (%q)", next, got)
			}
		case strings.HasPrefix(line, `{"message":"m`):
			fmt.Sscanf(line, `{"message":"m%d"}`, &k)
			if k != next {
				t.Errorf("entry %d = %s, want m%d: a gap without a notice, or out of order (%q)", i, line, next, got)
			}
			next, kept = k+1, kept+1
		case strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "log entries dropped"):
			if _, err := fmt.Sscanf(line[strings.Index(line, `"dropped":`):], `"dropped":%d,`, &n); err != nil || n <= 0 {
				t.Errorf("notice %s: no count of entries dropped", line)
			}
			next += n
		default:
			t.Errorf("entry %d = %s: unexpected", i, line)
		}
	}
	// The queue holds 4, the goroutine may have taken one more.
	if kept < 4 || kept > 5 {
		t.Errorf("%d entries kept, want 4 or 5 (%q)", kept, got)
	}
}

// The notice of a gap does not wait for the next entry: a daemon that
// logs nothing more once the journal reads again (tests/systemd
// TestJournaldStalledDoesNotStallCorrald at 22f38c2, in CI) still gets it
// into the journal, after the entries queued before the gap.
func TestQueuedWriterNoticeNeedsNoFurtherEntry(t *testing.T) {
	w := &stalledWriter{open: make(chan struct{})}
	q := newQueuedWriter(w, 4)
	for i := 0; i < 20; i++ {
		fmt.Fprintf(q, `{"message":"m%d"}`+"\n", i)
	}
	close(w.open)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := w.lines()
		if n := len(got); n > 0 && strings.Contains(got[n-1], "log entries dropped") {
			// Every entry is either in the journal or counted by a notice.
			kept, dropped := 0, 0
			for _, line := range got {
				var k int
				if _, err := fmt.Sscanf(line, `{"level":"warn","component":"journal","dropped":%d`, &k); err == nil {
					dropped += k
				} else if strings.HasPrefix(line, `{"message":"m`) {
					kept++
				}
			}
			if kept+dropped != 20 || kept == 0 {
				t.Errorf("%d entries kept and %d reported dropped, want 20 in all: %q", kept, dropped, got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no notice of the dropped entries 10 s after the journal reads again, with nothing more written: %q", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
