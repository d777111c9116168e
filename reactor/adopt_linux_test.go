package reactor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/scope"
	"github.com/corral-dev/corral/store"
	"github.com/corral-dev/corral/tests/testenv"
)

// fakeFdStore keeps duplicates of what is parked, as systemd does.
type fakeFdStore struct {
	mu      sync.Mutex
	fds     map[string]int
	removed []string // names passed to Remove, in order
	// queued: what is stored or removed waits in the process and never
	// reaches systemd (busy): Sync reports false.
	queued bool
	syncs  int // Sync calls
	// failRemove is how many Removes of a name fail (and keep its fd).
	failRemove map[string]int
	// beforeRemove, when set, sees each Remove's name (under mu) first.
	beforeRemove func(name string)
}

func (f *fakeFdStore) Store(name string, fd int) error {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.fds[name]; ok {
		unix.Close(old)
	}
	f.fds[name] = d
	return nil
}

func (f *fakeFdStore) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.beforeRemove != nil {
		f.beforeRemove(name)
	}
	f.removed = append(f.removed, name)
	if f.failRemove[name] > 0 {
		f.failRemove[name]--
		return errors.New("remove refused (test)")
	}
	if fd, ok := f.fds[name]; ok {
		unix.Close(fd)
		delete(f.fds, name)
	}
	return nil
}

func (f *fakeFdStore) Sync(time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs++
	return !f.queued
}

// passBack hands duplicates of id's stored fds to the next reactor, by role.
func (f *fakeFdStore) passBack(t *testing.T, id string) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for name, fd := range f.fds {
		if rest, ok := strings.CutPrefix(name, id+"."); ok {
			d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				t.Fatal(err)
			}
			out[rest] = d
		}
	}
	return out
}

// TestAdoptAfterCrash: a reactor stops without a shutdown (its loop gone,
// as in a crash); a second one, given the store's records and the parked
// fds, takes the executions over: output read before and after, the exit
// code, stdin still open, a deadline that passed meanwhile firing, and the
// fd store empty once all are cleaned.
func TestAdoptAfterCrash(t *testing.T) {
	testenv.SkipRoot(t, "children run as the caller's uid")
	st := store.NewMemory()
	fs := &fakeFdStore{fds: map[string]int{}}
	dir := t.TempDir()
	cfg := Config{
		Backend: scope.NewPgroup(), Store: st, FdStore: fs, StateDir: dir,
		Log:      zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		KillWait: 2 * time.Second, SocketGID: -1,
	}
	r1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx1, crash := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- r1.Run(ctx1) }()
	start := func(p api.StartParams) string {
		t.Helper()
		p.Cwd = "/"
		rec, err := r1.Start(context.Background(), root, p)
		if err != nil || rec.State != api.StateRunning {
			t.Fatalf("Start(%v) = %v, %v", p.Argv, rec.State, err)
		}
		return rec.ID
	}
	// The second line is written once the test says so, after the crash
	// (it waits in the pipe for the adopter): a fixed sleep could pass
	// before a loaded host's poll below saw the first line alone.
	gate := filepath.Join(t.TempDir(), "two")
	exit7 := start(api.StartParams{Argv: []string{"sh", "-c", `echo one; while [ ! -e "$0" ]; do sleep 0.01; done; echo two; exit 7`, gate}})
	cat := start(api.StartParams{Argv: []string{"cat"}, StdinOpen: true})
	timeout := start(api.StartParams{Argv: []string{"sleep", "30"}, TimeoutMS: 300, GraceMS: 100})
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := r1.Output(context.Background(), root, api.OutputParams{ID: exit7})
		if string(out.Data) == "one\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no first line: %q", out.Data)
		}
		time.Sleep(5 * time.Millisecond)
	}
	crash()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the timeout falls due meanwhile

	recs, err := st.Unfinished()
	if err != nil || len(recs) != 3 {
		t.Fatalf("unfinished after the crash: %d, %v; want 3", len(recs), err)
	}
	cfg.Adopt = nil
	for _, rec := range recs {
		var p api.StartParams
		b, _, _ := st.Params(rec.ID)
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		cfg.Adopt = append(cfg.Adopt, Adoptee{Record: rec, Params: p, Fds: fs.passBack(t, rec.ID)})
	}
	// What the crashed reactor held dies with it in a real crash.
	for _, e := range r1.execs {
		for _, fd := range []int{e.pidfd, e.streams[0].fd, e.streams[1].fd} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		if e.stdin != nil && e.stdin.fd >= 0 {
			unix.Close(e.stdin.fd)
		}
		for _, s := range e.streams {
			s.spool.close()
		}
	}
	r2 := newTestReactor(t, func(c *Config) {
		c.Store, c.FdStore, c.StateDir, c.Adopt, c.Subreaper = st, fs, dir, cfg.Adopt, false
	})
	if info, _ := r2.Info(context.Background()); info.Adopted != 3 {
		t.Errorf("daemon.info adopted = %d, want 3", info.Adopted)
	}
	if _, err := r2.Write(context.Background(), root, api.WriteParams{ID: cat, Data: []byte("after"), Close: true}); err != nil {
		t.Fatalf("Write after adoption: %v", err)
	}
	rec := r2.wait(exit7)
	if outcome(rec) != api.OutcomeExited || rec.ExitCode == nil || *rec.ExitCode != 7 || rec.Adopted != 1 {
		t.Errorf("exit 7: outcome %s exit %v adopted %d", outcome(rec), rec.ExitCode, rec.Adopted)
	}
	if got := r2.stdout(exit7); got != "one\ntwo\n" || rec.Stdout.TotalBytes != 8 {
		t.Errorf("exit 7: stdout %q (total %d), want both lines", got, rec.Stdout.TotalBytes)
	}
	if rec := r2.wait(cat); outcome(rec) != api.OutcomeExited || r2.stdout(cat) != "after" {
		t.Errorf("cat: outcome %s stdout %q", outcome(rec), r2.stdout(cat))
	}
	if rec := r2.wait(timeout); outcome(rec) != api.OutcomeTimeout {
		t.Errorf("timeout due during the outage: outcome %s error %v", outcome(rec), rec.Error)
	}
	fs.mu.Lock()
	left := len(fs.fds)
	fs.mu.Unlock()
	if left != 0 {
		t.Errorf("%d fds left in the fd store after all were cleaned: %v", left, fs.fds)
	}
}

