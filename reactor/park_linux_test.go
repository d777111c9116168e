package reactor

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// orderedFdStore is a fakeFdStore that also notes the names stored, in
// the order the stores came (the order systemd takes them in).
type orderedFdStore struct {
	fakeFdStore
	mu     sync.Mutex
	stored []string
}

func (f *orderedFdStore) Store(name string, fd int) error {
	if err := f.fakeFdStore.Store(name, fd); err != nil {
		return err
	}
	f.mu.Lock()
	f.stored = append(f.stored, name)
	f.mu.Unlock()
	return nil
}

// roles are the roles of id stored, in order.
func (f *orderedFdStore) roles(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, name := range f.stored {
		if role, ok := strings.CutPrefix(name, id+"."); ok {
			out = append(out, role)
		}
	}
	return out
}

// TestParkPidfdLast: corrald can die between any two of the fd store
// messages that park a new child's fds, and the next corrald adopts an
// execution whose pidfd came back (cmd/corrald's survival plan). So every
// prefix of the parking that holds the pidfd must hold the pipes too: an
// execution adopted without its stdout read end loses its output, and its
// command dies of SIGPIPE at its next write (a drill's slow-follow `seq`
// ended "signaled" where it exited 0). The pidfd is parked last.
func TestParkPidfdLast(t *testing.T) {
	fs := &orderedFdStore{fakeFdStore: fakeFdStore{fds: map[string]int{}}}
	tr := newTestReactor(t, func(c *Config) { c.FdStore = fs })
	for _, tc := range []struct {
		name  string
		p     api.StartParams
		pipes []string // what the child cannot do without
	}{
		{"pipes", api.StartParams{Argv: []string{"true"}, Cwd: "/"}, []string{RoleStdout, RoleStderr}},
		{"stdin_open", api.StartParams{Argv: []string{"true"}, Cwd: "/", StdinOpen: true}, []string{RoleStdout, RoleStderr, RoleStdin}},
		{"tty", api.StartParams{Argv: []string{"true"}, Cwd: "/", TTY: true}, []string{RolePTY}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := tr.Start(context.Background(), root, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			tr.wait(rec.ID)
			roles := fs.roles(rec.ID)
			at := -1
			for i, role := range roles {
				if role == RolePidfd {
					at = i
				}
			}
			if at < 0 {
				t.Fatalf("parked %v: no pidfd (want %v, then the pidfd)", roles, tc.pipes)
			}
			// The crash that keeps the shortest prefix with the pidfd.
			kept := map[string]bool{}
			for _, role := range roles[:at+1] {
				kept[role] = true
			}
			for _, role := range tc.pipes {
				if !kept[role] {
					t.Errorf("parked %v: a crash right after the pidfd's store passes back the pidfd without %s; the execution is adopted without it", roles, role)
				}
			}
			if at != len(roles)-1 {
				t.Errorf("parked %v: the pidfd is not the last", roles)
			}
		})
	}
}

// TestParkPooledBeforeDispatch: a pooled start parks its pipes, the shim's
// exec-error pipe (RoleExec) and last the pool entry's pidfd before the
// dispatch is sent, so that a restart after a crash mid-dispatch has the
// execution's fds and reads on that pipe whether the command ran; once the
// shim exec'd, RoleExec leaves the store.
func TestParkPooledBeforeDispatch(t *testing.T) {
	fs := &orderedFdStore{fakeFdStore: fakeFdStore{fds: map[string]int{}}}
	tr := newTestReactor(t, func(c *Config) { c.FdStore, c.PoolSize = fs, 1 })
	for deadline := time.Now().Add(10 * time.Second); tr.pool.idleCount() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// The pool serves commands that need a shim: network "none".
	rec, err := tr.Start(context.Background(), root, api.StartParams{Argv: []string{"sh", "-c", "echo pooled"}, Cwd: "/", Network: "none"})
	if err != nil {
		t.Fatal(err)
	}
	final := tr.wait(rec.ID)
	if tr.pool.hits.Load() == 0 {
		t.Fatal("the start did not go through the pool")
	}
	if outcome(final) != api.OutcomeExited || tr.stdout(rec.ID) != "pooled\n" {
		t.Errorf("outcome %s, stdout %q; want exited, %q", outcome(final), tr.stdout(rec.ID), "pooled\n")
	}
	want := []string{RoleStdout, RoleStderr, RoleExec, RolePidfd}
	if got := fs.roles(rec.ID); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("parked %v, want %v (the pidfd last, the exec-error pipe before it)", got, want)
	}
	fs.fakeFdStore.mu.Lock()
	removed := append([]string(nil), fs.removed...)
	fs.fakeFdStore.mu.Unlock()
	if !slices.Contains(removed, FdName(rec.ID, RoleExec)) {
		t.Errorf("removed %v: %s stayed in the fd store after the exec", removed, FdName(rec.ID, RoleExec))
	}
}
