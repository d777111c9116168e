package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/tests/testd"
)

// mcpN is the number of samples per side of the mcp comparison; mcpWU the
// unrecorded warm-up rounds.
var mcpN, mcpWU = 200, 10

// desktopCommanderEntry is DesktopCommanderMCP's server, installed by
// `make bench` (npm ci --ignore-scripts in bench/node) when the npm registry
// is reachable.
const desktopCommanderEntry = "node/node_modules/@wonderwhy-er/desktop-commander/dist/index.js"

// benchMCP: one /bin/true as an agent's shell tool call. The same command
// through corralctl mcp (exec_command, the official Go SDK's client over
// stdio, one session for all calls), through the Go client directly
// (exec.start + exec.wait), and through DesktopCommanderMCP's start_process
// (the most used MCP shell server) when it is installed. Each MCP side is one
// long-lived server process, as an agent runs it; the calls alternate.
func (s *suite) benchMCP(t *testing.T) {
	d := s.startDaemon(t, "cgroup-mcp", "cgroup", 2)
	c := d.Client()
	ctx := ctxT(t, 10*time.Minute)

	dir, err := testd.Build("corral-bench-mcp-", "corralctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cmd := exec.Command(filepath.Join(dir, "corralctl"), "mcp")
	cmd.Env = []string{"CORRAL_SOCKET=" + d.Socket}
	corral := connectMCP(t, ctx, cmd)
	callCorral := func() time.Duration {
		t0 := time.Now()
		res, err := corral.CallTool(ctx, &mcp.CallToolParams{Name: "exec_command",
			Arguments: map[string]any{"argv": []string{"/bin/true"}, "yield_time_ms": 10000}})
		took := time.Since(t0)
		var st struct {
			ExitCode *int `json:"exit_code"`
			Running  bool `json:"running"`
		}
		if err != nil || res.IsError || remarshal(res.StructuredContent, &st) != nil || st.Running || st.ExitCode == nil || *st.ExitCode != 0 {
			t.Fatalf("exec_command /bin/true: %v %s", err, resultText(res))
		}
		return took
	}

	var dc *mcp.ClientSession
	dcWhy := ""
	if _, err := os.Stat(desktopCommanderEntry); err != nil {
		dcWhy = "not installed (make bench runs npm ci in bench/node; the npm registry was unreachable?)"
	} else if _, err := exec.LookPath("node"); err != nil {
		dcWhy = "node is not installed"
	} else {
		// Its own home, with telemetry off: it writes its config and logs there.
		home := t.TempDir()
		os.MkdirAll(filepath.Join(home, ".claude-server-commander"), 0o755)
		os.WriteFile(filepath.Join(home, ".claude-server-commander", "config.json"), []byte(`{"telemetryEnabled": false}`), 0o644)
		cmd := exec.Command("node", desktopCommanderEntry)
		cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
		dc = connectMCP(t, ctx, cmd)
	}
	dcExit := 0 // answers of start_process that gave the exit code
	callDC := func() time.Duration {
		t0 := time.Now()
		res, err := dc.CallTool(ctx, &mcp.CallToolParams{Name: "start_process",
			Arguments: map[string]any{"command": "/bin/true", "timeout_ms": 10000}})
		took := time.Since(t0)
		if err != nil || res.IsError {
			t.Fatalf("start_process /bin/true: %v %s", err, resultText(res))
		}
		// It answers once the process has ended (or timeout_ms passed);
		// its answer may or may not carry the exit code, which is counted.
		txt := resultText(res)
		if !strings.Contains(txt, "Process started with PID") {
			t.Fatalf("start_process /bin/true: unexpected answer: %s", txt)
		}
		if strings.Contains(txt, "exit code 0") {
			dcExit++
		}
		return took
	}

	var viaMCP, viaGo, viaDC durations
	for i := 0; i < mcpWU+mcpN; i++ {
		rec := i >= mcpWU
		add := func(ds *durations, v time.Duration) {
			if rec {
				*ds = append(*ds, v)
			}
		}
		sides := []func(){
			func() { add(&viaMCP, callCorral()) },
			func() { add(&viaGo, runWait(t, ctx, c, nil)) },
		}
		if dc != nil {
			sides = append(sides, func() { add(&viaDC, callDC()) })
		}
		rotate(i, sides...)
	}
	rows := []latencyRow{
		{name: "agent shell tool call, /bin/true", side: "corralctl mcp exec_command", baseName: "Go client exec.start+exec.wait", side1: viaMCP, base: viaGo},
	}
	note := "One MCP session per server (the official Go SDK client over stdio), calls alternating with the Go client on the same corrald (cgroup, pool 2)."
	if dc != nil {
		rows = append(rows, latencyRow{name: "agent shell tool call, /bin/true", side: "corralctl mcp exec_command", baseName: "DesktopCommanderMCP start_process", side1: viaMCP, base: viaDC})
		note += fmt.Sprintf(" DesktopCommanderMCP %s (node %s, telemetry off) answered with the exit code in %d of %d calls; exec_command in all of them.",
			desktopCommanderVersion(), nodeVersion(), dcExit, mcpWU+mcpN)
	} else {
		note += " DesktopCommanderMCP: " + dcWhy + "."
	}
	s.latencyTable("MCP: exec_command round trip", note, rows)
}

// connectMCP starts cmd as an MCP server and initialises a session with
// it; the session is closed (and the server ends) with the test.
func connectMCP(t *testing.T, ctx context.Context, cmd *exec.Cmd) *mcp.ClientSession {
	t.Helper()
	cl := mcp.NewClient(&mcp.Implementation{Name: "corral-bench", Version: "1"}, nil)
	cs, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to MCP server %s: %v", cmd.Path, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func remarshal(v any, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

func resultText(res *mcp.CallToolResult) string {
	if res == nil {
		return "(no result)"
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	if res.IsError {
		return fmt.Sprintf("isError: %s", b.String())
	}
	return b.String()
}

func desktopCommanderVersion() string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(desktopCommanderEntry)), "package.json"))
	var v struct {
		Version string `json:"version"`
	}
	if err != nil || json.Unmarshal(b, &v) != nil {
		return "(version unknown)"
	}
	return v.Version
}

func nodeVersion() string {
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
