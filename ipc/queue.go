package ipc

import "sync"

// outItem is one encoded message ('\n' included) waiting for the writer.
type outItem struct {
	b    []byte
	note bool // a notification: counted against the drop budget
}

// outQueue is a connection's ordered outgoing queue. Responses are never
// dropped; notifications are dropped when the queue already holds
// maxNotes notifications or maxNoteBytes bytes of them.
//
// Ownership: any goroutine pushes; only the connection's writer goroutine
// pops; the reader goroutine waits in waitRoom. All state is under mu.
//
// With direct set, a push onto an empty queue while the writer is idle
// writes the message at once, on the pushing goroutine, under mu, in one
// non-blocking attempt: an answer or a notification then reaches the
// socket without waking the writer goroutine (one hand-off fewer on the way
// to the client). What the socket does not take is queued for the writer,
// so order is kept: nothing is written directly while anything is queued or
// being written.
type outQueue struct {
	mu   sync.Mutex
	cond sync.Cond // signalled on every push, pop, seal and close
	// direct writes as much of b as the socket takes now, never blocking,
	// and returns how much it wrote (nil: always queue).
	direct       func(b []byte) int
	writing      bool // the writer is writing an item it popped
	items        []outItem
	responses    int // queued responses
	notes        int // queued notifications
	noteBytes    int
	maxNotes     int
	maxNoteBytes int
	sealed       bool // no more pushes; the writer stops once empty
	closed       bool // discard everything; the writer stops now
	dropped      uint64
}

func newOutQueue(maxNotes, maxNoteBytes int) *outQueue {
	q := &outQueue{maxNotes: maxNotes, maxNoteBytes: maxNoteBytes}
	q.cond.L = &q.mu
	return q
}

// pushResponse queues a response. It never blocks and never drops, except
// after seal or close (the connection is going away).
func (q *outQueue) pushResponse(b []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.sealed || q.closed {
		return false
	}
	if b = q.writeNow(b); len(b) == 0 {
		return true
	}
	q.items = append(q.items, outItem{b: b})
	q.responses++
	q.cond.Broadcast()
	return true
}

// writeNow writes b directly when nothing is queued or being written, and
// returns what is left to queue (all of b when it did not write). mu held.
func (q *outQueue) writeNow(b []byte) []byte {
	if q.direct == nil || q.writing || len(q.items) > 0 {
		return b
	}
	n := q.direct(b)
	return b[n:]
}

// noteRoom reports whether a notification might fit; it lets callers skip
// encoding one that would be dropped anyway.
func (q *outQueue) noteRoom() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.sealed && !q.closed && q.notes < q.maxNotes && q.noteBytes < q.maxNoteBytes
}

// pushNote queues a notification unless the budget is used up; it never
// blocks.
func (q *outQueue) pushNote(b []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.sealed || q.closed || q.notes >= q.maxNotes || q.noteBytes+len(b) > q.maxNoteBytes {
		q.dropped++
		return false
	}
	if b = q.writeNow(b); len(b) == 0 {
		return true
	}
	q.items = append(q.items, outItem{b: b, note: true})
	q.notes++
	q.noteBytes += len(b)
	q.cond.Broadcast()
	return true
}

// pop returns the next item, blocking until there is one; the writer calls
// written once it has written it. ok is false when the writer should stop:
// the queue was closed, or sealed and is empty.
func (q *outQueue) pop() (it outItem, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed && !q.sealed {
		q.cond.Wait()
	}
	if q.closed || len(q.items) == 0 {
		return outItem{}, false
	}
	it = q.items[0]
	q.items[0] = outItem{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	if it.note {
		q.notes--
		q.noteBytes -= len(it.b)
	} else {
		q.responses--
	}
	q.writing = true
	q.cond.Broadcast()
	return it, true
}

// written says the item pop returned is written (or failed): pushes may
// write directly again.
func (q *outQueue) written() {
	q.mu.Lock()
	q.writing = false
	q.mu.Unlock()
}

// waitRoom blocks while max or more responses are queued, so that a client
// that sends requests but does not read responses stops being read. It
// reports false when the queue was closed.
func (q *outQueue) waitRoom(max int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.responses >= max && !q.closed {
		q.cond.Wait()
	}
	return !q.closed
}

// seal refuses further pushes; the writer sends what is queued and stops.
func (q *outQueue) seal() {
	q.mu.Lock()
	q.sealed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// close discards everything queued and refuses further pushes.
func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.items = nil
	q.responses, q.notes, q.noteBytes = 0, 0, 0
	q.cond.Broadcast()
	q.mu.Unlock()
}

// countDrop records a notification dropped before it was encoded.
func (q *outQueue) countDrop() {
	q.mu.Lock()
	q.dropped++
	q.mu.Unlock()
}

// droppedNotes returns how many notifications were dropped so far.
func (q *outQueue) droppedNotes() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}
