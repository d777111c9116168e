// Package integration runs a real corrald on this host (cgroup v2 and
// process-group backends) and talks to it the way clients do: over its
// socket with the Go client, raw JSON-RPC lines, and corralctl.
package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

var (
	binDir     string // corrald and corralctl built for this run
	cgroupRoot string // the cgroup2 mount the daemons' bases go below, or ""
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(testenv.SkipSuite("integration", "needs root"))
	}
	dir, err := testd.Build("corral-bin-", "corrald", "corralctl", "corral-shim")
	if err != nil {
		fmt.Printf("integration: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	cgroupRoot = testd.Cgroup2Mount()
	code := testenv.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is a corrald started for one test.
type daemon struct {
	*testd.Daemon
	t *testing.T
}

// startDaemon runs corrald on the test's own socket, state directory and
// cgroup base, with args added.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	cfg := testd.Config{Corrald: filepath.Join(binDir, "corrald"), Dir: t.TempDir(), Args: args}
	if cgroupRoot != "" {
		cfg.CgroupBase = testd.CgroupBase(t, cgroupRoot, "corral-it")
	}
	return &daemon{Daemon: testd.Start(t, cfg), t: t}
}

// ctl runs corralctl against d and returns its exit code, stdout, stderr.
func (d *daemon) ctl(args ...string) (int, string, string) {
	d.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "corralctl"), args...)
	cmd.Env = append(os.Environ(), "CORRAL_SOCKET="+d.Socket)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatalf("corralctl: %v", err)
	}
	return code, out.String(), errb.String()
}

func (d *daemon) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Pid()))
	if err != nil {
		d.t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// waitPeakRSS waits (exec.wait on c) for execution id while it samples the
// daemon's RSS every 20ms until the execution is cleaned; it returns the
// record and the highest RSS sampled.
func (d *daemon) waitPeakRSS(c *ipc.Client, id string) (api.Record, int64) {
	d.t.Helper()
	var peak int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := c.Get(context.Background(), id)
			if err != nil || r.State == api.StateCleaned {
				return
			}
			peak = max(peak, d.rss())
			time.Sleep(20 * time.Millisecond)
		}
	}()
	rec, err := c.Wait(context.Background(), api.WaitParams{ID: id})
	<-done
	if err != nil {
		d.t.Fatal(err)
	}
	return rec, peak
}

func backends() []string { return []string{"cgroup", "pgroup"} }

func TestCorralctlExitCodes(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			d := startDaemon(t, "--scope", b)
			for _, tc := range []struct {
				name string
				args []string
				want int
				out  string
			}{
				{"exit 0", []string{"run", "--", "sh", "-c", "echo out; echo err >&2"}, 0, "out\n"},
				{"exit 42", []string{"run", "--", "sh", "-c", "exit 42"}, 42, ""},
				{"exit 255", []string{"run", "--", "sh", "-c", "exit 255"}, 255, ""},
				{"timeout", []string{"run", "--timeout", "300ms", "--", "sleep", "30"}, 124, ""},
				{"killed by signal", []string{"run", "--", "sh", "-c", "kill -9 $$"}, 128 + 9, ""},
				{"not found", []string{"run", "--", "no-such-corral-cmd"}, 127, ""},
				{"refused", []string{"run", "--env", "A=B=C", "--cwd", "relative", "--", "true"}, 125, ""},
			} {
				t.Run(tc.name, func(t *testing.T) {
					code, out, errs := d.ctl(tc.args...)
					if code != tc.want {
						t.Errorf("corralctl %v exit = %d, want %d (stderr %q)", tc.args, code, tc.want, errs)
					}
					if tc.out != "" && out != tc.out {
						t.Errorf("stdout = %q, want %q", out, tc.out)
					}
				})
			}
		})
	}
}

