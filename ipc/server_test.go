package ipc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/internal/peerns"
	"github.com/corral-dev/corral/tests/testenv"
)

func TestErrorsKeepConnection(t *testing.T) {
	path, _ := startServer(t, newFake(), nil)
	c := dialRaw(t, path)

	tests := []struct {
		name     string
		line     string
		wantID   string // raw JSON
		wantCode api.Code
		wantMsg  string // substring
		wantNot  string // must not appear in the message
	}{
		{"malformed json", `{"jsonrpc":"2.0","id":1,"method":`, "null", api.CodeParseError, "parse error", ""},
		{"not an object", `42`, "null", api.CodeInvalidRequest, "object", ""},
		{"string", `"exec.get"`, "null", api.CodeInvalidRequest, "object", ""},
		{"wrong version", `{"jsonrpc":"1.0","id":1,"method":"exec.get"}`, "1", api.CodeInvalidRequest, "jsonrpc", ""},
		{"no version", `{"id":"a","method":"exec.get"}`, `"a"`, api.CodeInvalidRequest, "jsonrpc", ""},
		{"bad id type", `{"jsonrpc":"2.0","id":{},"method":"exec.get"}`, "null", api.CodeInvalidRequest, "id", ""},
		{"bool id", `{"jsonrpc":"2.0","id":true,"method":"exec.get"}`, "null", api.CodeInvalidRequest, "id", ""},
		{"method not string", `{"jsonrpc":"2.0","id":2,"method":1}`, "2", api.CodeInvalidRequest, "method", ""},
		{"unknown method", `{"jsonrpc":"2.0","id":3,"method":"exec.frobnicate"}`, "3", api.CodeMethodNotFound, "exec.frobnicate", ""},
		{"params array", `{"jsonrpc":"2.0","id":4,"method":"exec.get","params":["x"]}`, "4", api.CodeInvalidParams, "params: want object", ""},
		{"params array of a number", `{"jsonrpc":"2.0","id":4,"method":"exec.get","params":[1]}`, "4", api.CodeInvalidParams, "params: want object", ""},
		{"params string", `{"jsonrpc":"2.0","id":4,"method":"exec.get","params":"x"}`, "4", api.CodeInvalidParams, "params: want object", ""},
		{"timeout not integer", `{"jsonrpc":"2.0","id":5,"method":"exec.wait","params":{"id":"x","timeout_ms":"soon"}}`, "5", api.CodeInvalidParams, "params.timeout_ms: want integer", ""},
		{"timeout fraction", `{"jsonrpc":"2.0","id":6,"method":"exec.wait","params":{"id":"x","timeout_ms":1.5}}`, "6", api.CodeInvalidParams, "params.timeout_ms: want integer", ""},
		{"argv not array", `{"jsonrpc":"2.0","id":7,"method":"exec.start","params":{"argv":"ls -l"}}`, "7", api.CodeInvalidParams, "params.argv: want array", ""},
		{"label not string", `{"jsonrpc":"2.0","id":8,"method":"exec.start","params":{"argv":["true"],"labels":{"k":1}}}`, "8", api.CodeInvalidParams, "params.labels: want object of strings", ""},
		{"bad base64", `{"jsonrpc":"2.0","id":9,"method":"exec.write","params":{"id":"x","data":"!!!"}}`, "9", api.CodeInvalidParams, "params.data: want base64 string", ""},
		{"id not string", `{"jsonrpc":"2.0","id":10,"method":"exec.get","params":{"id":7}}`, "10", api.CodeInvalidParams, "params.id: want string", ""},
		{"service api error", `{"jsonrpc":"2.0","id":11,"method":"exec.get","params":{"id":"missing"}}`, "11", api.CodeNotFound, "execution not found", "secret"},
		{"service plain error", `{"jsonrpc":"2.0","id":12,"method":"exec.get","params":{"id":"internal"}}`, "12", api.CodeInternal, "internal error", "secret"},
		{"service panic", `{"jsonrpc":"2.0","id":13,"method":"exec.get","params":{"id":"panic"}}`, "13", api.CodeInternal, "internal error", "boom"},
		{"missing argv left to service", `{"jsonrpc":"2.0","id":14,"method":"exec.start","params":{}}`, "14", api.CodeInvalidParams, "argv", ""},
		{"empty batch", `[]`, "null", api.CodeInvalidRequest, "batch", ""},
		{"string id kept", `{"jsonrpc":"2.0","id":"req-1","method":"nope"}`, `"req-1"`, api.CodeMethodNotFound, "nope", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.t = t
			c.send(tt.line)
			r := decodeResp(t, c.mustRead())
			if r.Error == nil {
				t.Fatalf("response has no error: result %s", r.Result)
			}
			if string(r.ID) != tt.wantID {
				t.Errorf("id = %s, want %s", r.ID, tt.wantID)
			}
			if r.Error.Code != tt.wantCode {
				t.Errorf("code = %d, want %d (message %q)", r.Error.Code, tt.wantCode, r.Error.Message)
			}
			if !strings.Contains(r.Error.Message, tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", r.Error.Message, tt.wantMsg)
			}
			if tt.wantNot != "" && strings.Contains(r.Error.Message, tt.wantNot) {
				t.Errorf("message = %q leaks %q", r.Error.Message, tt.wantNot)
			}
			// docs/protocol.md: every -32602 names its field in error.data.field.
			var data struct{ Field string }
			if r.Error.Code == api.CodeInvalidParams && (json.Unmarshal(r.Error.Data, &data) != nil || data.Field == "") {
				t.Errorf("-32602 %q has error.data %s, want a field", r.Error.Message, r.Error.Data)
			}
		})
	}

	// After all of that the same connection still works.
	c.t = t
	c.send(`{"jsonrpc":"2.0","id":99,"method":"exec.get","params":{"id":"ok"}}`)
	r := decodeResp(t, c.mustRead())
	if r.Error != nil || string(r.ID) != "99" {
		t.Fatalf("after errors: got id %s error %+v, want a result for id 99", r.ID, r.Error)
	}
	var rec api.Record
	if err := json.Unmarshal(r.Result, &rec); err != nil || rec.ID != "ok" {
		t.Fatalf("after errors: record %s (%v), want id ok", r.Result, err)
	}
}

