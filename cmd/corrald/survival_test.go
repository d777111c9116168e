package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/shim"
	"github.com/corral-dev/corral/store"
)

// fakeBackend is a backend for plan: its placement, and whether the scope
// ScopeOf names for an id holds a process.
type fakeBackend struct {
	placement scope.Placement
	populated bool
}

func (b fakeBackend) Name() string               { return "fake" }
func (b fakeBackend) Placement() scope.Placement { return b.placement }
func (b fakeBackend) Close() error               { return nil }
func (b fakeBackend) Prepare(context.Context, scope.Spec) (scope.Scope, error) {
	return nil, fmt.Errorf("fake backend: no scopes")
}
func (b fakeBackend) ScopeOf(id string, _ int) string { return "corral-" + id + ".scope" }
func (b fakeBackend) Populated(string) bool           { return b.populated }

// startedRecord stores a started record for id, with its params.
func startedRecord(t *testing.T, st store.Store, id string) {
	t.Helper()
	now := time.Now()
	rec := api.Record{ID: id, State: api.StateStarted, CreatedAt: now, Argv: []string{"true"}}
	p, _ := json.Marshal(api.StartParams{ID: id, Argv: []string{"true"}, Cwd: "/"})
	if err := <-st.Create(rec, p); err != nil {
		t.Fatal(err)
	}
}

// execPipe is a shim's exec-error pipe as a restart finds it: the read end
// (non-blocking, as parked; plan owns it) and the shim's write end, open
// (the shim has not got that far) until the test closes it or ends.
func execPipe(t *testing.T) (r int, w *shimEnd) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	w = &shimEnd{fd: p[1]}
	t.Cleanup(w.close)
	return p[0], w
}

// shimEnd is the write end of an exec-error pipe.
type shimEnd struct{ fd int }

// close closes it once: the shim exec'd (EOF), or exited.
func (w *shimEnd) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}

// report writes an exec-error report (nothing ran) and closes w.
func (w *shimEnd) report(t *testing.T) {
	t.Helper()
	b, _ := json.Marshal(shim.ExecError{Op: shim.OpParentGone, Message: "parent gone"})
	if _, err := unix.Write(w.fd, b); err != nil {
		t.Fatal(err)
	}
	w.close()
}

// devNull is an fd standing for a parked pipe or pidfd the test does not
// read.
func devNull(t *testing.T) int {
	t.Helper()
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// planned runs plan over st with the fds passed back, recording what it
// took out of the fd store.
func planned(t *testing.T, st store.Store, b scope.Backend, fdStore bool, byID map[string]map[string]int) (*survival, *[]string) {
	t.Helper()
	return plannedIn(t, st, b, fdStore, byID, t.TempDir())
}

// plannedIn is planned with stateDir as the state directory.
func plannedIn(t *testing.T, st store.Store, b scope.Backend, fdStore bool, byID map[string]map[string]int, stateDir string) (*survival, *[]string) {
	t.Helper()
	var removed []string
	sv := &survival{byID: byID, execWait: 500 * time.Millisecond,
		fdRemove: func(name string) { removed = append(removed, name) }}
	sv.info.FdStore = fdStore
	sv.plan(st, b, stateDir, zerolog.New(io.Discard))
	t.Cleanup(func() {
		for _, a := range sv.adopt {
			for _, fd := range a.Fds {
				unix.Close(fd)
			}
		}
		sv.release(false)
	})
	return sv, &removed
}

// A started record with nothing parked and an empty scope never ran only
// where every start is parked before its command may run: the fd store on
// and a backend that holds children until placed (systemd). Without an fd
// store (nothing is ever parked), or at clone (the cgroup backend parks a
// host-network command after it started; a pooled command runs in its pool
// entry's scope, not the one named for its id), the command may have run:
// lost, and its error says it may have.
func TestRestartNeverRanOnlyWhereStartsParkFirst(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fdStore   bool
		placement scope.Placement
		populated bool
		neverRan  bool
	}{
		{"fd store, held, empty scope", true, scope.PlaceHeld, false, true},
		{"fd store, held, populated scope", true, scope.PlaceHeld, true, false},
		{"no fd store, held, empty scope", false, scope.PlaceHeld, false, false},
		{"fd store, at clone (cgroup, pooled), empty scope", true, scope.PlaceAtClone, false, false},
		{"no fd store, at clone, empty scope", false, scope.PlaceAtClone, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := store.NewMemory()
			startedRecord(t, st, "x1")
			sv, _ := planned(t, st, fakeBackend{tc.placement, tc.populated}, tc.fdStore, map[string]map[string]int{})
			if sv.neverRan["x1"] != tc.neverRan {
				t.Fatalf("never ran = %v, want %v", sv.neverRan["x1"], tc.neverRan)
			}
			rec, _, _ := st.Get("x1")
			why := sv.lostWhy(rec)
			if tc.neverRan && why != reactor.StartFailedRestart {
				t.Errorf("error %q, want %q", why, reactor.StartFailedRestart)
			}
			if !tc.neverRan && !strings.Contains(why, "may have been let run") {
				t.Errorf("error %q, want the started-record reason saying it may have run", why)
			}
		})
	}
}

