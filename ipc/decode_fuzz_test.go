package ipc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/api"
)

// echoService answers every call at once from its params, so a fuzzed
// connection never waits on it. id "panic" panics; exec.follow sends two
// notifications before its response. Safe for concurrent use (stateless).
type echoService struct{}

var _ Service = echoService{}

func (echoService) rec(caller api.Owner, id string) (api.Record, error) {
	switch id {
	case "panic":
		panic("fuzz panic")
	case "missing":
		return api.Record{}, api.ErrNotFound
	}
	return api.Record{ID: id, Owner: caller, State: api.StateCleaned}, nil
}

func (s echoService) Start(_ context.Context, c api.Owner, p api.StartParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (s echoService) Get(_ context.Context, c api.Owner, p api.IDParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (s echoService) Wait(_ context.Context, c api.Owner, p api.WaitParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (s echoService) Cancel(_ context.Context, c api.Owner, p api.CancelParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (s echoService) Signal(_ context.Context, c api.Owner, p api.SignalParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (echoService) Write(_ context.Context, _ api.Owner, p api.WriteParams) (api.WriteResult, error) {
	return api.WriteResult{Written: len(p.Data)}, nil
}
func (echoService) List(context.Context, api.Owner, api.ListParams) (api.ListResult, error) {
	return api.ListResult{Executions: []api.Record{}}, nil
}
func (echoService) Output(_ context.Context, _ api.Owner, p api.OutputParams) (api.OutputResult, error) {
	return api.OutputResult{Data: []byte{}, Offset: p.Offset, NextOffset: p.Offset, EOF: true}, nil
}
func (s echoService) Follow(_ context.Context, c api.Owner, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
	notify(api.NotifyOutput, api.OutputNotification{ID: p.ID, Stream: "stdout", Data: []byte("x\n")})
	notify(api.NotifyHeartbeat, api.HeartbeatNotification{ID: p.ID})
	return s.rec(c, p.ID)
}
func (echoService) Info(context.Context) (api.Info, error) { return api.Info{Version: "fuzz"}, nil }
func (s echoService) Update(_ context.Context, c api.Owner, p api.UpdateParams) (api.Record, error) {
	return s.rec(c, p.ID)
}
func (s echoService) Resize(_ context.Context, c api.Owner, p api.ResizeParams) (api.Record, error) {
	return s.rec(c, p.ID)
}

// serveSocketpair runs srv on one end of a socketpair (the real connection
// path: SO_PEERCRED, reader, writer) and returns the other end.
func serveSocketpair(t *testing.T, srv *Server) *net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f) // dups fd
		f.Close()
		if err != nil {
			t.Fatalf("file conn: %v", err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	srv.startConn(conns[0])
	return conns[1]
}

// wireMsg is any message the server may write.
type wireMsg struct {
	JSONRPC *string          `json:"jsonrpc"`
	ID      *json.RawMessage `json:"id"`
	Method  *string          `json:"method"`
	Params  json.RawMessage  `json:"params"`
	Result  json.RawMessage  `json:"result"`
	Error   *struct {
		Code    *api.Code `json:"code"`
		Message *string   `json:"message"`
	} `json:"error"`
}

var knownCodes = map[api.Code]bool{
	api.CodeParseError: true, api.CodeInvalidRequest: true, api.CodeMethodNotFound: true,
	api.CodeInvalidParams: true, api.CodeInternal: true, api.CodeNotFound: true,
	api.CodePermission: true, api.CodeOverCapacity: true, api.CodeIdempotency: true,
	api.CodeShuttingDown: true,
}

// checkResponse validates one response object and returns its id
// (compacted) for matching.
func checkResponse(t *testing.T, raw []byte) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("response %q: %v", raw, err)
	}
	if string(m["jsonrpc"]) != `"2.0"` {
		t.Fatalf("response %q: jsonrpc is not \"2.0\"", raw)
	}
	id, ok := m["id"]
	if !ok {
		t.Fatalf("response %q has no id", raw)
	}
	_, hasResult := m["result"]
	errRaw, hasError := m["error"]
	if hasResult == hasError || len(m) != 3 {
		t.Fatalf("response %q: want jsonrpc, id and exactly one of result and error", raw)
	}
	if hasError {
		var e struct {
			Code    *api.Code `json:"code"`
			Message *string   `json:"message"`
		}
		if json.Unmarshal(errRaw, &e) != nil || e.Code == nil || !knownCodes[*e.Code] || e.Message == nil || *e.Message == "" {
			t.Fatalf("response %q: malformed error", raw)
		}
		if *e.Code == api.CodeInvalidParams && !strings.HasPrefix(*e.Message, "params") {
			t.Fatalf("response %q: invalid params message does not name a field", raw)
		}
	}
	n, ok := normID(id)
	if !ok {
		t.Fatalf("response %q: id is not a string, number or null", raw)
	}
	return n
}

// normID returns a JSON-RPC id in a form that compares equal for equal
// values however they are spelled ("\u003c" and "<", 1e2 and 1e2).
func normID(raw json.RawMessage) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case nil:
		return "null", true
	case string:
		return "s:" + v, true
	case json.Number:
		return "n:" + v.String(), true
	}
	return "", false
}

// expectation is what the server owes one input line.
type expectation struct {
	batch     bool   // a batch: at most one answer line
	answer    bool   // exactly one answer line
	id        string // the id the answer carries, when the request's is readable
	matchedID bool
}

// expect predicts the answer to line the way the protocol specifies it.
func expect(line []byte) (expectation, bool) {
	switch first := firstByte(line); {
	case first == 0:
		return expectation{}, false // blank: nothing
	case !json.Valid(line):
		return expectation{answer: true, id: "null", matchedID: true}, true
	case first == '[':
		return expectation{batch: true}, true
	}
	var r request
	if json.Unmarshal(line, &r) != nil || firstByte(line) != '{' {
		return expectation{answer: true}, true
	}
	var v, method string
	notification := r.ID == nil && r.JSONRPC != nil && json.Unmarshal(r.JSONRPC, &v) == nil && v == "2.0" &&
		r.Method != nil && json.Unmarshal(r.Method, &method) == nil
	if notification {
		return expectation{}, false // no answer, whatever the params
	}
	e := expectation{answer: true}
	switch firstByte(r.ID) {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		e.id, e.matchedID = normID(r.ID)
	}
	return e, true
}

// FuzzServeLines sends arbitrary input through a real server connection
// and checks the protocol's promises: every line the server writes is one
// valid JSON-RPC response (or a batch of them, or a notification), every
// request line gets exactly one answer carrying its id, notifications and
// blank lines get none, and the server closes the connection once the
// client has stopped sending.
func FuzzServeLines(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"x"}}`,
		`{"jsonrpc":"2.0","id":"s","method":"exec.start","params":{"argv":["a"],"timeout_ms":"soon"}}` + "\n" + `{"jsonrpc":"2.0","id":2,"method":"daemon.info"}`,
		`{"jsonrpc":"2.0","id":3,"method":"exec.follow","params":{"id":"f"}}`,
		`{"jsonrpc":"2.0","id":4,"method":"exec.get","params":{"id":"panic"}}`,
		`{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"n"}}`,
		`[{"jsonrpc":"2.0","id":5,"method":"exec.wait","params":{"id":"missing"}},{"jsonrpc":"2.0","method":"exec.list"},7]`,
		`[]`, `[{"jsonrpc":"2.0","method":"daemon.info"}]`, `{`, `42`, `null`, "\t\r\n\n", `{"jsonrpc":"1.0","id":6,"method":"x"}`,
		`{"jsonrpc":"2.0","id":{"a":1},"method":"daemon.info"}`, `{"jsonrpc":"2.0","id":1.5e300,"method":"nope"}`,
		`{"jsonrpc":"2.0","id":8,"method":"exec.write","params":{"id":"w","data":"!!"}}`,
		`{"jsonrpc":"2.0","ID":9,"Method":"daemon.info"}`, `{"jsonrpc":"2.0","id":10,"method":"exec.start","params":[1]}`,
		"{\"jsonrpc\":\"2.0\",\"id\":\"\\ud800\",\"method\":\"exec.get\",\"params\":{\"id\":\"\\u0000\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > api.MaxLineBytes {
			t.Skip("longer than one line may be") // not an environment skip
		}
		srv := NewServer(echoService{}, zerolog.Nop())
		nc := serveSocketpair(t, srv)
		defer func() {
			nc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatalf("server connection did not end: %v", err)
			}
		}()

		var exps []expectation
		for _, line := range bytes.Split(input, []byte{'\n'}) {
			if e, ok := expect(line); ok {
				exps = append(exps, e)
			}
		}
		wrote := make(chan error, 1)
		go func() {
			_, err := nc.Write(input)
			if err == nil {
				err = nc.CloseWrite()
			}
			wrote <- err
		}()
		if err := nc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReaderSize(nc, 1<<16)
		ids := map[string]int{}
		var answers, batchAnswers int
		for {
			line, err := br.ReadBytes('\n')
			if errors.Is(err, io.EOF) && len(line) == 0 {
				break
			}
			if err != nil {
				t.Fatalf("read: %v (after %q)", err, line)
			}
			line = line[:len(line)-1]
			switch firstByte(line) {
			case '[':
				var elems []json.RawMessage
				if err := json.Unmarshal(line, &elems); err != nil || len(elems) == 0 {
					t.Fatalf("batch answer %q: not a non-empty array", line)
				}
				for _, e := range elems {
					checkResponse(t, e)
				}
				batchAnswers++
			case '{':
				var m map[string]json.RawMessage
				if json.Unmarshal(line, &m) == nil && m["id"] == nil && m["method"] != nil {
					continue // a notification of exec.follow
				}
				ids[checkResponse(t, line)]++
				answers++
			default:
				t.Fatalf("server wrote %q: not a JSON object or array", line)
			}
		}
		if err := <-wrote; err != nil {
			t.Fatalf("write input: %v", err)
		}
		var want, batches int
		for _, e := range exps {
			if e.batch {
				batches++
				continue
			}
			if !e.answer {
				continue
			}
			want++
			if e.matchedID {
				if ids[e.id] == 0 {
					t.Fatalf("no answer with id %s (answers by id: %v)", e.id, ids)
				}
				ids[e.id]--
			}
		}
		// An empty batch is answered by one error object, not an array.
		if answers < want || answers > want+batches || batchAnswers+answers > want+batches {
			t.Fatalf("%d answers and %d batch answers to %d requests and %d batches", answers, batchAnswers, want, batches)
		}
	})
}

// TestServeOversizeLineOverSocketpair: a line over the limit is answered
// with -32600 and the connection is closed, on the real connection path.
func TestServeOversizeLineOverSocketpair(t *testing.T) {
	srv := NewServer(echoService{}, zerolog.Nop())
	nc := serveSocketpair(t, srv)
	t.Cleanup(func() {
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	// One answered request first: the oversize line must not affect it.
	if _, err := nc.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"daemon.info"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	got := []string{first}
	go nc.Write([]byte(`{"jsonrpc":"2.0","id":2,"method":"exec.start","params":{"argv":["` + strings.Repeat("a", api.MaxLineBytes) + "\"]}}\n"))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("read: %v", err)
			}
			break
		}
		got = append(got, line)
	}
	if len(got) != 2 {
		t.Fatalf("answers = %q, want daemon.info's and one -32600", got)
	}
	var last wireMsg
	if err := json.Unmarshal([]byte(got[1]), &last); err != nil || last.Error == nil || last.Error.Code == nil || *last.Error.Code != api.CodeInvalidRequest {
		t.Errorf("answer to the oversize line = %q, want error -32600", got[1])
	}
}