func TestInvalidParamsNamesFieldInData(t *testing.T) {
	path, _ := startServer(t, newFake(), nil)
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.start","params":{"argv":["x"],"memory_bytes":"1G"}}`)
	r := decodeResp(t, c.mustRead())
	if r.Error == nil || r.Error.Code != api.CodeInvalidParams {
		t.Fatalf("got %+v, want -32602", r.Error)
	}
	if got, want := string(r.Error.Data), `{"field":"memory_bytes"}`; got != want {
		t.Errorf("error data = %s, want %s", got, want)
	}
}

// TestServiceInvalidParamsNameFieldInData: a -32602 from the service (its
// own validation, "params.argv: required") carries error.data.field as one
// the decoder raises does, so a client reads the field from data alone.
func TestServiceInvalidParamsNameFieldInData(t *testing.T) {
	path, _ := startServer(t, newFake(), nil)
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.start","params":{"argv":[]}}`)
	r := decodeResp(t, c.mustRead())
	if r.Error == nil || r.Error.Code != api.CodeInvalidParams {
		t.Fatalf("got %+v, want -32602", r.Error)
	}
	if got, want := string(r.Error.Data), `{"field":"argv"}`; got != want {
		t.Errorf("error data = %s, want %s (message %q)", got, want, r.Error.Message)
	}
}

func TestLeadingField(t *testing.T) {
	for msg, want := range map[string]string{
		"timeout_ms: must not be negative":      "timeout_ms",
		"params.argv: required":                 "argv",
		"argv[1]: contains a NUL byte":          "argv[1]",
		"tty_size.rows: must be 1-10000":        "tty_size.rows",
		"offset, limit: must not be negative":   "",
		"unknown signal \"X\"":                  "",
		"1st: odd":                              "",
		"id: execution x has no terminal (...)": "id",
	} {
		if got := leadingField(msg); got != want {
			t.Errorf("leadingField(%q) = %q, want %q", msg, got, want)
		}
	}
}

