package main

import (
	"bufio"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPSurvivesALineThatIsNotAMessage: a stray line on stdin (not JSON, or
// JSON that is not a JSON-RPC message) is answered with a JSON-RPC error and
// the session goes on; before, the SDK ended the session there and the
// answers still due were never written.
func TestMCPSurvivesALineThatIsNotAMessage(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr strings.Builder
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	e := &env{stdin: inR, stdout: outW, stderr: &stderr, getenv: func(k string) string {
		if k == "CORRAL_SOCKET" {
			return sock
		}
		return ""
	}}
	code := make(chan int, 1)
	go func() {
		c := Main([]string{"mcp"}, e)
		outW.Close()
		code <- c
	}()
	lines := make(chan map[string]any)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				t.Errorf("stdout line is not JSON: %q", sc.Text())
				continue
			}
			lines <- m
		}
	}()
	send := func(s string) {
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatalf("write %q: %v", s, err)
		}
	}
	next := func() map[string]any {
		m, ok := <-lines
		if !ok {
			t.Fatalf("corralctl mcp ended early (stderr %q)", stderr.String())
		}
		return m
	}
	errCode := func(m map[string]any) float64 {
		e, _ := m["error"].(map[string]any)
		c, _ := e["code"].(float64)
		return c
	}

	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if m := next(); m["id"] != float64(1) || m["result"] == nil {
		t.Fatalf("initialize answer = %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`garbage`)
	if m := next(); errCode(m) != -32700 || m["id"] != nil {
		t.Errorf("answer to a line that is not JSON = %v, want -32700 with id null", m)
	}
	send(`{"jsonrpc":"1.0","id":7,"method":"tools/list"}`)
	if m := next(); errCode(m) != -32600 || m["id"] != float64(7) {
		t.Errorf("answer to a JSON-RPC 1.0 request = %v, want -32600 with id 7", m)
	}
	send(`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
	if m := next(); m["id"] != float64(8) || m["result"] == nil {
		t.Errorf("tools/list after the bad lines = %v, want its result", m)
	}
	inW.Close()
	for range lines {
	}
	if c := <-code; c != 0 {
		t.Errorf("corralctl mcp exited %d, want 0 at the end of stdin (stderr %q)", c, stderr.String())
	}
	if !strings.Contains(stderr.String(), "not a JSON-RPC message") {
		t.Errorf("stderr = %q, want a warning naming the ignored line", stderr.String())
	}
}
