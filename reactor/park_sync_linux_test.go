package reactor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
)

// idleShimPids waits for the pool to hold an entry and returns the pids of
// its waiting shims: a command dispatched to one runs with its pid.
func idleShimPids(t *testing.T, tr *testReactor) []int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tr.pool.idleCount() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the pool made no entry in 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	tr.pool.mu.Lock()
	defer tr.pool.mu.Unlock()
	var pids []int
	for _, e := range tr.pool.idle {
		pids = append(pids, e.cmd.Process.Pid)
	}
	return pids
}

// unparkedAfterExit makes fs note every Remove of an execution's fd made,
// while its exec-error pipe is parked, once the process behind the pidfd
// parked with it had already exited (killed): a crash of corrald between that kill and the Remove leaves a
// restart reading EOF on the exec-error pipe of a shim that died without a
// report, and taking the command for run. Read the result under fs.mu.
func unparkedAfterExit(fs *fakeFdStore) *[]string {
	var late []string
	fs.beforeRemove = func(name string) { // under fs.mu
		id, _, ok := SplitFdName(name)
		if !ok {
			return
		}
		pidfd, ok := fs.fds[FdName(id, RolePidfd)]
		if _, exec := fs.fds[FdName(id, RoleExec)]; !ok || !exec {
			// Only while the exec-error pipe is parked with the pidfd:
			// an exited command's pipes leave the store after its exit.
			return
		}
		pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 0); err == nil && n > 0 {
			late = append(late, name)
		}
	}
	return &late
}

// storedFor lists what fs still holds for id.
func storedFor(fs *fakeFdStore, id string) []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for name := range fs.fds {
		if strings.HasPrefix(name, id+".") {
			out = append(out, name)
		}
	}
	return out
}

// startPooledInline starts `echo inline` through the pool (network
// "none": a command that needs a shim) with p's other fields and checks
// that it took the pool's entry, yet ran inline, not in one of shims (why
// it must not have: why), and exited printing "inline".
func startPooledInline(t *testing.T, tr *testReactor, shims []int, p api.StartParams, why string) api.Record {
	t.Helper()
	p.Argv, p.Cwd, p.Network = []string{"sh", "-c", "echo inline"}, "/", "none"
	rec, err := tr.Start(context.Background(), root, p)
	if err != nil {
		t.Fatal(err)
	}
	final := tr.wait(rec.ID)
	if tr.pool.hits.Load() == 0 {
		t.Fatal("the start did not take the pool's entry: the test proves nothing")
	}
	if slices.Contains(shims, final.PID) {
		t.Errorf("the command ran in the pool's shim (pid %d): %s", final.PID, why)
	}
	if outcome(final) != api.OutcomeExited || tr.stdout(rec.ID) != "inline\n" {
		t.Errorf("outcome %s, stdout %q; want exited, %q (started inline)", outcome(final), tr.stdout(rec.ID), "inline\n")
	}
	return final
}

// TestParkQueuedPooledStartsInline: the fd store's messages can wait in
// corrald (systemd slow to read them, under load), and a kill -9 then
// loses them. A pooled start whose parked fds have not reached systemd
// must not be dispatched (a restart could not tell whether the command
// ran): the pool entry is given up and the command starts inline.
func TestParkQueuedPooledStartsInline(t *testing.T) {
	fs := &fakeFdStore{fds: map[string]int{}, queued: true}
	tr := newTestReactor(t, func(c *Config) { c.FdStore, c.PoolSize = fs, 1 })
	shims := idleShimPids(t, tr)
	startPooledInline(t, tr, shims, api.StartParams{}, "its parked fds never reached systemd")
}

// TestParkQueuedHeldNotReleased: a held shim whose parked fds have not
// reached systemd is not released: the command does not run and the start
// fails saying why; what was parked is taken back before the shim is
// ended.
func TestParkQueuedHeldNotReleased(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	b := &heldBackend{Backend: scope.NewPgroup(), marker: marker}
	fs := &fakeFdStore{fds: map[string]int{}, queued: true}
	late := unparkedAfterExit(fs)
	tr := newTestReactor(t, func(c *Config) { c.Backend, c.FdStore = b, fs })
	rec := tr.run(api.StartParams{Argv: []string{"touch", marker}})
	if outcome(rec) != api.OutcomeStartFailed || rec.Error == nil || !strings.Contains(*rec.Error, "fd store") {
		t.Errorf("outcome %v, error %v; want start_failed saying the fd store did not take the fds", outcome(rec), rec.Error)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran: the held shim was released although its parked fds never reached systemd")
	}
	fs.mu.Lock()
	removed, lateRemoves := append([]string(nil), fs.removed...), append([]string(nil), (*late)...)
	fs.mu.Unlock()
	if !slices.Contains(removed, FdName(rec.ID, RoleExec)) {
		t.Errorf("removed %v: the exec-error pipe parked before the release was not taken back", removed)
	}
	if len(lateRemoves) > 0 {
		t.Errorf("removed %v after the shim was ended: a crash in between would read EOF there and take the command for run", lateRemoves)
	}
	// Taken back pidfd first: a crash part-way must not leave the pidfd
	// stored without the exec-error pipe (taken over as a command let run).
	var order []string
	for _, name := range removed {
		if role, ok := strings.CutPrefix(name, rec.ID+"."); ok {
			order = append(order, role)
		}
	}
	if want := []string{RolePidfd, RoleExec, RoleStderr, RoleStdout}; !slices.Equal(order, want) {
		t.Errorf("taken back in the order %v, want %v (the reverse of the parking)", order, want)
	}
	if left := storedFor(fs, rec.ID); len(left) > 0 {
		t.Errorf("still in the fd store: %v", left)
	}
}

