package reactor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testenv"
)

// heldBackend is the pgroup backend declaring PlaceHeld, as systemd does:
// the reactor must then hold each child until Started returned, and it
// alone releases it. Started checks the hold: the command (touch marker)
// must not have run yet, however long placing takes.
type heldBackend struct {
	scope.Backend
	marker   string
	fail     bool        // Started fails: the child must never run
	ranEarly atomic.Bool // the command ran before Started returned
	started  atomic.Int32
}

func (b *heldBackend) Name() string               { return "held-test" }
func (b *heldBackend) Placement() scope.Placement { return scope.PlaceHeld }

func (b *heldBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &heldScope{Scope: sc, b: b}, nil
}

type heldScope struct {
	scope.Scope
	b *heldBackend
}

func (s *heldScope) Started(ctx context.Context, pid int) error {
	s.b.started.Add(1)
	// Placing takes a while (a D-Bus round trip under systemd): a child
	// that is not held would run its command meanwhile.
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(s.b.marker); err == nil {
		s.b.ranEarly.Store(true)
	}
	if s.b.fail {
		return errors.New("placing refused (test)")
	}
	return s.Scope.Started(ctx, pid)
}

func TestHeldChildRunsOnlyOncePlaced(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "placed", true: "placing fails"}[fail]
		t.Run(name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			b := &heldBackend{Backend: scope.NewPgroup(), marker: marker, fail: fail}
			tr := newTestReactor(t, func(c *Config) { c.Backend = b })
			rec := tr.run(api.StartParams{Argv: []string{"touch", marker}})
			if b.started.Load() != 1 {
				t.Fatalf("Started called %d times, want 1", b.started.Load())
			}
			if b.ranEarly.Load() {
				t.Error("the command ran before Started returned: the child was not held")
			}
			_, err := os.Stat(marker)
			if !fail {
				if outcome(rec) != api.OutcomeExited || err != nil {
					t.Errorf("outcome %v, marker %v; want exited and the marker made once released", outcome(rec), err)
				}
				return
			}
			if outcome(rec) != api.OutcomeStartFailed || rec.Error == nil || !strings.Contains(*rec.Error, "place in scope") {
				t.Errorf("outcome %v, error %v; want start_failed saying it could not be placed", outcome(rec), rec.Error)
			}
			if err == nil {
				t.Error("the command ran although placing it failed: the hold was released, not aborted")
			}
		})
	}
}

// TestStartByVanishedClientStillEnds: a client that closes its connection
// with exec.start in flight (its request context ends at once) must not
// leave an execution registered in state started that nothing spawns or
// ends; found by the failure drills (tests/drill, "vanish"). Whatever Start
// answers, the execution either does not exist or runs to cleaned.
func TestStartByVanishedClientStillEnds(t *testing.T) {
	tr := newTestReactor(t, nil)
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		id := "vanished-" + string(rune('a'+i))
		_, _ = tr.Start(ctx, root, api.StartParams{ID: id, Argv: []string{"true"}})
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, err := tr.Wait(wctx, root, api.WaitParams{ID: id})
		wcancel()
		if api.ErrorCode(err) == api.CodeNotFound {
			continue
		}
		if err != nil || rec.State != api.StateCleaned {
			t.Fatalf("execution %s of a vanished client: state %v, %v; want cleaned or not found", id, rec.State, err)
		}
	}
	info, err := tr.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Running != 0 {
		t.Errorf("daemon.info running = %d after every execution ended, want 0", info.Running)
	}
}

// TestStartOutOfFDsRefusedWithOverCapacity: with the daemon out of file
// descriptors (a low RLIMIT_NOFILE), exec.start must be refused with
// -32003 and record nothing, not store a record and fail to spawn it
// (outcome start_failed); found by tests/drill (emfile).
func TestStartOutOfFDsRefusedWithOverCapacity(t *testing.T) {
	tr := newTestReactor(t, nil)
	// A few fds left, fewer than an execution needs.
	restore, err := testenv.LowerFDLimit(4)
	if err != nil {
		t.Fatal(err)
	}
	_, serr := tr.Start(context.Background(), root, api.StartParams{ID: "out-of-fds", Argv: []string{"true"}})
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if api.ErrorCode(serr) != api.CodeOverCapacity {
		t.Fatalf("exec.start out of fds = %v, want -32003", serr)
	}
	if _, err := tr.Get(context.Background(), root, api.IDParams{ID: "out-of-fds"}); api.ErrorCode(err) != api.CodeNotFound {
		t.Errorf("exec.get of the refused start = %v, want -32001: nothing may be recorded", err)
	}
	// And once fds are back, starts work again.
	if rec := tr.run(api.StartParams{Argv: []string{"true"}}); outcome(rec) != api.OutcomeExited {
		t.Errorf("after fds came back: outcome %s, want exited", outcome(rec))
	}
}

// exitedOutputStore records the kept output each exited transition carried.
type exitedOutputStore struct {
	store.Store
	mu  sync.Mutex
	out map[string]map[string][]byte // id -> stream -> head+tail
}

func (s *exitedOutputStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	if rec.State == api.StateExited {
		s.mu.Lock()
		m := make(map[string][]byte)
		for _, o := range outs {
			m[o.Stream] = append(append([]byte(nil), o.Kept.Head...), o.Kept.Tail...)
		}
		s.out[rec.ID] = m
		s.mu.Unlock()
	}
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestExitedRecordCarriesKeptOutput: without an output spool, the exited
// record (with its outcome) must be stored with the kept output read so
// far; otherwise a crash between exited and cleaned leaves a record that
// says exited 0 with none of its output (found by tests/drill, kill-9:
// exec.output answered total_bytes 0 for a child that wrote 348,894).
func TestExitedRecordCarriesKeptOutput(t *testing.T) {
	writeExitsAtOnce(t) // the exited record written, not held for cleaned
	st := &exitedOutputStore{Store: store.NewMemory(), out: make(map[string]map[string][]byte)}
	tr := newTestReactor(t, func(c *Config) { c.Store = st })
	rec := tr.run(api.StartParams{Argv: []string{"sh", "-c", "echo out; echo err >&2"}})
	st.mu.Lock()
	got := st.out[rec.ID]
	st.mu.Unlock()
	if string(got[store.Stdout]) != "out\n" || string(got[store.Stderr]) != "err\n" {
		t.Errorf("kept output stored with the exited record = %q, want stdout %q and stderr %q", got, "out\n", "err\n")
	}
}
