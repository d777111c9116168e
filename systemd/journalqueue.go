package systemd

// The journal writer never blocks its caller. journald reads its datagram
// socket at its own pace; once 512 entries wait there (net.unix.max_dgram_qlen)
// a send waits until it reads again, and a caller on the reactor's loop
// waited with it: with journald stopped (SIGSTOP), corrald answered nothing
// and systemd killed it for its watchdog (tests/systemd
// TestJournaldStalledDoesNotStallCorrald); under heavy load a slow journald
// slowed every log line of the loop, the handover's included.

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// journalQueueLen is how many entries wait for the journal before new ones
// are dropped (and counted): a few MiB at most.
const journalQueueLen = 8192

// queuedWriter writes to w on a goroutine of its own, in order (started by
// the first entry queued, ended once the queue is empty). Write copies p
// and returns at once; when n entries wait, the entry is dropped,
// and where the gap is, once there is room again, an entry (level warn)
// says how many were dropped.
type queuedWriter struct {
	w       io.Writer
	q       chan []byte
	pending atomic.Int64 // entries queued or being written
	mu      sync.Mutex
	dropped int  // since the last notice; guarded by mu
	running bool // the goroutine runs; guarded by mu
}

func newQueuedWriter(w io.Writer, n int) *queuedWriter {
	return &queuedWriter{w: w, q: make(chan []byte, n)}
}

func (q *queuedWriter) Write(p []byte) (int, error) {
	b := append([]byte(nil), p...)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.noticeLocked()
	if q.dropped > 0 || !q.offer(b) {
		q.dropped++
	}
	return len(p), nil
}

// noticeLocked queues the notice of the entries dropped, if any and if
// there is room. q.mu held.
func (q *queuedWriter) noticeLocked() {
	if q.dropped == 0 {
		return
	}
	notice := fmt.Sprintf(`{"level":"warn","component":"journal","dropped":%d,"message":"%d log entries dropped: the journal did not take them in time"}`+"\n", q.dropped, q.dropped)
	if q.offer([]byte(notice)) {
		q.dropped = 0
	}
}

// offer queues b unless the queue is full. q.mu held.
func (q *queuedWriter) offer(b []byte) bool {
	q.pending.Add(1)
	select {
	case q.q <- b:
		if !q.running {
			q.running = true
			go q.run()
		}
		return true
	default:
		q.pending.Add(-1)
		return false
	}
}

// run writes the queued entries until the queue is empty. Entries are
// queued under q.mu, so the queue seen empty under it stays empty until
// the next offer, which starts run again. Once the queue drained it
// queues the notice of the entries dropped itself: a daemon that logs
// nothing more after a stall still says where its gap is.
func (q *queuedWriter) run() {
	for {
		select {
		case b := <-q.q:
			_, _ = q.w.Write(b)
			q.pending.Add(-1)
			continue
		default:
		}
		q.mu.Lock()
		q.noticeLocked()
		if len(q.q) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// flush waits up to d until every entry queued before it was written (and
// the notice of those dropped, if any), and reports whether they were.
func (q *queuedWriter) flush(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		q.mu.Lock()
		q.noticeLocked()
		done := q.dropped == 0 && q.pending.Load() == 0
		q.mu.Unlock()
		if done {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var (
	journalOnce sync.Once
	journalQ    atomic.Pointer[queuedWriter]
)

// FlushJournal waits up to d until the log entries JournalWriter queued
// reached the journal's socket, and reports whether they did (true when
// nothing was queued). A process about to exit or exec calls it: the queue
// does not survive either.
func FlushJournal(d time.Duration) bool {
	q := journalQ.Load()
	if q == nil {
		return true
	}
	return q.flush(d)
}
