package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDK's stdio transport ends the whole session on the first line it
// cannot take (a stray "garbage", "{}" or "[1]", a message followed by a
// space, a line over its 16 MiB limit, a batch under protocol 2025-06-18 or
// one with a duplicate id): the server exits and the answers of the calls
// still running are never written. JSON-RPC 2.0 answers such a line with an
// error and goes on, as corrald's socket does, so mcpStdio sits between stdin
// and the SDK and hands it only single messages, each one trimmed line ending
// in "\n":
//   - a line that is not JSON is answered -32700, JSON that is not a message
//     -32600, with the line's id when it has one and null otherwise;
//   - a line over mcpMaxLine is read up to its newline, discarded and
//     answered -32600 (with its id when it comes before the long part);
//   - a batch is split: its valid messages go on one by one and their
//     responses, with the errors of its invalid or duplicate elements, are
//     written back as one array once all are in (JSON-RPC 2.0's batch
//     response); under a protocol revision without batching (2025-06-18 and
//     later) every element with an id is answered -32600 instead, or the
//     batch with one -32600 of id null when none has one.
//
// Its own answers go to stdout under the same lock as the SDK's writes so
// that lines never mix.

// mcpMaxLine is the longest line passed on: below the SDK's frame limit,
// with room for the newline.
const mcpMaxLine = mcp.DefaultMaxLineLength - 64

// mcpIDPrefix is how much of an oversize line is searched for its id.
const mcpIDPrefix = 64 << 10

type mcpStdio struct {
	in      *bufio.Reader
	pending []byte   // the rest of the line being passed on, for the SDK's next Reads
	queue   [][]byte // the next lines to pass on (a batch's messages)
	out     *lockedWriter
	warn    func(format string, args ...any)

	// Guarded by out.mu: the writer looks at every message the SDK writes.
	noBatch bool              // the negotiated revision has no batching
	initIDs map[string]bool   // initialize requests passed on, until answered
	batches map[string]*batch // requests passed on from a batch, until answered
}

// batch collects the responses to one incoming batch.
type batch struct {
	resps   []json.RawMessage
	missing int
}