// The exec-error pipe decides a started record whether its pidfd came
// back or not: a report, nothing ran (start_failed); EOF, the command ran,
// and without a pidfd it cannot be taken over: lost, never start_failed
// (not even by the empty-scope rule, which a command that ran and exited
// satisfies).
func TestRestartReadsExecPipeWithoutPidfd(t *testing.T) {
	t.Run("report", func(t *testing.T) {
		st := store.NewMemory()
		startedRecord(t, st, "rep")
		r, w := execPipe(t)
		w.report(t)
		// Its scope has processes: only the pipe can tell it never ran.
		sv, _ := planned(t, st, fakeBackend{scope.PlaceHeld, true}, true, map[string]map[string]int{
			"rep": {reactor.RoleExec: r, reactor.RoleStdout: devNull(t)},
		})
		if !sv.neverRan["rep"] {
			t.Errorf("a report on its exec-error pipe (no pidfd), but not never ran")
		}
	})
	t.Run("eof", func(t *testing.T) {
		st := store.NewMemory()
		startedRecord(t, st, "eof")
		r, w := execPipe(t)
		w.close()
		// Its scope is empty: the command ran and exited.
		sv, _ := planned(t, st, fakeBackend{scope.PlaceHeld, false}, true, map[string]map[string]int{
			"eof": {reactor.RoleExec: r, reactor.RoleStdout: devNull(t)},
		})
		if sv.neverRan["eof"] || sv.adopted("eof") {
			t.Errorf("exec'd (EOF) without a pidfd: never ran %v, adopted %v; want lost", sv.neverRan["eof"], sv.adopted("eof"))
		}
		rec, _, _ := st.Get("eof")
		if why := sv.lostWhy(rec); !strings.Contains(why, "exec'd the command") {
			t.Errorf("error %q, want it to say the shim exec'd the command", why)
		}
	})
}

