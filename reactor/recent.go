package reactor

import (
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
)

// The final records of the executions that left memory last, for
// exec.wait. A client that starts a short command and then waits for it
// often asks after the command was cleaned and its execution dropped from
// memory (the store answers for it from then on): with 8 clients looping
// start + wait of /bin/true, the store's read of the record (a SELECT and a
// JSON decode on the request's goroutine) was 3.2% of corrald's CPU. The
// record kept here is the one the cleaned commit stored, with the store's
// JSON of it, so the answer is what the store would give (and what a
// waiter told at cleaned was sent). A cleaned record never changes; the
// store only deletes it once retention has passed since cleaned_at, so an
// entry answers only while its cleaned_at is younger than recentTTL and
// retention is at least that (or forever).

const (
	recentMax = 64          // entries kept, oldest replaced first
	recentTTL = time.Second // an entry answers this long after cleaned_at
)

// recentDone is one execution that left memory with its cleaned record
// durable.
type recentDone struct {
	rec api.Record
	js  []byte // the store's JSON of rec
}

// recentRing holds the recentDone entries by id, the ids in a ring so that
// the oldest goes first; the zero value is empty. mu guards it: the store's
// writer adds an entry the moment a cleaned record is durable (toCleaned),
// and exec.wait's goroutine reads it before it asks the loop (WaitEncoded).
type recentRing struct {
	mu   sync.Mutex
	byID map[string]recentDone
	ids  [recentMax]string
	next int
}

// remember keeps e's final record (rec, the store's JSON js) once it is
// durable. Any goroutine (the store's writer).
func (r *Reactor) remember(rec api.Record, js []byte) {
	if js == nil || rec.CleanedAt == nil || (r.cfg.Retention >= 0 && r.cfg.Retention < recentTTL) {
		return
	}
	q := &r.recent
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byID == nil {
		q.byID = make(map[string]recentDone, recentMax)
	}
	if old := q.ids[q.next]; old != "" {
		delete(q.byID, old)
	}
	q.ids[q.next] = rec.ID
	q.next = (q.next + 1) % recentMax
	q.byID[rec.ID] = recentDone{rec: rec, js: js}
}

// recentFor returns the kept final record of id for caller, if there is
// one still young enough; another uid's record is not found, as in lookup.
// Any goroutine.
func (r *Reactor) recentFor(caller api.Owner, id string) (recentDone, bool) {
	r.recent.mu.Lock()
	d, ok := r.recent.byID[id]
	r.recent.mu.Unlock()
	if !ok || (caller.UID != 0 && d.rec.Owner.UID != caller.UID) || time.Since(*d.rec.CleanedAt) >= recentTTL {
		return recentDone{}, false
	}
	return d, true
}