func TestBatch(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialRaw(t, path)

	c.send(`[` +
		`{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"a"}},` +
		`{"foo":1},` +
		`{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"note"}},` +
		`{"jsonrpc":"2.0","id":3,"method":"no.such"},` +
		`5,` +
		`{"jsonrpc":"2.0","id":"w","method":"exec.wait","params":{"id":"b","timeout_ms":"x"}}` +
		`]`)
	line := c.mustRead()
	var resps []wireResp
	if err := json.Unmarshal([]byte(line), &resps); err != nil {
		t.Fatalf("batch response %q is not an array: %v", line, err)
	}
	got := map[string]api.Code{}
	nulls := 0
	for _, r := range resps {
		code := api.Code(0)
		if r.Error != nil {
			code = r.Error.Code
		}
		if string(r.ID) == "null" {
			nulls++
			if code != api.CodeInvalidRequest {
				t.Errorf("null-id response code = %d, want -32600", code)
			}
			continue
		}
		got[string(r.ID)] = code
	}
	want := map[string]api.Code{"1": 0, "3": api.CodeMethodNotFound, `"w"`: api.CodeInvalidParams}
	if fmt.Sprint(got) != fmt.Sprint(want) || nulls != 2 {
		t.Errorf("batch responses by id = %v with %d null ids, want %v with 2 (response %s)", got, nulls, want, line)
	}
	select {
	case id := <-f.cancelled:
		if id != "note" {
			t.Errorf("cancelled %q, want note", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the notification in the batch was not executed")
	}

	// A batch of notifications only gets no response at all: the next line
	// read is the answer to the next request.
	c.send(`[{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"n1"}},{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"n2"}}]`)
	c.send(`{"jsonrpc":"2.0","id":"after","method":"daemon.info"}`)
	if r := decodeResp(t, c.mustRead()); string(r.ID) != `"after"` {
		t.Errorf("after a notification-only batch got %+v, want the response to \"after\"", r)
	}
}

func TestNotificationGetsNoResponse(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialRaw(t, path)

	c.send(`{"jsonrpc":"2.0","method":"exec.cancel","params":{"id":"n1","reason":"bye"}}`)
	c.send(`{"jsonrpc":"2.0","method":"no.such.method"}`)
	c.send(`{"jsonrpc":"2.0","method":"exec.wait","params":{"timeout_ms":"bad"}}`)
	select {
	case id := <-f.cancelled:
		if id != "n1" {
			t.Errorf("cancelled %q, want n1", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("notification was not executed")
	}
	c.send(`{"jsonrpc":"2.0","id":1,"method":"daemon.info"}`)
	r := decodeResp(t, c.mustRead())
	if string(r.ID) != "1" || r.Error != nil {
		t.Fatalf("first line after notifications = %+v, want the daemon.info response", r)
	}
}

func TestOversizeLineClosesOnlyThatConnection(t *testing.T) {
	path, _ := startServer(t, newFake(), nil)

	good, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()

	// The good client keeps calling while the bad one sends 2 MiB.
	ctx, stop := context.WithCancel(context.Background())
	var calls atomic.Int64
	goodErr := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			id := fmt.Sprintf("g%d", calls.Load())
			rec, err := good.Get(context.Background(), id)
			if err != nil || rec.ID != id {
				goodErr <- fmt.Errorf("get %s = %v, %v", id, rec.ID, err)
				return
			}
			calls.Add(1)
		}
		goodErr <- nil
	}()

	bad := dialRaw(t, path)
	big := `{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"` + strings.Repeat("x", 2<<20) + `"}}` + "\n"
	wrote := make(chan error, 1)
	go func() {
		_, err := bad.nc.Write([]byte(big))
		wrote <- err
	}()
	r := decodeResp(t, bad.mustRead())
	if r.Error == nil || r.Error.Code != api.CodeInvalidRequest || string(r.ID) != "null" {
		t.Fatalf("oversize line answered %+v id %s, want -32600 with id null", r.Error, r.ID)
	}
	if _, err := bad.read(5 * time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("after the error: %v, want EOF (closed, and not reset)", err)
	}
	if err := <-wrote; err != nil {
		t.Errorf("writing the rest of the 2 MiB line: %v (the daemon should swallow a bounded amount)", err)
	}

	// The other connection goes on answering after the oversize line.
	after := calls.Load()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() <= after && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-goodErr; err != nil {
		t.Fatalf("other connection affected: %v", err)
	}
	if calls.Load() <= after {
		t.Fatalf("other connection made no call in 10s after the oversize line (%d before it)", after)
	}
	// And new connections are still accepted.
	if _, err := good.Info(context.Background()); err != nil {
		t.Fatalf("info after oversize: %v", err)
	}
}

func TestLongLineUnderLimitIsAccepted(t *testing.T) {
	path, _ := startServer(t, newFake(), nil)
	c := dialRaw(t, path)
	id := strings.Repeat("y", 900<<10) // longer than the read buffer, under 1 MiB
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"` + id + `"}}`)
	r := decodeResp(t, c.mustRead())
	var rec api.Record
	if r.Error != nil || json.Unmarshal(r.Result, &rec) != nil || rec.ID != id {
		t.Fatalf("900 KiB request: error %+v, want the record back", r.Error)
	}
}

func TestSlowWaitDoesNotBlockGet(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialClient(t, path)

	waited := make(chan error, 1)
	go func() {
		rec, err := c.Wait(context.Background(), api.WaitParams{ID: "block"})
		if err == nil && rec.State != api.StateCleaned {
			err = fmt.Errorf("state %v, want cleaned", rec.State)
		}
		waited <- err
	}()
	f.awaitWait(t)

	// Many calls in flight on the same connection, answered out of order
	// relative to the wait that is still pending.
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("e%d", i)
			rec, err := c.Get(context.Background(), id)
			if err != nil {
				errs <- err
			} else if rec.ID != id {
				errs <- fmt.Errorf("get %s answered with record %s", id, rec.ID)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case err := <-waited:
		t.Fatalf("wait returned before release: %v", err)
	default:
	}
	close(f.release)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait not answered after release")
	}
}

func TestInFlightLimitPausesReading(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, func(s *Server) { s.MaxInFlight = 4 })
	c := dialRaw(t, path)
	for i := range 4 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"exec.wait","params":{"id":"block"}}`, i))
	}
	c.send(`{"jsonrpc":"2.0","id":"get","method":"exec.get","params":{"id":"x"}}`)
	if s, err := c.read(300 * time.Millisecond); err == nil {
		t.Fatalf("got %q while 4 requests were in flight with a limit of 4", s)
	}
	close(f.release)
	ids := map[string]bool{}
	for range 5 {
		ids[string(decodeResp(t, c.mustRead()).ID)] = true
	}
	if !ids[`"get"`] || len(ids) != 5 {
		t.Fatalf("responses %v, want the 4 waits and the get", ids)
	}
}

