package reactor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/tests/testd"
	"github.com/corral-dev/corral/tests/testenv"
)

// faultyBackend wraps a real backend. While killFault (removeFault) is
// set, or for the first killFails (removeFails) calls, its scopes' Kill
// (Remove) fail as the cgroup backend's do when corrald is out of file
// descriptors: opening cgroup.kill (or listing the cgroup) answers EMFILE,
// and nothing is sent or removed. The first realFails Kills instead run
// the backend's own Kill with the process at its fd limit (the drill's
// fault, for a moment), and keep what it returned in realErr. It counts
// the calls and keeps when a Kill first got through.
type faultyBackend struct {
	scope.Backend
	killFault, removeFault atomic.Bool
	killFails, removeFails atomic.Int32
	realFails              atomic.Int32
	realErr                atomic.Value // error

	kills, removes atomic.Int32
	mu             sync.Mutex
	killedAt       time.Time // first Kill that reached the tree
	inKill         int       // Kill calls under way
}

func (b *faultyBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &faultyScope{Scope: sc, b: b}, nil
}

type faultyScope struct {
	scope.Scope
	b *faultyBackend
}

func emfile(op, path string) error {
	return fmt.Errorf("test fault: %w", &os.PathError{Op: op, Path: path, Err: unix.EMFILE})
}

func (s *faultyScope) Kill() error {
	s.b.kills.Add(1)
	s.b.mu.Lock()
	s.b.inKill++
	s.b.mu.Unlock()
	defer func() {
		s.b.mu.Lock()
		s.b.inKill--
		s.b.mu.Unlock()
	}()
	if s.b.killFault.Load() || s.b.killFails.Add(-1) >= 0 {
		return emfile("open", filepath.Join(s.Name(), "cgroup.kill"))
	}
	// When the kill that gets through was sent: taken before it, since the
	// tree it kills may be gone, and cleaned recorded, before Kill returns.
	at := time.Now()
	if s.b.realFails.Add(-1) >= 0 {
		err := atFDLimit(s.Scope.Kill)
		s.b.realErr.Store(fmt.Errorf("kill at the fd limit: %w", err))
		if err != nil {
			return err
		}
	} else if err := s.Scope.Kill(); err != nil {
		return err
	}
	s.b.mu.Lock()
	if s.b.killedAt.IsZero() {
		s.b.killedAt = at
	}
	s.b.mu.Unlock()
	return nil
}

// atFDLimit runs f with the soft RLIMIT_NOFILE of the process lowered to
// its lowest free fd, so that no file can be opened meanwhile (every
// goroutine's open fails alike, as in corrald under the drill's fault).
func atFDLimit(f func() error) error {
	restore, err := testenv.LowerFDLimit(0)
	if err != nil {
		return err
	}
	defer func() {
		if err := restore(); err != nil {
			panic(err)
		}
	}()
	return f()
}

func (s *faultyScope) Remove() error {
	s.b.removes.Add(1)
	if s.b.removeFault.Load() || s.b.removeFails.Add(-1) >= 0 {
		return emfile("open", s.Name())
	}
	return s.Scope.Remove()
}

// WatchEmpty keeps the wrapped scope's cgroup.events watch, where it has one.
func (s *faultyScope) WatchEmpty() (scope.EmptyWatch, error) {
	if n, ok := s.Scope.(scope.EmptyNotifier); ok {
		return n.WatchEmpty()
	}
	return nil, fmt.Errorf("scope %s: no empty notification", s.Name())
}

// firstKill is when the first Kill that reached the tree was sent, once no
// Kill is under way: the tree a kill ends may be gone, and its execution
// cleaned, before that Kill returns and says it got through.
func (b *faultyBackend) firstKill() time.Time {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		at, busy := b.killedAt, b.inKill > 0
		b.mu.Unlock()
		if !busy || time.Now().After(deadline) {
			return at
		}
	}
}

