// Package mcp tests `corralctl mcp` against a real corrald with an MCP
// client that is not corral's own: the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in node/package.json; .ci/run installs
// it with npm ci) run by node. The script node/session.mjs does the MCP
// session and prints one JSON line per check, which this test turns into
// subtests; it asks this test to stop, start and restart corrald where it
// checks reconnection. The MCP servers run as the unprivileged users
// corral-a and corral-b (created here if missing), so ownership is
// corrald's own SO_PEERCRED check. Needs root and a cgroup2 hierarchy.
package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"
	"github.com/corral-dev/corral/tests/testd"

	"github.com/corral-dev/corral/tests/testenv"
)

const (
	userA = "corral-a"
	userB = "corral-b"
)

var (
	binDir     string
	cgroupRoot string
	nodeDir    string // tests/mcp/node, with node_modules installed
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(testenv.SkipSuite("mcp", "needs root (runs corrald, MCP servers as corral-a and corral-b)"))
	}
	var undo []func()
	for _, name := range []string{userA, userB} {
		if _, err := user.Lookup(name); err == nil {
			continue
		}
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
			fmt.Printf("mcp: useradd %s: %v: %s\n", name, err, out)
			os.Exit(1)
		}
		undo = append(undo, func() { _ = exec.Command("userdel", name).Run() })
	}
	dir, err := testd.Build("corral-mcp-bin-", "corrald", "corralctl", "corral-shim")
	if err != nil {
		fmt.Printf("mcp: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	cgroupRoot = testd.Cgroup2Mount()
	wd, _ := os.Getwd()
	nodeDir = filepath.Join(wd, "node")
	code := testenv.Main(m)
	os.RemoveAll(dir)
	for _, f := range undo {
		f()
	}
	os.Exit(code)
}

// daemonDir returns a directory for a daemon's socket and state that the
// test users can traverse (t.TempDir is 0700).
func daemonDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "corral-mcp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startDaemon runs corrald with a socket every local user may use, in dir.
// n tells the log files of restarts apart.
func startDaemon(t *testing.T, dir, cgroupBase string, n int) *testd.Daemon {
	t.Helper()
	return testd.Start(t, testd.Config{
		Name: fmt.Sprintf("#%d", n), Corrald: filepath.Join(binDir, "corrald"), Dir: dir,
		LogPath: filepath.Join(dir, fmt.Sprintf("corrald-%d.log", n)), CgroupBase: cgroupBase,
		Args: []string{"--scope", "cgroup", "--socket-mode", "0666", "--socket-group", ""},
	})
}

func requireNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed (.ci/run installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed: run `npm ci --prefix %s` (.ci/run does): %v", nodeDir, err)
	}
}