func TestPeerCredentialsReachService(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialClient(t, path)
	rec, err := c.Get(context.Background(), "me")
	if err != nil {
		t.Fatal(err)
	}
	want := api.Owner{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: int32(os.Getpid())}
	if rec.Owner != want {
		t.Fatalf("caller = %+v, want %+v", rec.Owner, want)
	}
	// The network namespace resolved at accept reaches the service, and
	// only it: the record's owner (encoded) has none.
	self, err := peerns.Self()
	if err != nil {
		t.Fatal(err)
	}
	if ns := f.lastCaller().Netns; ns == nil || ns.Err != nil || ns.Ino != self {
		t.Errorf("caller's network namespace = %+v, want inode %d (this process's)", ns, self)
	}
}

func TestSlowFollowReaderGetsDrops(t *testing.T) {
	const sent = 5000
	chunk := make([]byte, 1024)
	var accepted, dropped atomic.Int64
	f := newFake()
	f.follow = func(ctx context.Context, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
		for i := range sent {
			if notify(api.NotifyOutput, api.OutputNotification{ID: p.ID, Stream: "stdout", Offset: int64(i * len(chunk)), Data: chunk}) {
				accepted.Add(1)
			} else {
				dropped.Add(1)
			}
		}
		return api.Record{ID: p.ID, State: api.StateCleaned}, nil
	}
	path, _ := startServer(t, f, func(s *Server) {
		s.NoteQueueLen = 16
		s.NoteQueueBytes = 64 << 10
	})
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.follow","params":{"id":"f"}}`)

	// Read nothing until the service is done sending.
	deadline := time.Now().Add(5 * time.Second)
	for accepted.Load()+dropped.Load() < sent && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if dropped.Load() == 0 {
		t.Fatalf("no notification dropped for a reader that reads nothing (%d accepted)", accepted.Load())
	}
	// What was accepted is bounded by the queue plus the socket buffer,
	// not by what the service sent.
	if a := accepted.Load(); a > sent/4 {
		t.Fatalf("%d of %d notifications accepted by a stalled reader; the queue is not bounded", a, sent)
	}

	var got int64
	last := int64(-1)
	for {
		r := decodeResp(t, c.mustRead())
		if r.Method == api.NotifyOutput {
			var n api.OutputNotification
			if err := json.Unmarshal(r.Params, &n); err != nil {
				t.Fatal(err)
			}
			if n.Offset <= last || len(n.Data) != len(chunk) {
				t.Fatalf("notification offset %d after %d, %d bytes", n.Offset, last, len(n.Data))
			}
			last = n.Offset
			got++
			continue
		}
		if string(r.ID) != "1" || r.Error != nil {
			t.Fatalf("final message %+v, want the follow response", r)
		}
		break
	}
	if got != accepted.Load() {
		t.Fatalf("received %d notifications, the service had %d accepted", got, accepted.Load())
	}
}

