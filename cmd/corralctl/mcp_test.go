package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connectInMemory runs the MCP server on an in-memory transport with a
// socket where no corrald listens, and returns a client session to it.
func connectInMemory(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s := newMCPSession(filepath.Join(t.TempDir(), "no-corrald.sock"))
	srv := newMCPServer(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestMCPToolsList(t *testing.T) {
	cs := connectInMemory(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		byName[tl.Name] = tl
	}
	for _, name := range toolNames {
		tl := byName[name]
		if tl == nil {
			t.Fatalf("tools/list has no %s (has %v)", name, byName)
		}
		if tl.OutputSchema == nil || tl.Annotations == nil || tl.Description == "" {
			t.Errorf("%s: output schema %v, annotations %v, description %q", name, tl.OutputSchema, tl.Annotations, tl.Description)
		}
	}
	if len(byName) != len(toolNames) {
		t.Errorf("tools/list has %d tools, want %d", len(byName), len(toolNames))
	}
	for name, want := range map[string]bool{"exec_command": true, "cancel_execution": true, "write_stdin": true} {
		if a := byName[name].Annotations; a.DestructiveHint == nil || *a.DestructiveHint != want || a.ReadOnlyHint {
			t.Errorf("%s annotations = %+v, want destructiveHint", name, a)
		}
	}
	for _, name := range []string{"read_output", "list_executions"} {
		if !byName[name].Annotations.ReadOnlyHint {
			t.Errorf("%s: readOnlyHint false", name)
		}
	}
	var in struct {
		Properties map[string]struct {
			Type    any `json:"type"`
			Default any `json:"default"`
		} `json:"properties"`
		AdditionalProperties any `json:"additionalProperties"`
	}
	b, _ := json.Marshal(byName["exec_command"].InputSchema)
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	for prop, typ := range map[string]string{"cmd": "string", "argv": "array", "env": "object", "labels": "object", "tty": "boolean", "yield_time_ms": "integer"} {
		if got := in.Properties[prop].Type; got != typ {
			t.Errorf("exec_command %s type = %v, want %s", prop, got, typ)
		}
	}
	if d := in.Properties["yield_time_ms"].Default; d != float64(defaultYieldMS) {
		t.Errorf("yield_time_ms default = %v, want %d", d, defaultYieldMS)
	}
	if in.AdditionalProperties == nil {
		t.Errorf("exec_command input allows any property: %s", b)
	}
	var list struct {
		Properties map[string]struct {
			Enum []string `json:"enum"`
		} `json:"properties"`
	}
	b, _ = json.Marshal(byName["list_executions"].InputSchema)
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(list.Properties["state"].Enum, " "), "started running canceling exited cleaned"; got != want {
		t.Errorf("list_executions state enum = %q, want %q", got, want)
	}
}

// TestMCPErrorsWithoutCorrald: every failure is an isError result that
// says what to do, also when corrald is not running.
func TestMCPErrorsWithoutCorrald(t *testing.T) {
	cs := connectInMemory(t)
	tests := []struct {
		name, tool string
		args       map[string]any
		want       string
	}{
		{"unknown tool", "rm_rf", map[string]any{}, "unknown tool \"rm_rf\""},
		{"no command", "exec_command", map[string]any{}, "missing command"},
		{"wrong type", "exec_command", map[string]any{"cmd": 5}, "inputSchema"},
		{"unknown argument", "read_output", map[string]any{"id": "x", "bogus": true}, "bogus"},
		{"budget too small", "exec_command", map[string]any{"cmd": "true", "max_output_bytes": 1}, "max_output_bytes"},
		{"wait too long", "read_output", map[string]any{"id": "x", "wait_ms": 600000}, "wait_ms"},
		{"empty id", "cancel_execution", map[string]any{"id": " "}, "missing id"},
		{"corrald down", "exec_command", map[string]any{"cmd": "true"}, "not reachable"},
		{"corrald down, list", "list_executions", map[string]any{}, "call the tool again"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args})
			if err != nil {
				t.Fatalf("CallTool: %v (want an isError result, not a protocol error)", err)
			}
			text := resultTextOf(res)
			if !res.IsError || !strings.Contains(text, tt.want) {
				t.Errorf("%s %v = isError %v %q, want isError saying %q", tt.tool, tt.args, res.IsError, text, tt.want)
			}
		})
	}
}

func resultTextOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