func TestSplitFdName(t *testing.T) {
	for _, tt := range []struct{ in, id, role string }{
		{"0190-ab.stdout", "0190-ab", "stdout"},
		{"my.id.with.dots.pidfd", "my.id.with.dots", "pidfd"},
		{"corrald.socket", "corrald", "socket"},
	} {
		id, role, ok := SplitFdName(tt.in)
		if !ok || id != tt.id || role != tt.role {
			t.Errorf("SplitFdName(%q) = %q, %q, %v", tt.in, id, role, ok)
		}
	}
	for _, bad := range []string{"nodot", ".x", "x."} {
		if _, _, ok := SplitFdName(bad); ok {
			t.Errorf("SplitFdName(%q) ok", bad)
		}
	}
}

// TestFdStoreRemovesWhatWasParked: cleanup takes out of the fd store what
// was parked, each name once: no stdin for an execution without one, and a
// closed stdin not a second time.
func TestFdStoreRemovesWhatWasParked(t *testing.T) {
	fs := &fakeFdStore{fds: map[string]int{}}
	dir := t.TempDir()
	r := newTestReactor(t, func(c *Config) { c.Store, c.FdStore, c.StateDir = store.NewMemory(), fs, dir })
	ctx := context.Background()
	for _, tt := range []struct {
		p    api.StartParams
		want string
	}{
		{api.StartParams{Argv: []string{"true"}}, "pidfd stdout stderr"},
		{api.StartParams{Argv: []string{"cat"}, StdinOpen: true, Stdin: []byte("x")}, "pidfd stdout stderr stdin"},
	} {
		tt.p.Cwd = "/"
		rec, err := r.Start(ctx, root, tt.p)
		if err != nil {
			t.Fatal(err)
		}
		if tt.p.StdinOpen {
			if _, err := r.Write(ctx, root, api.WriteParams{ID: rec.ID, Close: true}); err != nil {
				t.Fatal(err)
			}
		}
		if rec, err = r.Wait(ctx, root, api.WaitParams{ID: rec.ID}); err != nil || rec.State != api.StateCleaned {
			t.Fatalf("Wait = %v, %v", rec.State, err)
		}
		fs.mu.Lock()
		var got []string
		for _, name := range fs.removed {
			if role, ok := strings.CutPrefix(name, rec.ID+"."); ok {
				got = append(got, role)
			}
		}
		left := 0
		for name := range fs.fds {
			if strings.HasPrefix(name, rec.ID+".") {
				left++
			}
		}
		fs.mu.Unlock()
		sort.Strings(got)
		want := strings.Fields(tt.want)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") || left != 0 {
			t.Errorf("%v: removed %v, want %v each once; %d left in the store", tt.p.Argv, got, want, left)
		}
	}
}