func TestNotifyAfterFollowReturnsIsRefused(t *testing.T) {
	f := newFake()
	late := make(chan func(string, any) bool, 1)
	f.follow = func(ctx context.Context, p api.FollowParams, notify func(string, any) bool) (api.Record, error) {
		late <- notify
		return api.Record{ID: p.ID, State: api.StateCleaned}, nil
	}
	path, _ := startServer(t, f, nil)
	c := dialClient(t, path)
	if _, err := c.Follow(context.Background(), api.FollowParams{ID: "x"}, func(string, json.RawMessage) {}); err != nil {
		t.Fatal(err)
	}
	if (<-late)(api.NotifyOutput, api.OutputNotification{ID: "x"}) {
		t.Fatal("notify accepted a notification after Follow returned")
	}
}

func TestDisconnectCancelsInFlight(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"block"}}`)
	f.awaitWait(t)
	c.nc.Close()
	select {
	case err := <-f.waitEnded:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("wait ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait not cancelled after the client disconnected")
	}
}

func TestHalfCloseStillGetsAnswers(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"block"}}`)
	// Also an unterminated last line, as from printf | socat.
	if _, err := c.nc.Write([]byte(`{"jsonrpc":"2.0","id":2,"method":"daemon.info"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.nc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if r := decodeResp(t, c.mustRead()); string(r.ID) != "2" || r.Error != nil {
		t.Fatalf("got %+v, want the daemon.info answer", r)
	}
	select {
	case err := <-f.waitEnded:
		t.Fatalf("wait ended (%v) although the client only shut down writing", err)
	case <-time.After(3 * hangupPoll):
	}
	close(f.release)
	if r := decodeResp(t, c.mustRead()); string(r.ID) != "1" || r.Error != nil {
		t.Fatalf("got %+v, want the wait answer", r)
	}
	if _, err := c.read(5 * time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last answer: %v, want EOF", err)
	}
}

func TestShutdownCancelsAndRefuses(t *testing.T) {
	f := newFake()
	path, srv := startServer(t, f, nil)
	c := dialRaw(t, path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"exec.wait","params":{"id":"block"}}`)
	f.awaitWait(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-f.waitEnded:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("wait ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait not cancelled by Shutdown")
	}
	if _, err := Dial(path); err == nil {
		t.Fatal("dial succeeded after Shutdown")
	}
}

func TestMethodsReachService(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialClient(t, path)
	ctx := context.Background()
	var names []string
	check := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		names = append(names, name)
	}
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"echo", "hi"}})
	if err == nil && strings.Join(rec.Argv, " ") != "echo hi" {
		err = fmt.Errorf("argv %q", rec.Argv)
	}
	check("start", err)
	_, err = c.Get(ctx, "a")
	check("get", err)
	_, err = c.Wait(ctx, api.WaitParams{ID: "a"})
	check("wait", err)
	_, err = c.Cancel(ctx, api.CancelParams{ID: "a"})
	<-f.cancelled
	check("cancel", err)
	_, err = c.Signal(ctx, api.SignalParams{ID: "a", Signal: "SIGINT"})
	check("signal", err)
	w, err := c.Write(ctx, api.WriteParams{ID: "a", Data: []byte("hello")})
	if err == nil && w.Written != 5 {
		err = fmt.Errorf("written %d, want 5", w.Written)
	}
	check("write", err)
	_, err = c.List(ctx, api.ListParams{})
	check("list", err)
	_, err = c.Output(ctx, api.OutputParams{ID: "a"})
	check("output", err)
	_, err = c.Follow(ctx, api.FollowParams{ID: "a"}, func(string, json.RawMessage) {})
	check("follow", err)
	rec, err = c.Update(ctx, api.UpdateParams{ID: "a"})
	if err == nil && rec.ID != "a" {
		err = fmt.Errorf("record %q", rec.ID)
	}
	check("update", err)
	rec, err = c.Resize(ctx, api.ResizeParams{ID: "a", Rows: 1, Cols: 1})
	if err == nil && rec.ID != "a" {
		err = fmt.Errorf("record %q", rec.ID)
	}
	check("resize", err)
	info, err := c.Info(ctx)
	if err == nil && info.Version != "test" {
		err = fmt.Errorf("version %q", info.Version)
	}
	check("info", err)

	var apiErr *api.Error
	_, err = c.Get(ctx, "missing")
	if !errors.As(err, &apiErr) || apiErr.Code != api.CodeNotFound || apiErr.Message != "execution not found" {
		t.Errorf("get missing: %v, want *api.Error -32001", err)
	}
	if err := c.Notify("exec.cancel", api.CancelParams{ID: "bynote"}); err != nil {
		t.Errorf("notify: %v", err)
	}
	if id := <-f.cancelled; id != "bynote" {
		t.Errorf("notification cancelled %q", id)
	}
	sort.Strings(names)
	if len(names) != len(methods) {
		t.Errorf("exercised %d methods, the table has %d", len(names), len(methods))
	}
}

