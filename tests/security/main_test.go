// Package security tests corrald's isolation promises against a real daemon
// on this host, with two unprivileged users the tests create (corral-a and
// corral-b): ownership of executions, run-as-caller identity, no_new_privs,
// the child's environment, network "none", workspace removal and the
// capacity caps. The clients really run as those users: the test binary
// re-executes itself with their credentials in "client mode" and performs
// JSON-RPC calls over the daemon's socket, so the daemon sees their uid
// through SO_PEERCRED. Needs root; skips otherwise.
package security

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

// Client mode: the environment a re-executed test binary reads.
const (
	clientModeEnv = "CORRAL_SECTEST_CLIENT" // "1" selects client mode
	callsEnv      = "CORRAL_SECTEST_CALLS"  // JSON []call
	socketEnv     = "CORRAL_SOCKET"
)

// Test users and the group that may use the socket.
const (
	userA       = "corral-a"
	userB       = "corral-b"
	socketGroup = "corral-sectest"
)

// idPlaceholder in a call's params is replaced by the id of the last
// execution that call sequence started.
const idPlaceholder = "$ID"

var (
	binDir  string // corrald, corralctl and a copy of this test binary, world-readable
	testBin string
	users   = map[string]*testUser{}
	// cgroupMount is a writable cgroup2 hierarchy for --scope cgroup, or "".
	cgroupMount string
)

// testUser is a Unix user the tests act as.
type testUser struct {
	name     string
	uid, gid uint32
	groups   []uint32 // from the user database, including the primary gid
}

func TestMain(m *testing.M) {
	if os.Getenv(clientModeEnv) == "1" {
		os.Exit(clientMain())
	}
	if os.Geteuid() != 0 {
		os.Exit(testenv.SkipSuite("security", "needs root (creates users, runs corrald)"))
	}
	cleanup, err := setup()
	if err != nil {
		cleanup()
		fmt.Printf("security: setup: %v\n", err)
		os.Exit(1)
	}
	code := testenv.Main(m)
	cleanup()
	os.Exit(code)
}

// setup creates the users and group if missing, builds the binaries into a
// directory the users can read, and returns what undoes it.
func setup() (cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, name := range []string{userA, userB} {
		if _, err := user.Lookup(name); err == nil {
			continue
		}
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
			return cleanup, fmt.Errorf("useradd %s: %v: %s", name, err, out)
		}
		// Created here, so removed here; .ci/run's users stay.
		undo = append(undo, func() { _ = exec.Command("userdel", name).Run() })
	}
	if _, err := user.LookupGroup(socketGroup); err != nil {
		if out, err := exec.Command("groupadd", "--system", socketGroup).CombinedOutput(); err != nil {
			return cleanup, fmt.Errorf("groupadd %s: %v: %s", socketGroup, err, out)
		}
		undo = append(undo, func() { _ = exec.Command("groupdel", socketGroup).Run() })
	}
	for _, name := range []string{userA, userB} {
		if out, err := exec.Command("usermod", "-a", "-G", socketGroup, name).CombinedOutput(); err != nil {
			return cleanup, fmt.Errorf("usermod -a -G %s %s: %v: %s", socketGroup, name, err, out)
		}
		u, err := lookupUser(name)
		if err != nil {
			return cleanup, err
		}
		users[name] = u
	}

	// The users run the binaries and the test binary from here (0755).
	dir, err := testd.Build("corral-sec-bin-", "corrald", "corralctl", "corral-shim")
	if err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	binDir = dir
	self, err := os.Executable()
	if err != nil {
		return cleanup, err
	}
	testBin = filepath.Join(dir, "security.test")
	if err := copyFile(self, testBin, 0o755); err != nil {
		return cleanup, err
	}
	cgroupMount = testd.Cgroup2Mount()
	return cleanup, nil
}

func lookupUser(name string) (*testUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	tu := &testUser{name: name, uid: uint32(uid), gid: uint32(gid)}
	gids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of %s: %w", name, err)
	}
	for _, g := range gids {
		n, _ := strconv.ParseUint(g, 10, 32)
		tu.groups = append(tu.groups, uint32(n))
	}
	return tu, nil
}

func copyFile(from, to string, mode os.FileMode) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Chmod(to, mode)
}

// call is one JSON-RPC call a client makes.
type call struct {
	Method string `json:"method"`
	Params any    `json:"params,omitempty"`
}

// reply is its answer: Result on success, else Code and Message.
type reply struct {
	Method  string          `json:"method"`
	Result  json.RawMessage `json:"result,omitempty"`
	Code    api.Code        `json:"code,omitempty"`
	Message string          `json:"message,omitempty"`
}