func TestBackgroundAndEscapedDescendantsAreKilled(t *testing.T) {
	cases := []struct {
		backend, name, script string
	}{
		{"pgroup", "background", "sleep 1000 & echo $!"},
		{"cgroup", "background", "sleep 1000 & echo $!"},
		{"cgroup", "setsid double fork", `setsid sh -c 'sleep 1000 & echo $!' ; sleep 0.1`},
	}
	for _, tc := range cases {
		t.Run(tc.backend+"/"+tc.name, func(t *testing.T) {
			d := startDaemon(t, "--scope", tc.backend)
			c := d.Client()
			rec, err := c.Start(context.Background(), api.StartParams{Argv: []string{"sh", "-c", tc.script}})
			if err != nil {
				t.Fatal(err)
			}
			rec, err = c.Wait(context.Background(), api.WaitParams{ID: rec.ID})
			if err != nil || rec.State != api.StateCleaned {
				t.Fatalf("wait = %v %v", rec.State, err)
			}
			out, err := c.Output(context.Background(), api.OutputParams{ID: rec.ID})
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(out.Data)))
			if err != nil {
				t.Fatalf("child pid from %q: %v", out.Data, err)
			}
			waitGone(t, pid)
			if rec.Error != nil {
				t.Errorf("record error = %q, want none", *rec.Error)
			}
		})
	}
}

// waitGone fails the test (and kills pid) unless pid is gone within 10s.
// At cleaned the cgroup is empty, but an orphaned descendant that the
// kill ended may still be a zombie: corrald (its subreaper) reaps it on
// SIGCHLD a moment later.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			t.Errorf("descendant %d still exists 10s after cleaned: %s", pid, stat)
			exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawConn speaks JSON-RPC lines directly.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (d *daemon) raw() *rawConn {
	c, err := net.Dial("unix", d.Socket)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close() })
	return &rawConn{t: d.t, c: c, br: bufio.NewReaderSize(c, 1<<16)}
}

func (r *rawConn) roundTrip(line string) map[string]any {
	r.t.Helper()
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.c.Write([]byte(line + "\n")); err != nil {
		r.t.Fatalf("write: %v", err)
	}
	resp, err := r.br.ReadBytes('\n')
	if err != nil {
		r.t.Fatalf("read reply to %.60q: %v", line, err)
	}
	var m map[string]any
	if err := json.Unmarshal(resp, &m); err != nil {
		r.t.Fatalf("reply %q: %v", resp, err)
	}
	return m
}

func errCode(m map[string]any) int {
	e, ok := m["error"].(map[string]any)
	if !ok {
		return 0
	}
	return int(e["code"].(float64))
}

func TestMalformedInputGetsErrorsWhileOthersRunOn(t *testing.T) {
	d := startDaemon(t, "--scope", "cgroup")
	// Another client keeps working throughout.
	other := d.Client()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			rec, err := other.Start(context.Background(), api.StartParams{Argv: []string{"sh", "-c", "echo " + strconv.Itoa(i)}})
			if err != nil {
				t.Errorf("other client start: %v", err)
				return
			}
			if rec, err = other.Wait(context.Background(), api.WaitParams{ID: rec.ID}); err != nil || *rec.ExitCode != 0 {
				t.Errorf("other client wait: %v", err)
				return
			}
		}
	}()
	r := d.raw()
	for _, tc := range []struct {
		name, line string
		code       int
		message    string
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":1,"method":`, -32700, ""},
		{"not an object", `42`, -32600, ""},
		{"unknown method", `{"jsonrpc":"2.0","id":2,"method":"exec.frobnicate"}`, -32601, ""},
		{"bad params type", `{"jsonrpc":"2.0","id":3,"method":"exec.start","params":{"argv":["true"],"timeout_ms":"soon"}}`, -32602, "timeout_ms"},
		{"missing argv", `{"jsonrpc":"2.0","id":4,"method":"exec.start","params":{}}`, -32602, "argv"},
		{"bad env name", `{"jsonrpc":"2.0","id":5,"method":"exec.start","params":{"argv":["true"],"env":{"A=B":"c"}}}`, -32602, "env"},
		{"unknown id", `{"jsonrpc":"2.0","id":6,"method":"exec.get","params":{"id":"nope"}}`, -32001, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := r.roundTrip(tc.line)
			if got := errCode(m); got != tc.code {
				t.Errorf("code = %d, want %d (reply %v)", got, tc.code, m)
			}
			if tc.message != "" {
				msg, _ := m["error"].(map[string]any)["message"].(string)
				if !strings.Contains(msg, tc.message) {
					t.Errorf("message %q does not name %s", msg, tc.message)
				}
			}
		})
	}
	// The same connection still works after all of that.
	if m := r.roundTrip(`{"jsonrpc":"2.0","id":9,"method":"daemon.info"}`); m["result"] == nil {
		t.Errorf("daemon.info after errors = %v", m)
	}
	// An oversize line: -32600, then that connection (only) is closed.
	big := d.raw()
	big.c.SetDeadline(time.Now().Add(10 * time.Second))
	go big.c.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"exec.start","params":{"argv":["` + strings.Repeat("a", 2<<20) + "\"]}}\n"))
	resp, err := big.br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("oversize: no reply: %v", err)
	}
	var m map[string]any
	json.Unmarshal(resp, &m)
	if errCode(m) != -32600 {
		t.Errorf("oversize line code = %d, want -32600", errCode(m))
	}
	if _, err := big.br.ReadBytes('\n'); err == nil {
		t.Error("connection still open after an oversize line")
	}
	wg.Wait()
	if m := r.roundTrip(`{"jsonrpc":"2.0","id":10,"method":"daemon.info"}`); m["result"] == nil {
		t.Errorf("first connection broken by another's oversize line: %v", m)
	}
}