func TestClientFailsCallsWhenConnectionEnds(t *testing.T) {
	f := newFake()
	path, srv := startServer(t, f, nil)
	c := dialClient(t, path)
	done := make(chan error, 1)
	go func() {
		_, err := c.Wait(context.Background(), api.WaitParams{ID: "block"})
		done <- err
	}()
	f.awaitWait(t) // the call is pending at the daemon
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("pending call ended with %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending call not failed after the daemon closed")
	}
	if _, err := c.Get(context.Background(), "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v, want ErrClosed", err)
	}
}

func TestCallContextCancel(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, nil)
	c := dialClient(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(ctx, api.WaitParams{ID: "block"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with short ctx: %v, want DeadlineExceeded", err)
	}
	// The connection is still usable.
	if _, err := c.Get(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	close(f.release)
}

func TestDefaultSocket(t *testing.T) {
	t.Setenv(SocketEnv, "")
	if got := DefaultSocket(); got != DefaultSocketPath {
		t.Errorf("DefaultSocket() = %q, want %q", got, DefaultSocketPath)
	}
	t.Setenv(SocketEnv, "/tmp/x.sock")
	if got := DefaultSocket(); got != "/tmp/x.sock" {
		t.Errorf("DefaultSocket() with env = %q, want /tmp/x.sock", got)
	}
}

func TestMaxConnsRefusesExtra(t *testing.T) {
	path, _ := startServer(t, newFake(), func(s *Server) { s.MaxConns = 1 })
	first := dialRaw(t, path)
	first.send(`{"jsonrpc":"2.0","id":1,"method":"daemon.info"}`)
	first.mustRead() // the first connection is registered

	second := dialRaw(t, path)
	r := decodeResp(t, second.mustRead())
	if r.Error == nil || r.Error.Code != api.CodeOverCapacity {
		t.Fatalf("connection over the limit got %+v, want -32003", r.Error)
	}
	if _, err := second.read(5 * time.Second); err == nil {
		t.Fatal("connection over the limit left open")
	}
	first.send(`{"jsonrpc":"2.0","id":2,"method":"daemon.info"}`)
	if r := decodeResp(t, first.mustRead()); r.Error != nil {
		t.Fatalf("first connection broken: %+v", r.Error)
	}
}

func TestClientThatNeverReadsIsNotBufferedWithoutBound(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, func(s *Server) { s.MaxInFlight = 4 })
	c := dialRaw(t, path)
	req := []byte(`{"jsonrpc":"2.0","id":1,"method":"exec.get","params":{"id":"x"}}` + "\n")
	const total = 200000
	go func() {
		// Blocks once the daemon stops reading; ends when the test closes c.
		for range total {
			if _, err := c.nc.Write(req); err != nil {
				return
			}
		}
	}()
	calls := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.callers)
	}
	// Wait until the daemon handles requests at all (a loaded host may take
	// a while to schedule the writer), then until the count stops moving.
	deadline := time.Now().Add(10 * time.Second)
	for calls() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	prev := -1
	for i := 0; i < 100 && calls() != prev; i++ {
		prev = calls()
		time.Sleep(100 * time.Millisecond)
	}
	// What was handled is bounded by the socket buffers and the queue, not by
	// what the client sent.
	t.Logf("%d requests handled for a client that reads nothing", calls())
	if n := calls(); n == 0 || n >= total/2 {
		t.Fatalf("%d of %d requests handled while the client read nothing; want a small bounded number", n, total)
	}
}