// record decodes a reply's result as an execution record.
func (r reply) record(t *testing.T) api.Record {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("%s: error %d %q, want a record", r.Method, r.Code, r.Message)
	}
	var rec api.Record
	if err := json.Unmarshal(r.Result, &rec); err != nil {
		t.Fatalf("%s: decode record %s: %v", r.Method, r.Result, err)
	}
	return rec
}

// clientMain is client mode: perform the calls in $CORRAL_SECTEST_CALLS on
// $CORRAL_SOCKET and print the replies as JSON. It runs as a test user.
func clientMain() int {
	var calls []call
	if err := json.Unmarshal([]byte(os.Getenv(callsEnv)), &calls); err != nil {
		fmt.Fprintf(os.Stderr, "client: calls: %v\n", err)
		return 2
	}
	replies, err := doCalls(os.Getenv(socketEnv), calls)
	if err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 2
	}
	if err := json.NewEncoder(os.Stdout).Encode(replies); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 2
	}
	return 0
}

// doCalls makes calls in order on one connection. A JSON-RPC error is a
// reply, not a failure; a broken connection is a failure.
func doCalls(socket string, calls []call) ([]reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ipc.DialContext(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var lastID string
	replies := make([]reply, 0, len(calls))
	for _, cl := range calls {
		var params any
		if cl.Params != nil {
			b, err := json.Marshal(cl.Params)
			if err != nil {
				return nil, err
			}
			b = bytes.ReplaceAll(b, []byte(strconv.Quote(idPlaceholder)), []byte(strconv.Quote(lastID)))
			params = json.RawMessage(b)
		}
		var res json.RawMessage
		r := reply{Method: cl.Method}
		err := c.Call(ctx, cl.Method, params, &res)
		var ae *api.Error
		switch {
		case err == nil:
			r.Result = res
			if cl.Method == "exec.start" {
				var rec struct{ ID string }
				_ = json.Unmarshal(res, &rec)
				lastID = rec.ID
			}
		case errors.As(err, &ae):
			r.Code, r.Message = ae.Code, ae.Message
		default:
			return nil, fmt.Errorf("%s: %w", cl.Method, err)
		}
		replies = append(replies, r)
	}
	return replies, nil
}

// daemon is a corrald started for one test, with its socket usable by the
// test users (directory 0755, socket 0660 group corral-sectest).
type daemon struct {
	*testd.Daemon
	t      *testing.T
	dir    string // the daemon's directory, readable by the test users
	pooled bool   // run must see a warm shim take each command
}

// spawnPaths are the two ways corrald starts a command, which must be
// equally safe: inline (scope made per exec.start, the shim only where
// needed) and through a warm shim already waiting in a scope of its own.
var spawnPaths = []struct {
	name string
	args []string
}{
	{"inline", []string{"--pool-size", "0"}},
	{"pool", []string{"--pool-size", "2"}},
}

// forEachSpawnPath runs f as a subtest against a daemon of each spawn path.
func forEachSpawnPath(t *testing.T, f func(t *testing.T, d *daemon)) {
	for _, sp := range spawnPaths {
		t.Run(sp.name, func(t *testing.T) {
			d := startDaemon(t, sp.args...)
			d.pooled = sp.name == "pool"
			f(t, d)
		})
	}
}

// forTest returns d acting for t, a subtest of the test that started it:
// its helpers then fail t, from t's goroutine, not the parent test (whose
// FailNow must not be called from a subtest).
func (d *daemon) forTest(t *testing.T) *daemon {
	c := *d
	c.t = t
	return &c
}

// startDaemon runs corrald with args added to the test's own, and
// CORRAL_SECRET_TEST=leak in its environment.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	// Not t.TempDir: its parent is 0700, and the test users must reach the
	// socket and the workspaces.
	dir, err := os.MkdirTemp("", "corral-sec-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testd.Config{
		Corrald: filepath.Join(binDir, "corrald"),
		Dir:     dir,
		Env:     []string{"CORRAL_SECRET_TEST=leak"},
		Args:    []string{"--socket-group", socketGroup},
	}
	if cgroupMount != "" {
		cfg.CgroupBase = testd.CgroupBase(t, cgroupMount, "corral-sec")
		cfg.Args = append(cfg.Args, "--scope", "cgroup")
	} else {
		cfg.Args = append(cfg.Args, "--scope", "pgroup")
	}
	cfg.Args = append(cfg.Args, args...)
	// A daemon started from a shell or a container entrypoint may inherit
	// fds without close-on-exec; give it one (its fd 3) so that tests can
	// check none reaches a child.
	inherited, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer inherited.Close()
	cfg.ExtraFiles = []*os.File{inherited}
	return &daemon{Daemon: testd.Start(t, cfg), t: t, dir: dir}
}