func TestGigabyteOutputKeepsDaemonRSSBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GB of output") // not an environment skip
	}
	d := startDaemon(t, "--scope", "cgroup")
	c := d.Client()
	before := d.rss()
	rec, err := c.Start(context.Background(), api.StartParams{Argv: []string{"head", "-c", "1000000000", "/dev/zero"}, TimeoutMS: 120000})
	if err != nil {
		t.Fatal(err)
	}
	rec, peak := d.waitPeakRSS(c, rec.ID)
	if rec.Stdout.TotalBytes != 1e9 || !rec.Stdout.Truncated || rec.Stdout.KeptBytes != api.DefaultOutputLimitBytes {
		t.Errorf("stdout = %+v", rec.Stdout)
	}
	if grew := peak - before; grew > 48<<20 {
		t.Errorf("daemon RSS grew by %d MiB during 1 GB of output", grew>>20)
	}
	t.Logf("daemon RSS before %d MiB, peak %d MiB", before>>20, peak>>20)
}

func TestInfoReportsHost(t *testing.T) {
	d := startDaemon(t, "--scope", "cgroup")
	info, err := d.Client().Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Backend != "cgroup" || !info.Pidfd || info.Kernel == "" || info.Cgroup == "" {
		t.Errorf("info = %+v", info)
	}
	// corral-shim sits next to corrald, as make install puts it.
	if got, want := info.Checks["shim"], filepath.Join(binDir, "corral-shim"); got != want {
		t.Errorf("daemon.info checks.shim = %q, want %q", got, want)
	}
	code, out, _ := d.ctl("info", "--json")
	if code != 0 || !strings.Contains(out, `"backend": "cgroup"`) && !strings.Contains(out, `"backend":"cgroup"`) {
		t.Errorf("corralctl info --json = %d %q", code, out)
	}
}

// TestShimChoices: a command that needs the shim (network none) runs
// through corral-shim, through corrald itself with --shim self, and an
// unusable --shim stops corrald at start-up with the reason.
func TestShimChoices(t *testing.T) {
	for _, shimFlag := range []string{filepath.Join(binDir, "corral-shim"), "self"} {
		d := startDaemon(t, "--scope", "cgroup", "--pool-size", "0", "--shim", shimFlag)
		info, err := d.Client().Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.Checks["shim"] != shimFlag {
			t.Errorf("--shim %s: daemon.info checks.shim = %q", shimFlag, info.Checks["shim"])
		}
		code, out, errOut := d.ctl("run", "--network", "none", "--", "cat", "/proc/net/dev")
		if code != 0 || !strings.Contains(out, "lo:") || strings.Contains(out, "eth") {
			t.Errorf("--shim %s: network none run = %d %q %q", shimFlag, code, out, errOut)
		}
	}
	bad := filepath.Join(t.TempDir(), "corral-shim")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\n"), 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(bad, 0o777)
	out, err := exec.Command(filepath.Join(binDir, "corrald"), "--shim", bad, "--socket", filepath.Join(t.TempDir(), "s.sock"),
		"--state-dir", t.TempDir(), "--scope", "pgroup").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "writable by group or others") {
		t.Errorf("corrald --shim <world-writable file> = %v, %s; want a refusal naming why", err, out)
	}
}