// exec.output with wait_ms parks in an OutputWaiter: a thousand parked calls
// on one connection hold no goroutine each, do not use up the in-flight
// slots (a get is still answered), and are answered in order once released.
func TestParkedOutputHoldsNoGoroutine(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, func(s *Server) { s.MaxInFlight = 8 })
	c := dialRaw(t, path)
	const n = 1000
	// One answered call first: the connection's reader and writer run
	// before the baseline is taken.
	c.send(`{"jsonrpc":"2.0","id":"first","method":"exec.get","params":{"id":"g"}}`)
	if r := decodeResp(t, c.mustRead()); string(r.ID) != `"first"` {
		t.Fatalf("answer %s, want the first get", r.ID)
	}
	before := testenv.GoroutineStacks()
	for i := range n {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"exec.output","params":{"id":"x","offset":%d,"wait_ms":60000}}`, i, i))
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.parkedCount() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := f.parkedCount(); got != n {
		t.Fatalf("parked calls = %d, want %d", got, n)
	}
	// A call counts as parked once the fake holds it; the handler goroutine
	// that brought it (up to MaxInFlight) returns only after that, which on
	// a loaded host can take a while. So wait, bounded, for every goroutine
	// the server started since the baseline (running or created by code of
	// this package) to be gone: one a parked call held would stay, the
	// calls wait 60 s.
	first, left, took := testenv.WaitGoroutinesSettle(before, serverGoroutine, 0, 10*time.Second)
	if len(left) > 0 {
		t.Fatalf("%d goroutines of the server started since the %d parked calls were sent are still there after %v, want none; they are:\n%s",
			len(left), n, took, testenv.GroupStacks(left))
	}
	t.Logf("%d parked calls: %d server goroutines new since before at first look, none after %v", n, first, took)
	c.send(`{"jsonrpc":"2.0","id":"get","method":"exec.get","params":{"id":"g"}}`)
	if r := decodeResp(t, c.mustRead()); string(r.ID) != `"get"` {
		t.Fatalf("first answer %s, want the get (nothing parked was released)", r.ID)
	}
	order := f.releaseParked()
	for i := range n {
		r := decodeResp(t, c.mustRead())
		want := order[i]
		if string(r.ID) != strconv.FormatInt(want, 10) {
			t.Fatalf("answer %d has id %s, want %d (in the order the service answered)", i, r.ID, want)
		}
		var res api.OutputResult
		if err := json.Unmarshal(r.Result, &res); err != nil || res.Offset != want || string(res.Data) != "x" {
			t.Fatalf("answer %d = %s (%v), want offset %d with data", i, r.Result, err, want)
		}
	}
}

// Beyond MaxParked a call with wait_ms is served by Output on its own
// goroutine; a closed connection drops its parked calls (their context
// ends, the service answers them and forgets them).
func TestParkedOutputLimitAndDisconnect(t *testing.T) {
	f := newFake()
	path, _ := startServer(t, f, func(s *Server) { s.MaxParked = 3 })
	c := dialRaw(t, path)
	for i := range 4 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"exec.output","params":{"id":"x","wait_ms":1000}}`, i))
	}
	// One is answered by the fake's Output (eof) at once. Which one is not
	// fixed: each call runs on its own goroutine, so the last to reach a
	// park slot is not always the last sent.
	if r := decodeResp(t, c.mustRead()); r.Error != nil || !slices.Contains([]string{"0", "1", "2", "3"}, string(r.ID)) {
		t.Fatalf("first answer = id %s, error %v; want a result for one of 0..3 (the one beyond MaxParked)", r.ID, r.Error)
	}
	if got := f.parkedCount(); got != 3 {
		t.Fatalf("parked = %d, want 3", got)
	}
	c.nc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.parkMu.Lock()
		d := f.parkDropped
		f.parkMu.Unlock()
		if d == 3 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("closing the connection did not drop its 3 parked calls")
}

// serverGoroutine reports whether a goroutine's stack runs, or was created
// by, code of this package (the server's, or the fake service's).
func serverGoroutine(stack string) bool {
	return strings.Contains(stack, "github.com/corral-dev/corral/ipc.")
}