// as makes calls on d as user u (nil: as root, in this process) and
// returns one reply per call.
func (d *daemon) as(u *testUser, calls ...call) []reply {
	d.t.Helper()
	if u == nil {
		r, err := doCalls(d.Socket, calls)
		if err != nil {
			d.t.Fatalf("as root: %v", err)
		}
		return r
	}
	b, err := json.Marshal(calls)
	if err != nil {
		d.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testBin)
	cmd.Dir = "/"
	cmd.Env = []string{clientModeEnv + "=1", callsEnv + "=" + string(b), socketEnv + "=" + d.Socket, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		d.t.Fatalf("client as %s: %v: %s", u.name, err, errb.String())
	}
	var replies []reply
	if err := json.Unmarshal(out.Bytes(), &replies); err != nil {
		d.t.Fatalf("client as %s: output %q: %v", u.name, out.String(), err)
	}
	if len(replies) != len(calls) {
		d.t.Fatalf("client as %s: %d replies to %d calls", u.name, len(replies), len(calls))
	}
	return replies
}

// run starts p as u, waits until it is cleaned and returns the final record
// and its stdout and stderr.
func (d *daemon) run(u *testUser, p map[string]any) (api.Record, string, string) {
	d.t.Helper()
	var hits int64
	if d.pooled {
		hits = d.waitPool()
	}
	defer func() {
		if d.pooled {
			if info := d.info(); info.Pool == nil || info.Pool.Hits <= hits {
				d.t.Fatalf("the command did not go through a pooled shim: pool %+v", info.Pool)
			}
		}
	}()
	r := d.as(u,
		call{"exec.start", p},
		call{"exec.wait", map[string]any{"id": idPlaceholder}},
		call{"exec.output", map[string]any{"id": idPlaceholder, "stream": "stdout"}},
		call{"exec.output", map[string]any{"id": idPlaceholder, "stream": "stderr"}},
	)
	r[0].record(d.t)
	rec := r[1].record(d.t)
	if rec.State != api.StateCleaned {
		d.t.Fatalf("exec.wait returned state %s, want cleaned", rec.State)
	}
	return rec, outputData(d.t, r[2]), outputData(d.t, r[3])
}

func outputData(t *testing.T, r reply) string {
	t.Helper()
	if r.Code != 0 {
		t.Fatalf("exec.output: error %d %q", r.Code, r.Message)
	}
	var o api.OutputResult
	if err := json.Unmarshal(r.Result, &o); err != nil {
		t.Fatalf("exec.output: %v", err)
	}
	return string(o.Data)
}

// waitPool waits until a shim waits in the pool and returns the hits so
// far.
func (d *daemon) waitPool() int64 {
	d.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		info := d.info()
		if info.Pool != nil && info.Pool.Idle > 0 {
			return info.Pool.Hits
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("no shim waiting in the pool after 15s: %+v", info.Pool)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// info returns daemon.info as root.
func (d *daemon) info() api.Info {
	d.t.Helper()
	r := d.as(nil, call{Method: "daemon.info"})
	var info api.Info
	if r[0].Code != 0 || json.Unmarshal(r[0].Result, &info) != nil {
		d.t.Fatalf("daemon.info: %+v", r[0])
	}
	return info
}

// listIDs returns the ids exec.list shows u (nil: root).
func (d *daemon) listIDs(u *testUser) []string {
	d.t.Helper()
	r := d.as(u, call{"exec.list", map[string]any{}})
	if r[0].Code != 0 {
		d.t.Fatalf("exec.list: error %d %q", r[0].Code, r[0].Message)
	}
	var res api.ListResult
	if err := json.Unmarshal(r[0].Result, &res); err != nil {
		d.t.Fatal(err)
	}
	ids := []string{}
	for _, rec := range res.Executions {
		ids = append(ids, rec.ID)
	}
	sort.Strings(ids)
	return ids
}

// exitCode returns rec's exit code, failing the test when it has none.
func exitCode(t *testing.T, rec api.Record) int {
	t.Helper()
	if rec.ExitCode == nil {
		errText := ""
		if rec.Error != nil {
			errText = *rec.Error
		}
		outcome := ""
		if rec.Outcome != nil {
			outcome = string(*rec.Outcome)
		}
		t.Fatalf("execution %s has no exit code: outcome %q, error %q", rec.ID, outcome, errText)
	}
	return *rec.ExitCode
}