// TestHoldForksWaitsForForkInFlight: a handover's exec waits for a fork in
// flight (its child may still hold copies of corrald's fds, the store's
// lock among them) and no fork starts while it is held.
func TestHoldForksWaitsForForkInFlight(t *testing.T) {
	rp := &reaper{mains: map[int]int{}}
	inFork, finish := make(chan struct{}), make(chan struct{})
	forked := make(chan error, 1)
	go func() {
		forked <- rp.fork(func() (int, error) {
			close(inFork)
			<-finish // the child has not exec'd yet
			return 1, nil
		})
	}()
	<-inFork
	held := make(chan func(), 1)
	go func() { held <- rp.holdForks() }()
	select {
	case <-held:
		t.Fatal("holdForks returned while a fork was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	if err := <-forked; err != nil {
		t.Fatal(err)
	}
	release := <-held
	started := make(chan struct{})
	go func() {
		_ = rp.fork(func() (int, error) { close(started); return 2, nil })
	}()
	select {
	case <-started:
		t.Fatal("a fork started while forks were held")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-started
	var nilReaper *reaper
	nilReaper.holdForks()()
}

// heldExitStore holds the answer to every exited transition until release
// is closed, and says when a cleaned one is asked for.
type heldExitStore struct {
	store.Store
	release chan struct{}
	cleaned chan string // ids whose cleaned transition was asked for
}

func (s *heldExitStore) TransitionFunc(from api.State, rec api.Record, done func(store.Result), outs ...store.Output) {
	switch rec.State {
	case api.StateExited:
		s.Store.TransitionFunc(from, rec, func(res store.Result) {
			go func() { <-s.release; done(res) }()
		}, outs...)
		return
	case api.StateCleaned:
		s.cleaned <- rec.ID
	}
	s.Store.TransitionFunc(from, rec, done, outs...)
}

// TestFdStoreKeepsFdsUntilExitIsDurable: an execution's fds leave the fd
// store only once a record with its outcome is durable. Its cleanup may
// close them before (the tree and the pipes are gone at once), but a crash
// of corrald then, its record still running in the store, would leave the
// restarted corrald nothing to adopt it by ("its fds were not in the fd
// store": lost, though its pidfd still held its exit status). Found by
// tests/survival TestReloadThenCrash/watchdog: children that exited while
// corrald was SIGSTOPped, handled in the moment between systemd's SIGCONT
// and the SIGABRT's end.
func TestFdStoreKeepsFdsUntilExitIsDurable(t *testing.T) {
	writeExitsAtOnce(t) // the exited record written (and held back here), not held for cleaned
	fs := &fakeFdStore{fds: map[string]int{}}
	st := &heldExitStore{Store: store.NewMemory(), release: make(chan struct{}), cleaned: make(chan string, 1)}
	released := false
	defer func() {
		if !released {
			close(st.release)
		}
	}()
	r := newTestReactor(t, func(c *Config) { c.Store, c.FdStore, c.StateDir = st, fs, t.TempDir() })
	ctx := context.Background()
	rec, err := r.Start(ctx, root, api.StartParams{Argv: []string{"true"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	removed := func() []string {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		var got []string
		for _, name := range fs.removed {
			if role, ok := strings.CutPrefix(name, rec.ID+"."); ok {
				got = append(got, role)
			}
		}
		sort.Strings(got)
		return got
	}
	// Cleaned is asked for once the cleanup closed the fds and removed the
	// scope: the exited record is still not durable.
	select {
	case <-st.cleaned:
	case <-time.After(20 * time.Second):
		t.Fatal("no cleaned transition")
	}
	if got := removed(); len(got) > 0 {
		t.Errorf("removed %v from the fd store while the exited record was not durable yet: a crash now would lose the execution", got)
	}
	close(st.release)
	released = true
	if rec, err = r.Wait(ctx, root, api.WaitParams{ID: rec.ID}); err != nil || rec.State != api.StateCleaned {
		t.Fatalf("Wait = %v, %v", rec.State, err)
	}
	// exec.wait may be answered from the store's writer before the loop
	// runs the follow-up that removes them: bounded wait.
	got := ""
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if got = strings.Join(removed(), " "); got == "pidfd stderr stdout" {
			break
		}
	}
	if got != "pidfd stderr stdout" {
		t.Errorf("once exited is durable: removed %q, want pidfd stderr stdout each once", got)
	}
}