// limitFailBackend is the pgroup backend whose scopes refuse new limits,
// so that a pooled dispatch fails before the command is handed over.
type limitFailBackend struct{ scope.Backend }

func (b limitFailBackend) Prepare(ctx context.Context, spec scope.Spec) (scope.Scope, error) {
	sc, err := b.Backend.Prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	return limitFailScope{sc}, nil
}

type limitFailScope struct{ scope.Scope }

func (limitFailScope) SetLimits(context.Context, scope.Limits) error {
	return errors.New("limits refused (test)")
}

// TestParkPooledDispatchFailsUnparksFirst: a pooled dispatch that fails
// before the command is handed over (here the entry's scope refuses the
// request's limits) takes back what it parked, the shim's exec-error pipe
// with it, before the pool entry's shim is killed; then the command starts
// inline. The other order leaves a window where a crash finds the pipe at
// EOF from a shim killed without a report: "ran", and a command that never
// ran recorded as signaled SIGKILL.
func TestParkPooledDispatchFailsUnparksFirst(t *testing.T) {
	fs := &fakeFdStore{fds: map[string]int{}}
	late := unparkedAfterExit(fs)
	tr := newTestReactor(t, func(c *Config) {
		c.Backend, c.FdStore, c.PoolSize = limitFailBackend{scope.NewPgroup()}, fs, 1
	})
	shims := idleShimPids(t, tr)
	rec := startPooledInline(t, tr, shims, api.StartParams{TasksMax: 50}, "the dispatch did not fail, the test proves nothing")
	fs.mu.Lock()
	removed, lateRemoves := append([]string(nil), fs.removed...), append([]string(nil), (*late)...)
	fs.mu.Unlock()
	if !slices.Contains(removed, FdName(rec.ID, RoleExec)) {
		t.Fatalf("removed %v: nothing was parked for the dispatch, the test proves nothing", removed)
	}
	if len(lateRemoves) > 0 {
		t.Errorf("removed %v after the pool entry's shim was killed: a crash in between would read EOF there and take the command for run", lateRemoves)
	}
}

// TestParkPooledWithoutPidfdStartsInline: a pool entry without a pidfd
// cannot be parked (a restart adopts by the pidfd), so with the fd store
// on it is not dispatched: a crash mid-dispatch could not be told from one
// before it. The command starts inline.
func TestParkPooledWithoutPidfdStartsInline(t *testing.T) {
	fs := &fakeFdStore{fds: map[string]int{}}
	tr := newTestReactor(t, func(c *Config) { c.FdStore, c.PoolSize, c.NoPidfd = fs, 1, true })
	shims := idleShimPids(t, tr)
	startPooledInline(t, tr, shims, api.StartParams{}, "dispatched with nothing parked for it")
}

// TestParkRemoveFailureRetried: when spawn's Remove of the exec-error
// pipe (after the pooled shim exec'd) fails, the role stays the
// execution's, so that its cleanup removes it again: nothing of the
// execution is left in the fd store once it is cleaned.
func TestParkRemoveFailureRetried(t *testing.T) {
	const id = "remove-fails"
	fs := &fakeFdStore{fds: map[string]int{}, failRemove: map[string]int{FdName(id, RoleExec): 1}}
	tr := newTestReactor(t, func(c *Config) { c.FdStore, c.PoolSize = fs, 1 })
	shims := idleShimPids(t, tr)
	rec, err := tr.Start(context.Background(), root, api.StartParams{ID: id, Argv: []string{"true"}, Cwd: "/", Network: "none"})
	if err != nil {
		t.Fatal(err)
	}
	final := tr.wait(rec.ID)
	if !slices.Contains(shims, final.PID) {
		t.Fatalf("the command did not run in the pool's shim (pid %d, shims %v): the test proves nothing", final.PID, shims)
	}
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		if left = storedFor(fs, id); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) > 0 {
		fs.mu.Lock()
		removed := append([]string(nil), fs.removed...)
		fs.mu.Unlock()
		t.Errorf("still in the fd store after cleanup: %v (removed %v): a failed Remove was not tried again", left, removed)
	}
}
