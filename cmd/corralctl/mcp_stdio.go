package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The SDK's stdio transport ends the whole session on the first line that is
// not a JSON-RPC message (a stray "garbage", "{}", "[1]"): the server exits
// and the answers of the calls still running are never written. JSON-RPC 2.0
// answers such a line with an error and goes on, as corrald's socket does, so
// mcpStdio sits between stdin and the SDK: it passes each line that decodes as
// a JSON-RPC message (or a batch of them) on, and answers any other line
// itself (-32700 for invalid JSON, -32600 for JSON that is not a message) on
// stdout, under the same lock as the SDK's writes so that lines never mix.

// mcpMaxGuardedLine is the longest line mcpStdio checks; a longer one is
// passed to the SDK as is, which refuses lines over its own limit.
const mcpMaxGuardedLine = 16 << 20

type mcpStdio struct {
	in      *bufio.Reader
	pending []byte // the rest of a checked line, for the SDK's next Reads
	out     *lockedWriter
	warn    func(format string, args ...any)
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (*lockedWriter) Close() error { return nil }

func newMCPStdio(stdin io.Reader, stdout io.Writer, warn func(string, ...any)) *mcpStdio {
	return &mcpStdio{in: bufio.NewReader(stdin), out: &lockedWriter{w: stdout}, warn: warn}
}

// Read hands the SDK the next valid line (or the rest of the current one).
func (s *mcpStdio) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		line, err := s.readLine()
		if len(line) > 0 {
			if msg := s.refusal(line); msg != nil {
				if _, werr := s.out.Write(msg); werr != nil {
					return 0, werr
				}
			} else {
				s.pending = line
			}
		}
		if err != nil {
			if len(s.pending) == 0 {
				return 0, err
			}
			break // the line first; the reader gives the error again
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (*mcpStdio) Close() error { return nil }

// readLine reads one line with its '\n', or up to mcpMaxGuardedLine bytes.
func (s *mcpStdio) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := s.in.ReadSlice('\n')
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull && len(line) < mcpMaxGuardedLine {
			continue
		}
		if err == bufio.ErrBufferFull {
			err = nil
		}
		return line, err
	}
}

// refusal is the error response to a line that is not a JSON-RPC message or
// batch, nil for one the SDK should have (blank lines and lines too long to
// check included).
func (s *mcpStdio) refusal(line []byte) []byte {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || len(line) >= mcpMaxGuardedLine {
		return nil
	}
	code, why := jsonrpc.CodeInvalidRequest, ""
	if !json.Valid(trimmed) {
		code, why = jsonrpc.CodeParseError, "parse error: the line is not JSON"
	} else if trimmed[0] == '[' {
		var batch []json.RawMessage
		if err := json.Unmarshal(trimmed, &batch); err != nil || len(batch) == 0 {
			why = "invalid request: empty batch"
		}
		for _, m := range batch {
			if _, err := jsonrpc.DecodeMessage(m); err != nil {
				why = fmt.Sprintf("invalid request in batch: %v", err)
				break
			}
		}
	} else if _, err := jsonrpc.DecodeMessage(trimmed); err != nil {
		why = fmt.Sprintf("invalid request: %v", err)
	}
	if why == "" {
		return nil
	}
	// The id, when the line has a usable one, so the client can match it.
	var id any
	var obj struct {
		ID json.RawMessage `json:"id"`
	}
	if trimmed[0] == '{' && json.Unmarshal(trimmed, &obj) == nil && len(obj.ID) > 0 {
		var v any
		if json.Unmarshal(obj.ID, &v) == nil {
			switch v.(type) {
			case string, float64:
				id = json.RawMessage(obj.ID)
			}
		}
	}
	s.warn("mcp: ignored a line that is not a JSON-RPC message (%s): %.80q", why, trimmed)
	resp, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error":   map[string]any{"code": code, "message": why + "; each line must be one JSON-RPC 2.0 message"},
	})
	if err != nil {
		return nil
	}
	return append(resp, '\n')
}