// TestTypeScriptClient runs node/session.mjs: initialize, tools/list,
// exec_command quick and long, read_output with wait_ms, write_stdin to
// python3 -i on a terminal, cancel_execution of a tree with a double-forked
// child, list_executions, each bad input answered with isError, ownership
// between two users' MCP servers, and corrald down, back and restarted.
func TestTypeScriptClient(t *testing.T) {
	requireNode(t)
	if cgroupRoot == "" {
		t.Fatal("no cgroup2 hierarchy for --scope cgroup")
	}
	dir := daemonDir(t)
	base := testd.CgroupBase(t, cgroupRoot, "corral-mcp")
	n := 0
	d := startDaemon(t, dir, base, n)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "session.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(),
		"CORRALCTL="+filepath.Join(binDir, "corralctl"), "CORRAL_SOCKET="+d.Socket,
		"MCP_USER_A="+userA, "MCP_USER_B="+userB)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	checks := 0
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line struct {
			Check  string `json:"check"`
			OK     bool   `json:"ok"`
			Detail string `json:"detail"`
			Pause  string `json:"pause"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Logf("node: %s", sc.Text())
			continue
		}
		switch line.Pause {
		case "stop":
			if err := d.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("stop corrald: %v", err)
			}
		case "start":
			n++
			d = startDaemon(t, dir, base, n)
		case "handover":
			handover(t, d)
		case "restart":
			if err := d.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("stop corrald: %v", err)
			}
			n++
			d = startDaemon(t, dir, base, n)
		}
		if line.Pause != "" {
			if _, err := io.WriteString(stdin, "go\n"); err != nil {
				t.Errorf("resume node: %v", err)
			}
			continue
		}
		checks++
		t.Run(line.Check, func(t *testing.T) {
			if !line.OK {
				t.Error(line.Detail)
			} else if testing.Verbose() && line.Detail != "" {
				t.Log(testd.Tail(line.Detail, 600))
			}
		})
	}
	stdin.Close()
	err = cmd.Wait()
	if err != nil {
		t.Errorf("node session.mjs: %v\nstderr:\n%s", err, testd.Tail(stderr.String(), 4000))
	}
	if checks < 20 {
		t.Errorf("only %d checks reported; stderr:\n%s", checks, testd.Tail(stderr.String(), 4000))
	}
}

// mcpProc is a `corralctl mcp` driven with raw JSON-RPC lines, for what the
// SDK client hides: the server's exit when its stdin closes.
type mcpProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	next int
	errb strings.Builder
}

func startMCP(t *testing.T, socket string, args ...string) *mcpProc {
	t.Helper()
	p := &mcpProc{t: t}
	p.cmd = exec.Command(filepath.Join(binDir, "corralctl"), append([]string{"mcp"}, args...)...)
	p.cmd.Env = []string{"CORRAL_SOCKET=" + socket}
	p.cmd.Stderr = &p.errb
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewScanner(out)
	p.out.Buffer(make([]byte, 1<<20), 16<<20)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	p.request("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	p.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	return p
}

func (p *mcpProc) send(m any) {
	p.t.Helper()
	b, _ := json.Marshal(m)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("write to corralctl mcp: %v", err)
	}
}

// request sends method and returns the response's result.
func (p *mcpProc) request(method string, params any) json.RawMessage {
	p.t.Helper()
	p.next++
	id := p.next
	p.send(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	for p.out.Scan() {
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(p.out.Bytes(), &m) != nil || m.ID != id {
			continue
		}
		if m.Error != nil {
			p.t.Fatalf("%s: error %s", method, m.Error)
		}
		return m.Result
	}
	p.t.Fatalf("%s: no response (%v); stderr: %s", method, p.out.Err(), p.errb.String())
	return nil
}

// startSleep calls exec_command with a command that outlives the session.
func (p *mcpProc) startSleep() string {
	p.t.Helper()
	res := p.request("tools/call", map[string]any{"name": "exec_command",
		"arguments": map[string]any{"cmd": "sleep 60", "yield_time_ms": 0, "timeout_ms": 120000}})
	var r struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			ID      string `json:"id"`
			Running bool   `json:"running"`
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.IsError || !r.StructuredContent.Running {
		p.t.Fatalf("exec_command: %s (%v)", res, err)
	}
	return r.StructuredContent.ID
}

// closeAndWait closes the server's stdin and waits for it to exit.
func (p *mcpProc) closeAndWait(within time.Duration) {
	p.t.Helper()
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("corralctl mcp after stdin closed: %v; want exit 0; stderr: %s", err, p.errb.String())
		}
	case <-time.After(within):
		p.cmd.Process.Kill()
		<-done
		p.t.Fatalf("corralctl mcp still running %v after its stdin closed", within)
	}
}

// TestStdinClosedExitsCleanly: when the client closes stdin the server
// exits 0 and the execution it started keeps running in corrald.
func TestStdinClosedExitsCleanly(t *testing.T) {
	d := startDaemon(t, daemonDir(t), testd.CgroupBase(t, cgroupRoot, "corral-mcp"), 0)
	p := startMCP(t, d.Socket)
	id := p.startSleep()
	p.closeAndWait(10 * time.Second)

	c := d.Client()
	rec, err := c.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != api.StateRunning {
		t.Errorf("execution after the MCP server exited: state %s, want running", rec.State)
	}
	if _, err := c.Cancel(context.Background(), api.CancelParams{ID: id}); err != nil {
		t.Error(err)
	}
}

// TestCancelOnExit: with --cancel-on-exit, the session's executions are
// cancelled when the client goes away.
func TestCancelOnExit(t *testing.T) {
	d := startDaemon(t, daemonDir(t), testd.CgroupBase(t, cgroupRoot, "corral-mcp"), 0)
	p := startMCP(t, d.Socket, "--cancel-on-exit")
	id := p.startSleep()
	p.closeAndWait(20 * time.Second)

	timeout := int64(10000)
	rec, err := d.Client().Wait(context.Background(), api.WaitParams{ID: id, TimeoutMS: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome == nil || *rec.Outcome != api.OutcomeCancelled {
		t.Errorf("execution after the MCP server exited with --cancel-on-exit: outcome %v, want cancelled", rec.Outcome)
	}
}

// handover sends corrald SIGHUP and returns once the new image answers
// daemon.info (a later started_at, the same pid).
func handover(t *testing.T, d *testd.Daemon) {
	t.Helper()
	info := func() (api.Info, error) {
		c, err := ipc.Dial(d.Socket)
		if err != nil {
			return api.Info{}, err
		}
		defer c.Close()
		return c.Info(context.Background())
	}
	before, err := info()
	if err != nil {
		t.Errorf("daemon.info before the handover: %v", err)
		return
	}
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Errorf("SIGHUP corrald: %v", err)
		return
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if after, err := info(); err == nil && after.StartedAt.After(before.StartedAt) {
			if after.PID != before.PID {
				t.Errorf("after the handover corrald is pid %d, was %d", after.PID, before.PID)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("corrald did not answer as a new image within 20s of SIGHUP")
}