// cleanupBackends are the backends the retry tests run on: the process
// group one, and the cgroup one (where the drill found the leak) with a
// strict base that fails the test on any cgroup or process left in it.
func cleanupBackends(t *testing.T) map[string]func(t *testing.T) (scope.Backend, string) {
	return map[string]func(t *testing.T) (scope.Backend, string){
		"pgroup": func(t *testing.T) (scope.Backend, string) { return scope.NewPgroup(), "" },
		"cgroup": strictCgroupBackend,
	}
}

// faultyReactor is a test reactor on newBackend's backend wrapped in a
// faultyBackend, with mod (if not nil) applied to its Config after the
// backend is set. arm sets the faults before the reactor starts, so its
// first call already meets them. It returns the reactor, the faulty
// backend and the backend's base (as newBackend gave it).
func faultyReactor(t *testing.T, newBackend func(*testing.T) (scope.Backend, string), arm func(*faultyBackend), mod func(*Config)) (*testReactor, *faultyBackend, string) {
	t.Helper()
	be, base := newBackend(t)
	b := &faultyBackend{Backend: be}
	arm(b)
	tr := newTestReactor(t, func(c *Config) {
		c.Backend = b
		if mod != nil {
			mod(c)
		}
	})
	return tr, b, base
}

// strictCgroupBackend is a cgroup backend under a strict base (the test
// fails on any cgroup or process left in it), closed by the test's
// cleanup, and that base.
func strictCgroupBackend(t *testing.T) (scope.Backend, string) {
	t.Helper()
	mount := testd.Cgroup2Mount()
	if mount == "" {
		testenv.Skip(t, "no cgroup2 hierarchy")
	}
	base := testd.StrictCgroupBase(t, mount, "corral-reactor")
	be, err := scope.NewCgroup(scope.CgroupOptions{Base: base})
	if err != nil {
		t.Fatalf("cgroup backend: %v", err)
	}
	t.Cleanup(func() { be.Close() })
	return be, base
}

// backgroundSleep is a tree whose main process exits at once and leaves a
// child in the scope, as the drill's "sleep 30 & sleep 30" does once its
// main process is SIGKILLed: only the scope's kill reaches that child.
var backgroundSleep = []string{"/bin/sh", "-c", "sleep 1000 >/dev/null 2>&1 </dev/null & echo $!"}

// bgPid reads backgroundSleep's child pid from rec's output and makes sure
// the test does not leak it, whatever the reactor did.
func (tr *testReactor) bgPid(rec api.Record) int {
	tr.t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(tr.stdout(rec.ID)))
	if err != nil {
		tr.t.Fatalf("stdout %q: no pid", tr.stdout(rec.ID))
	}
	tr.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// TestCleanupRetriesFailedKill: the tree kill at cleanup fails with EMFILE
