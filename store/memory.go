package store

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/api"
)

// Memory is a Store kept in memory: the same semantics as the SQLite store
// (records are copied through JSON in and out, so callers never share maps
// or pointers with it), nothing survives the process. Writes are applied
// before the call returns, and the channel already holds the answer. Safe for
// concurrent use; a mutex guards everything.
type Memory struct {
	mu      sync.Mutex
	closed  bool
	entries map[string]*memEntry
}

type memEntry struct {
	record  []byte // JSON of the api.Record
	state   api.State
	created time.Time
	cleaned *time.Time
	params  []byte
	outputs map[string]KeptOutput
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{entries: make(map[string]*memEntry)}
}

func (m *Memory) Create(rec api.Record, params []byte) <-chan error {
	b, err := encodeRecord(rec)
	if err != nil {
		return done(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return done(fmt.Errorf("create %s: %w", rec.ID, ErrClosed))
	}
	if _, ok := m.entries[rec.ID]; ok {
		return done(fmt.Errorf("create %s: %w", rec.ID, ErrExists))
	}
	m.entries[rec.ID] = &memEntry{
		record:  b,
		state:   rec.State,
		created: rec.CreatedAt,
		cleaned: cleanedAt(rec, time.Now()),
		params:  bytes.Clone(params),
		outputs: make(map[string]KeptOutput),
	}
	return done[error](nil)
}

var _ Notifier = (*Memory)(nil)

// TransitionFunc is Transition answering through done, before it returns
// (see Notifier).
func (m *Memory) TransitionFunc(from api.State, rec api.Record, done func(Result), outs ...Output) {
	done(<-m.Transition(from, rec, outs...))
}

func (m *Memory) Transition(from api.State, rec api.Record, outs ...Output) <-chan Result {
	if err := checkTransition(from, rec, outs); err != nil {
		return done(Result{Err: err})
	}
	b, err := encodeRecord(rec)
	if err != nil {
		return done(Result{Err: err})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return done(Result{Err: fmt.Errorf("transition %s: %w", rec.ID, ErrClosed)})
	}
	e, ok := m.entries[rec.ID]
	if !ok {
		return done(Result{JSON: b})
	}
	if e.state > from {
		return done(Result{State: e.state, JSON: b})
	}
	e.record, e.state, e.cleaned = b, rec.State, cleanedAt(rec, time.Now())
	for _, o := range outs {
		e.outputs[o.Stream] = cloneKept(o.Kept)
	}
	return done(Result{Applied: true, State: rec.State, JSON: b})
}

func (m *Memory) SaveOutput(id string, out Output) <-chan error {
	if err := checkStream(out.Stream); err != nil {
		return done(fmt.Errorf("save output %s: %w", id, err))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return done(fmt.Errorf("save output %s: %w", id, ErrClosed))
	}
	e, ok := m.entries[id]
	if !ok {
		return done(fmt.Errorf("save output %s: %w", id, ErrNotFound))
	}
	e.outputs[out.Stream] = cloneKept(out.Kept)
	return done[error](nil)
}

func (m *Memory) Get(id string) (api.Record, bool, error) {
	m.mu.Lock()
	e, ok := m.entries[id]
	var b []byte
	if ok {
		b = e.record
	}
	m.mu.Unlock()
	if !ok {
		return api.Record{}, false, nil
	}
	rec, err := decodeRecord(b)
	if err != nil {
		return api.Record{}, false, fmt.Errorf("get %s: %w", id, err)
	}
	return rec, true, nil
}

func (m *Memory) Params(id string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return nil, false, nil
	}
	return bytes.Clone(e.params), true, nil
}

func (m *Memory) Output(id, stream string) (KeptOutput, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[id]
	if !ok {
		return KeptOutput{}, false, nil
	}
	o, ok := e.outputs[stream]
	if !ok {
		return KeptOutput{}, false, nil
	}
	return cloneKept(o), true, nil
}

// records decodes the stored records in a state keep accepts, then drops
// those match rejects; op names the caller in errors.
func (m *Memory) records(op string, keep func(api.State) bool, match func(api.Record) bool) ([]api.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var recs []api.Record
	for id, e := range m.entries {
		if !keep(e.state) {
			continue
		}
		rec, err := decodeRecord(e.record)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", op, id, err)
		}
		if match(rec) {
			recs = append(recs, rec)
		}
	}
	return recs, nil
}

func (m *Memory) List(f ListFilter) ([]api.Record, error) {
	recs, err := m.records("list",
		func(s api.State) bool { return f.State == nil || s == *f.State },
		func(rec api.Record) bool {
			return (f.OwnerUID == nil || rec.Owner.UID == *f.OwnerUID) && labelsMatch(rec.Labels, f.Labels)
		})
	if err != nil {
		return nil, err
	}
	// Newest first, ties by id descending, as the SQLite store.
	slices.SortFunc(recs, func(a, b api.Record) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if f.Limit > 0 && len(recs) > f.Limit {
		recs = recs[:f.Limit]
	}
	if recs == nil {
		recs = []api.Record{}
	}
	return recs, nil
}

func (m *Memory) Unfinished() ([]api.Record, error) {
	recs, err := m.records("unfinished",
		func(s api.State) bool { return slices.Contains(unfinishedStates, s) },
		func(api.Record) bool { return true })
	if err != nil {
		return nil, err
	}
	// Oldest first, ties by id, as the SQLite store.
	slices.SortFunc(recs, func(a, b api.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return recs, nil
}

func (m *Memory) DeleteCleanedBefore(t time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, fmt.Errorf("delete cleaned: %w", ErrClosed)
	}
	n := 0
	for id, e := range m.entries {
		if e.state == api.StateCleaned && e.cleaned != nil && e.cleaned.Before(t) {
			delete(m.entries, id)
			n++
		}
	}
	return n, nil
}

// Health is always nil: memory does not fail.
func (m *Memory) Health() error { return nil }

func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func cloneKept(k KeptOutput) KeptOutput {
	k.Head = bytes.Clone(k.Head)
	k.Tail = bytes.Clone(k.Tail)
	return k
}