// A record not adopted keeps its fds in the store until its settled
// record is durable (release), except its pidfd, which leaves first: a
// second crash in between must not find the pidfd of a shim that never
// ran its command and adopt it (the report, read once, reads as EOF the
// next time, as if it had exec'd; the dead shim's exit status would be
// recorded). An adopted record whose shim exec'd loses only its exec
// pipe, at once.
func TestRestartFdStoreRemovalOrder(t *testing.T) {
	st := store.NewMemory()
	startedRecord(t, st, "never")
	startedRecord(t, st, "undecided")
	startedRecord(t, st, "ran")
	rNever, wNever := execPipe(t)
	wNever.report(t)
	rUnd, _ := execPipe(t) // the shim has not got that far
	rRan, wRan := execPipe(t)
	wRan.close()
	sv, removed := planned(t, st, fakeBackend{scope.PlaceHeld, false}, true, map[string]map[string]int{
		"never":     {reactor.RoleExec: rNever, reactor.RoleStdout: devNull(t), reactor.RolePidfd: devNull(t)},
		"undecided": {reactor.RoleExec: rUnd, reactor.RoleStdout: devNull(t), reactor.RolePidfd: devNull(t)},
		"ran":       {reactor.RoleExec: rRan, reactor.RoleStdout: devNull(t), reactor.RolePidfd: devNull(t)},
	})
	if !sv.neverRan["never"] || !sv.undecided["undecided"] || !sv.adopted("ran") {
		t.Fatalf("never ran %v, undecided %v, ran adopted %v; want all true", sv.neverRan["never"], sv.undecided["undecided"], sv.adopted("ran"))
	}
	got := slices.Clone(*removed)
	slices.Sort(got)
	want := []string{"never.pidfd", "ran.exec", "undecided.pidfd"}
	if !slices.Equal(got, want) {
		t.Fatalf("removed from the fd store by plan: %q, want %q (the rest only once the records are durable)", got, want)
	}
	*removed = nil
	sv.release(true)
	got = slices.Clone(*removed)
	slices.Sort(got)
	want = []string{"never.exec", "never.stdout", "undecided.exec", "undecided.stdout"}
	if !slices.Equal(got, want) {
		t.Errorf("removed by release: %q, want %q", got, want)
	}
}

// Shims undecided at the restart cost one wait in all, not one each: the
// restart is before READY, against TimeoutStartSec.
func TestRestartUndecidedShimsWaitOnce(t *testing.T) {
	const n = 6
	st := store.NewMemory()
	byID := map[string]map[string]int{}
	for i := range n {
		id := fmt.Sprint("u", i)
		startedRecord(t, st, id)
		r, _ := execPipe(t) // the shim has not got that far
		byID[id] = map[string]int{reactor.RoleExec: r, reactor.RolePidfd: devNull(t)}
	}
	t0 := time.Now()
	sv, _ := planned(t, st, fakeBackend{scope.PlaceHeld, false}, true, byID)
	took := time.Since(t0)
	for id := range byID {
		if !sv.undecided[id] || sv.adopted(id) || sv.neverRan[id] {
			t.Errorf("%s: undecided %v adopted %v never ran %v; want undecided only", id, sv.undecided[id], sv.adopted(id), sv.neverRan[id])
		}
	}
	// One wait is sv.execWait; one per shim would be n of them.
	if d := sv.execWait; took < d || took >= n*d {
		t.Errorf("%d undecided shims took %v; want one wait of %v (one each: %v)", n, took, d, n*d)
	}
}

// An exited record whose fds did not come back is taken over where a spool
// of any of its streams is left: one with only a stderr spool (stdout's
// could not be opened, EMFILE, and stdout stayed quiet, so the exited
// record carried no output) is taken over, and its stderr output with it.
// Only a stdout spool counted: the record was settled without it and the
// stderr spool deleted as debris.
func TestRestartTakesOverExitedWithAnySpool(t *testing.T) {
	for _, stream := range []string{"stdout", "stderr"} {
		t.Run(stream, func(t *testing.T) {
			st := store.NewMemory()
			startedRecord(t, st, "x1")
			rec, _, _ := st.Get("x1")
			code := 0
			now := time.Now()
			rec.State, rec.PID, rec.StartedAt = api.StateRunning, 1, &now
			if res := <-st.Transition(api.StateStarted, rec); res.Err != nil || !res.Applied {
				t.Fatalf("running: %+v", res)
			}
			rec.State, rec.ExitCode, rec.ExitedAt = api.StateExited, &code, &now
			if res := <-st.Transition(api.StateRunning, rec); res.Err != nil || !res.Applied {
				t.Fatalf("exited: %+v", res)
			}
			dir := t.TempDir()
			if err := os.MkdirAll(reactor.SpoolDir(dir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(reactor.SpoolDir(dir), "x1."+stream), make([]byte, 8), 0o600); err != nil {
				t.Fatal(err)
			}
			sv, _ := plannedIn(t, st, fakeBackend{scope.PlaceHeld, false}, true, map[string]map[string]int{}, dir)
			if !sv.adopted("x1") {
				t.Errorf("exited record with a %s spool not taken over", stream)
			}
		})
	}
}