// (tests/drill, emfile: a cgroup with a live "sleep 30" was left behind and
// its execution recorded cleaned). Failing once, and failing for longer
// than --kill-wait (the drill's 20s fault against 5s), the kill must be
// retried while the scope is populated, and cleaned must come only after a
// kill got through: the background child dead, the scope removed, no error
// in the record.
func TestCleanupRetriesFailedKill(t *testing.T) {
	testenv.CheckFDs(t)
	for name, newBackend := range cleanupBackends(t) {
		t.Run(name, func(t *testing.T) {
			t.Run("once", func(t *testing.T) {
				tr, b, base := faultyReactor(t, newBackend, func(b *faultyBackend) { b.killFails.Store(1) }, nil)
				rec := tr.run(api.StartParams{Argv: backgroundSleep})
				checkCleanedAfterKill(t, tr, b, base, rec, time.Time{})
				if n := b.kills.Load(); n < 2 {
					t.Errorf("Kill called %d times; want the failed one retried", n)
				}
			})
			if name == "cgroup" {
				// No stand-in: the backend's own cgroup.kill write
				// (and its freeze-and-signal fallback) at the fd limit.
				t.Run("at the fd limit", func(t *testing.T) {
					tr, b, base := faultyReactor(t, newBackend, func(b *faultyBackend) { b.realFails.Store(1) }, nil)
					rec := tr.run(api.StartParams{Argv: backgroundSleep})
					if err, _ := b.realErr.Load().(error); !errors.Is(err, unix.EMFILE) {
						t.Fatalf("%v; want EMFILE (the test's premise)", err)
					}
					checkCleanedAfterKill(t, tr, b, base, rec, time.Time{})
				})
			}
			t.Run("longer than kill-wait", func(t *testing.T) {
				const killWait = 200 * time.Millisecond
				tr, b, base := faultyReactor(t, newBackend, func(b *faultyBackend) { b.killFault.Store(true) },
					func(c *Config) { c.KillWait = killWait })
				st := tr.start(api.StartParams{Argv: backgroundSleep})
				// Exited at once; the scope still holds the child. Hold
				// the fault for five times --kill-wait.
				waitState(t, tr, st.ID, api.StateExited)
				time.Sleep(5 * killWait)
				got, err := tr.Get(context.Background(), root, api.IDParams{ID: st.ID})
				if err != nil {
					t.Fatal(err)
				}
				failed := b.kills.Load()
				cleared := time.Now()
				b.killFault.Store(false)
				if got.State == api.StateCleaned {
					t.Errorf("cleaned while every kill of its tree failed (error %q)", strOrEmpty(got.Error))
				}
				rec := tr.wait(st.ID)
				checkCleanedAfterKill(t, tr, b, base, rec, cleared)
				// Retried, with a backoff: not once per poll tick.
				if failed < 3 || failed > 40 {
					t.Errorf("Kill failed %d times in %v; want a few retries with a backoff", failed, 5*killWait)
				}
			})
		})
	}
}

// TestCleanupRetriesFailedRemove: removing the scope fails with EMFILE
// once. The removal is retried; cleaned comes with the scope gone and no
// error in the record.
func TestCleanupRetriesFailedRemove(t *testing.T) {
	testenv.CheckFDs(t)
	for name, newBackend := range cleanupBackends(t) {
		t.Run(name, func(t *testing.T) {
			tr, b, base := faultyReactor(t, newBackend, func(b *faultyBackend) { b.removeFails.Store(1) }, nil)
			rec := tr.run(api.StartParams{Argv: backgroundSleep})
			checkCleanedAfterKill(t, tr, b, base, rec, time.Time{})
			if n := b.removes.Load(); n != 2 {
				t.Errorf("Remove called %d times; want the failed one retried once", n)
			}
		})
	}
}

// checkCleanedAfterKill checks what a user would: rec is cleaned without
// an error, after a kill reached the tree (and after notBefore), the
// background child is dead and the scope's cgroup (under base) is gone.
func checkCleanedAfterKill(t *testing.T, tr *testReactor, b *faultyBackend, base string, rec api.Record, notBefore time.Time) {
	t.Helper()
	pid := tr.bgPid(rec)
	if rec.Error != nil {
		t.Errorf("cleaned with error %q; want none (the tree was killed once a kill got through)", *rec.Error)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("background sleep %d alive after cleaned", pid)
	}
	killed := b.firstKill()
	switch {
	case killed.IsZero():
		t.Error("cleaned, but no kill ever reached the tree")
	case rec.CleanedAt == nil || rec.CleanedAt.Before(killed):
		t.Errorf("cleaned at %v, before the first kill that got through (%v)", rec.CleanedAt, killed)
	case !notBefore.IsZero() && killed.Before(notBefore):
		t.Errorf("a kill got through at %v, while the fault still held (until %v)", killed, notBefore)
	}
	if base != "" {
		if _, err := os.Stat(filepath.Join(base, rec.ID)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s still there after cleaned (%v)", rec.ID, err)
		}
	}
}

func strOrEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// waitState waits, bounded, until id's record reaches state.
func waitState(t *testing.T, tr *testReactor, id string, state api.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := tr.Get(context.Background(), root, api.IDParams{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State >= state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %v after 10s, want %v", id, rec.State, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