type lockedWriter struct {
	mu   sync.Mutex
	w    io.Writer
	hook func(p []byte) (write []byte) // under mu; what to write for p, nil for nothing
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := p
	if l.hook != nil {
		out = l.hook(p)
	}
	if len(out) == 0 {
		return len(p), nil
	}
	if _, err := l.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (*lockedWriter) Close() error { return nil }

func newMCPStdio(stdin io.Reader, stdout io.Writer, warn func(string, ...any)) *mcpStdio {
	s := &mcpStdio{in: bufio.NewReader(stdin), out: &lockedWriter{w: stdout}, warn: warn,
		initIDs: map[string]bool{}, batches: map[string]*batch{}}
	s.out.hook = s.outgoing
	return s
}

// idKey is the key of a JSON-RPC id: its type and value.
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// outgoing is called with each message the SDK writes (and the ones mcpStdio
// writes, which it passes through): it notes the negotiated revision and
// holds a batch's responses until the batch is complete.
func (s *mcpStdio) outgoing(p []byte) []byte {
	if len(s.initIDs) == 0 && len(s.batches) == 0 {
		return p
	}
	msg, err := jsonrpc.DecodeMessage(bytes.TrimSpace(p))
	if err != nil {
		return p
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok || !resp.ID.IsValid() {
		return p
	}
	key := idKey(resp.ID)
	if s.initIDs[key] {
		delete(s.initIDs, key)
		var r struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		if resp.Error == nil && json.Unmarshal(resp.Result, &r) == nil && r.ProtocolVersion != "" {
			// As the SDK's own check: batching went in 2025-06-18.
			s.noBatch = r.ProtocolVersion >= "2025-06-18"
		}
	}
	b, ok := s.batches[key]
	if !ok {
		return p
	}
	delete(s.batches, key)
	b.resps = append(b.resps, json.RawMessage(bytes.TrimSpace(p)))
	b.missing--
	if b.missing > 0 {
		return nil
	}
	return marshalLine(b.resps)
}

func marshalLine(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return append(data, '\n')
}

// Read hands the SDK the next valid message (or the rest of the current one).
func (s *mcpStdio) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if len(s.queue) > 0 {
			s.pending, s.queue = s.queue[0], s.queue[1:]
			break
		}
		line, over, err := s.readLine()
		if over > 0 {
			s.warn("mcp: ignored a line of %d bytes, over the %d-byte limit", over, mcpMaxLine)
			if _, werr := s.out.Write(errorLine(line, jsonrpc.CodeInvalidRequest,
				fmt.Sprintf("invalid request: the line is %d bytes, over the %d-byte limit", over, mcpMaxLine))); werr != nil {
				return 0, werr
			}
		} else if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			if werr := s.take(trimmed); werr != nil {
				return 0, werr
			}
		}
		if err != nil {
			if len(s.pending) == 0 && len(s.queue) == 0 {
				return 0, err
			}
			break // the lines first; the reader gives the error again
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

func (*mcpStdio) Close() error { return nil }

// readLine reads one line with its '\n'. A line longer than mcpMaxLine is
// read to its end and discarded: it returns the line's first mcpIDPrefix
// bytes and its length as over.
func (s *mcpStdio) readLine() (line []byte, over int, err error) {
	for {
		chunk, err := s.in.ReadSlice('\n')
		if over > 0 {
			over += len(chunk)
		} else if len(line)+len(chunk) > mcpMaxLine+1 || (len(line)+len(chunk) == mcpMaxLine+1 && chunk[len(chunk)-1] != '\n') {
			over = len(line) + len(chunk)
			line = append(line, chunk...)
			if len(line) > mcpIDPrefix {
				line = line[:mcpIDPrefix:mcpIDPrefix]
			}
		} else {
			line = append(line, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, over, err
	}
}

// take passes a trimmed line on or answers it.
func (s *mcpStdio) take(line []byte) error {
	if !json.Valid(line) {
		return s.refuse(line, jsonrpc.CodeParseError, "parse error: the line is not JSON")
	}
	if line[0] != '[' {
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			return s.refuse(line, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: %v", err))
		}
		s.noteInit(msg)
		s.pending = append(line, '\n')
		return nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(line, &elems) != nil || len(elems) == 0 {
		return s.refuse(line, jsonrpc.CodeInvalidRequest, "invalid request: empty batch")
	}
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	var errs []json.RawMessage
	if s.noBatch {
		why := "invalid request: JSON-RPC batching is not supported in protocol 2025-06-18 and later; send each message on its own line"
		s.warn("mcp: refused a batch of %d messages: %s", len(elems), why)
		for _, e := range elems {
			if msg, err := jsonrpc.DecodeMessage(e); err == nil {
				if req, ok := msg.(*jsonrpc.Request); ok && !req.ID.IsValid() {
					continue // a notification has no answer
				}
			}
			if id := lineID(e); id != nil {
				errs = append(errs, errorMsg(id, jsonrpc.CodeInvalidRequest, why))
			}
		}
		var out []byte
		if len(errs) == 0 {
			out = errorLine(nil, jsonrpc.CodeInvalidRequest, why)
		} else {
			out = marshalLine(errs)
		}
		_, err := s.out.w.Write(out)
		return err
	}
	b := &batch{}
	seen := map[string]bool{}
	var pass [][]byte
	for _, e := range elems {
		msg, err := jsonrpc.DecodeMessage(e)
		if err != nil {
			s.warn("mcp: refused a message in a batch: %v: %.80q", err, e)
			errs = append(errs, errorMsg(lineID(e), jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request in batch: %v", err)))
			continue
		}
		if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() {
			key := idKey(req.ID)
			if seen[key] || s.batches[key] != nil {
				s.warn("mcp: refused a message in a batch: duplicate id %v", req.ID.Raw())
				errs = append(errs, errorMsg(lineID(e), jsonrpc.CodeInvalidRequest,
					fmt.Sprintf("invalid request in batch: id %v is already in use", req.ID.Raw())))
				continue
			}
			seen[key] = true
			if req.Method == "initialize" {
				s.initIDs[key] = true
			}
		}
		pass = append(pass, append(bytes.TrimSpace(e), '\n'))
	}
	for key := range seen {
		s.batches[key] = b
	}
	b.missing = len(seen)
	b.resps = errs
	s.queue = append(s.queue, pass...)
	if b.missing == 0 && len(errs) > 0 {
		_, err := s.out.w.Write(marshalLine(errs))
		return err
	}
	return nil
}

// noteInit notes an initialize request passed on, to learn the revision
// from its answer.
func (s *mcpStdio) noteInit(msg jsonrpc.Message) {
	if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() && req.Method == "initialize" {
		s.out.mu.Lock()
		s.initIDs[idKey(req.ID)] = true
		s.out.mu.Unlock()
	}
}

// refuse answers a line that is not a JSON-RPC message.
func (s *mcpStdio) refuse(line []byte, code int64, why string) error {
	s.warn("mcp: ignored a line that is not a JSON-RPC message (%s): %.80q", why, line)
	_, err := s.out.Write(errorLine(line, code, why+"; each line must be one JSON-RPC 2.0 message"))
	return err
}

func errorLine(line []byte, code int64, why string) []byte {
	return append(errorMsg(lineID(line), code, why), '\n')
}

func errorMsg(id json.RawMessage, code int64, why string) json.RawMessage {
	if id == nil {
		id = json.RawMessage("null")
	}
	data, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error":   map[string]any{"code": code, "message": why},
	})
	return data
}

// lineID is the id of a JSON object, or of the start of one cut short, when
// it is a string or a number and comes before anything that cannot be read;
// nil otherwise.
func lineID(line []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(line))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if k != "id" {
			continue
		}
		switch v[0] {
		case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			return v
		}
		return nil
	}
	return nil
}
