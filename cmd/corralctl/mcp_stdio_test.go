package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPSurvivesALineThatIsNotAMessage: a stray line on stdin (not JSON, or
// JSON that is not a JSON-RPC message) is answered with a JSON-RPC error and
// the session goes on; before, the SDK ended the session there and the
// answers still due were never written.
// mcpRaw is a corralctl mcp driven with raw lines.
type mcpRaw struct {
	t      *testing.T
	inW    *io.PipeWriter
	lines  chan json.RawMessage
	code   chan int
	stderr *strings.Builder
}

// startMCPRaw starts corralctl mcp (with no corrald behind it) and
// initializes it with the given protocol revision.
func startMCPRaw(t *testing.T, protocol string) *mcpRaw {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &strings.Builder{}
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	e := &env{stdin: inR, stdout: outW, stderr: stderr, getenv: func(k string) string {
		if k == "CORRAL_SOCKET" {
			return sock
		}
		return ""
	}}
	m := &mcpRaw{t: t, inW: inW, lines: make(chan json.RawMessage, 16), code: make(chan int, 1), stderr: stderr}
	go func() {
		c := Main([]string{"mcp"}, e)
		outW.Close()
		inR.Close() // a send after the end fails instead of blocking
		m.code <- c
	}()
	go func() {
		defer close(m.lines)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if !json.Valid(sc.Bytes()) {
				t.Errorf("stdout line is not JSON: %q", sc.Text())
				continue
			}
			m.lines <- append(json.RawMessage(nil), sc.Bytes()...)
		}
	}()
	t.Cleanup(func() { m.finish() })
	m.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + protocol + `","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	var init struct {
		ID     any
		Result struct{ ProtocolVersion string }
	}
	if json.Unmarshal(m.nextRaw(), &init) != nil || init.ID != float64(1) || init.Result.ProtocolVersion != protocol {
		t.Fatalf("initialize answer = %+v, want protocol %s", init, protocol)
	}
	m.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return m
}

func (m *mcpRaw) send(s string) {
	m.t.Helper()
	if _, err := io.WriteString(m.inW, s+"\n"); err != nil {
		m.t.Fatalf("write %.80q: %v", s, err)
	}
}

func (m *mcpRaw) nextRaw() json.RawMessage {
	m.t.Helper()
	l, ok := <-m.lines
	if !ok {
		m.t.Fatalf("corralctl mcp ended early (stderr %q)", m.stderr.String())
	}
	return l
}

// next is the next answer, which must be one message.
func (m *mcpRaw) next() map[string]any {
	m.t.Helper()
	l := m.nextRaw()
	var v map[string]any
	if err := json.Unmarshal(l, &v); err != nil {
		m.t.Fatalf("answer %s is not one message: %v", l, err)
	}
	return v
}

// nextBatch is the next answer, which must be a batch.
func (m *mcpRaw) nextBatch() []map[string]any {
	m.t.Helper()
	l := m.nextRaw()
	var v []map[string]any
	if err := json.Unmarshal(l, &v); err != nil {
		m.t.Fatalf("answer %s is not a batch: %v", l, err)
	}
	return v
}

// alive checks that the session still answers a tools/list.
func (m *mcpRaw) alive(id int) {
	m.t.Helper()
	m.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, id))
	if v := m.next(); v["id"] != float64(id) || v["result"] == nil {
		m.t.Fatalf("tools/list after it = %v, want its result", v)
	}
}

// finish closes stdin and checks that corralctl mcp exits 0.
func (m *mcpRaw) finish() {
	if m.inW == nil {
		return
	}
	m.inW.Close()
	m.inW = nil
	for range m.lines {
	}
	if c := <-m.code; c != 0 {
		m.t.Errorf("corralctl mcp exited %d, want 0 at the end of stdin (stderr %q)", c, m.stderr.String())
	}
}

func errCode(m map[string]any) float64 {
	e, _ := m["error"].(map[string]any)
	c, _ := e["code"].(float64)
	return c
}

func TestMCPSurvivesALineThatIsNotAMessage(t *testing.T) {
	m := startMCPRaw(t, "2025-06-18")
	m.send(`garbage`)
	if v := m.next(); errCode(v) != -32700 || v["id"] != nil {
		t.Errorf("answer to a line that is not JSON = %v, want -32700 with id null", v)
	}
	m.send(`{"jsonrpc":"1.0","id":7,"method":"tools/list"}`)
	if v := m.next(); errCode(v) != -32600 || v["id"] != float64(7) {
		t.Errorf("answer to a JSON-RPC 1.0 request = %v, want -32600 with id 7", v)
	}
	m.alive(8)
	m.finish()
	if !strings.Contains(m.stderr.String(), "not a JSON-RPC message") {
		t.Errorf("stderr = %q, want a warning naming the ignored line", m.stderr.String())
	}
}

// TestMCPSurvivesEveryLineKind: each kind of line the SDK's transport ends
// the session on is answered and the session goes on.
func TestMCPSurvivesEveryLineKind(t *testing.T) {
	ids := func(b []map[string]any) map[any]float64 {
		got := map[any]float64{}
		for _, v := range b {
			if v["result"] != nil {
				got[v["id"]] = 0
			} else {
				got[v["id"]] = errCode(v)
			}
		}
		return got
	}
	t.Run("trailing whitespace", func(t *testing.T) {
		m := startMCPRaw(t, "2025-06-18")
		m.send("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"} \t ")
		if v := m.next(); v["id"] != float64(2) || v["result"] == nil {
			t.Errorf("answer to a message with trailing blanks = %v, want its result", v)
		}
		m.alive(3)
	})
	t.Run("oversize line", func(t *testing.T) {
		m := startMCPRaw(t, "2025-06-18")
		long := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"exec_command","arguments":{"cmd":"` +
			strings.Repeat("x", mcpMaxLine) + `"}}}`
		m.send(long)
		if v := m.next(); errCode(v) != -32600 || v["id"] != float64(2) {
			t.Errorf("answer to a line over the limit = %v, want -32600 with id 2", v)
		}
		m.send(`{"params":"` + strings.Repeat("y", mcpMaxLine) + `","id":3}`)
		if v := m.next(); errCode(v) != -32600 || v["id"] != nil {
			t.Errorf("answer to a line over the limit, id after the long part = %v, want -32600 with id null", v)
		}
		m.alive(4)
	})
	t.Run("batch without batching", func(t *testing.T) {
		m := startMCPRaw(t, "2025-06-18")
		m.send(`[{"jsonrpc":"2.0","id":2,"method":"tools/list"}]`)
		if got := ids(m.nextBatch()); len(got) != 1 || got[float64(2)] != -32600 {
			t.Errorf("answer to a batch under 2025-06-18 = %v, want -32600 for id 2", got)
		}
		m.send(`[{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/initialized"}]`)
		if b := m.nextBatch(); len(b) != 2 || b[0]["id"] != float64(3) || errCode(b[0]) != -32600 || errCode(b[1]) != -32600 {
			t.Errorf("answer to a batch with a duplicate id under 2025-06-18 = %v, want -32600 for each id 3", b)
		}
		m.send(`[{"jsonrpc":"2.0","method":"notifications/initialized"}]`)
		if v := m.next(); errCode(v) != -32600 || v["id"] != nil {
			t.Errorf("answer to a batch of notifications under 2025-06-18 = %v, want one -32600 with id null", v)
		}
		m.alive(5)
	})
	t.Run("batch with batching", func(t *testing.T) {
		m := startMCPRaw(t, "2025-03-26")
		m.send(`[{"jsonrpc":"2.0","id":2,"method":"tools/list"},{"jsonrpc":"2.0","id":3,"method":"tools/list"}]`)
		if got := ids(m.nextBatch()); len(got) != 2 || got[float64(2)] != 0 || got[float64(3)] != 0 {
			t.Errorf("answer to a batch of two = %v, want results for 2 and 3", got)
		}
		m.send(`[{"jsonrpc":"2.0","id":4,"method":"tools/list"},{"jsonrpc":"1.0","id":5,"method":"tools/list"},1]`)
		if got := ids(m.nextBatch()); len(got) != 3 || got[float64(4)] != 0 || got[float64(5)] != -32600 || got[nil] != -32600 {
			t.Errorf("answer to a batch mixing valid and invalid = %v, want a result for 4, -32600 for 5 and null", got)
		}
		m.send(`[{"jsonrpc":"2.0","id":6,"method":"tools/list"},{"jsonrpc":"2.0","id":6,"method":"tools/list"}]`)
		if b := m.nextBatch(); len(b) != 2 || b[0]["id"] != float64(6) || b[1]["id"] != float64(6) ||
			errCode(b[0])+errCode(b[1]) != -32600 {
			t.Errorf("answer to a batch with a duplicate id = %v, want one result and one -32600 for id 6", b)
		}
		m.send(`[]`)
		if v := m.next(); errCode(v) != -32600 || v["id"] != nil {
			t.Errorf("answer to an empty batch = %v, want -32600 with id null", v)
		}
		m.alive(7)
	})
}