func TestWaiterFallbackThroughDaemon(t *testing.T) {
	d := startDaemon(t, "--scope", "pgroup", "--no-pidfd")
	code, out, _ := d.ctl("run", "--", "sh", "-c", "echo fallback; exit 5")
	if code != 5 || out != "fallback\n" {
		t.Errorf("run = %d %q, want 5 fallback", code, out)
	}
	info, _ := d.Client().Info(context.Background())
	if info.Pidfd {
		t.Error("daemon.info pidfd = true under --no-pidfd")
	}
}

// fdCount is the number of fds corrald holds, not counting the store's
// database files (its read pool opens bounded connections lazily; storeFds
// checks that bound): the least of a few samples.
func (d *daemon) fdCount() int {
	d.t.Helper()
	least := -1
	for i := 0; i < 5; i++ {
		n, _ := d.fds()
		if least < 0 || n < least {
			least = n
		}
		time.Sleep(20 * time.Millisecond)
	}
	return least
}

// fds counts corrald's fds other than its store's files, and those.
func (d *daemon) fds() (other, store int) {
	dir := fmt.Sprintf("/proc/%d/fd", d.Pid())
	ents, err := os.ReadDir(dir)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, e := range ents {
		l, _ := os.Readlink(dir + "/" + e.Name())
		if strings.HasPrefix(l, d.StateDir+"/corral.") { // corral.db, -wal, -shm, corral.lock
			store++
		} else {
			other++
		}
	}
	return other, store
}

// children lists corrald's child processes with their states.
func (d *daemon) children() []string {
	var out []string
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", d.Pid()))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", d.Pid(), task.Name()))
		for _, pid := range strings.Fields(string(b)) {
			stat, _ := os.ReadFile("/proc/" + pid + "/stat")
			out = append(out, string(stat))
		}
	}
	return out
}

// 1,000 runs through the daemon, half of them cancelled mid-run, leave
// corrald with the fds it had and no child, zombie or not.
func TestNoLeakInDaemonAfterThousandRuns(t *testing.T) {
	// No warm pool: its waiting shims are children holding fds by design,
	// and would be counted here (the pool's own leaks are tested in
	// reactor and tests/security).
	d := startDaemon(t, "--scope", "cgroup", "--pool-size", "0")
	c := d.Client()
	run := func(i int) {
		p := api.StartParams{Argv: []string{"true"}, Cwd: "/"}
		if i%2 == 1 {
			p = api.StartParams{Argv: []string{"sleep", "10"}, Cwd: "/", GraceMS: 100}
		}
		rec, err := c.Start(context.Background(), p)
		if err != nil {
			t.Errorf("start: %v", err)
			return
		}
		if i%2 == 1 {
			if _, err := c.Cancel(context.Background(), api.CancelParams{ID: rec.ID}); err != nil {
				t.Errorf("cancel: %v", err)
			}
		}
		rec, err = c.Wait(context.Background(), api.WaitParams{ID: rec.ID})
		if err != nil || rec.State != api.StateCleaned {
			t.Errorf("wait: %v %v", rec.State, err)
		}
	}
	burst := func(n int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := 0; i < n; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				run(i)
			}()
		}
		wg.Wait()
	}
	// Warm up at the same concurrency: the store's read pool opens its
	// (bounded) connections lazily.
	burst(64)
	before := d.fdCount()
	burst(1000)
	// The store: a lock, the shared-memory file, and the database and its
	// WAL for the writer, the checkpointer (26da3e1) and at most four
	// readers.
	if _, st := d.fds(); st > 2+2*6 {
		t.Errorf("corrald holds %d fds of its store, want at most %d", st, 2+2*6)
	}
	if after := d.fdCount(); after != before {
		var links []string
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Pid()))
		for _, e := range ents {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", d.Pid(), e.Name()))
			links = append(links, e.Name()+"->"+l)
		}
		t.Errorf("corrald holds %d fds after 1000 runs, %d before: %v", after, before, links)
	}
	if kids := d.children(); len(kids) != 0 {
		t.Errorf("corrald still has children: %v", kids)
	}
}
