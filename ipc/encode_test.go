package ipc

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/api"
)

// encodeCases are results and params with what encoding/json escapes or
// reformats: HTML characters, U+2028, a time, nested objects.
func encodeCases() []any {
	now := time.Date(2026, 12, 1, 14, 0, 0, 123456789, time.UTC)
	code := 3
	out := api.OutcomeExited
	rec := api.Record{ID: "id<&>", State: api.StateCleaned, Argv: []string{"sh", "-c", "echo '</script>\u2028'"},
		Labels: map[string]string{"a": "b&c", "z": "\u2029"}, CreatedAt: now, ExitedAt: &now, CleanedAt: &now,
		ExitCode: &code, Outcome: &out}
	return []any{
		rec,
		api.StateNotification{Record: rec},
		api.ListResult{Executions: []api.Record{rec, rec}},
		api.WriteResult{Written: 7},
		map[string]any{"x": []int{1, 2}, "<": nil},
		nil,
	}
}

// TestEncodeResultSameBytes: encodeResult, which encodes the result once,
// gives the bytes json.Marshal of the whole response gives, for every kind
// of id a request may carry (whitespace in it compacted, HTML escaped).
func TestEncodeResultSameBytes(t *testing.T) {
	ids := []json.RawMessage{json.RawMessage(`1`), json.RawMessage(`"a<b>&c"`), json.RawMessage(`"\u2028"`),
		json.RawMessage(` 42 `), json.RawMessage(`-1.5e3`), json.RawMessage(`null`), nil}
	for _, id := range ids {
		for _, res := range encodeCases() {
			got, err := encodeResult(id, res)
			if err != nil {
				t.Fatalf("encodeResult(%s, %T): %v", id, res, err)
			}
			r, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(successResponse{JSONRPC: version, ID: id, Result: r})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("encodeResult(%q, %T)\n got %s\nwant %s", id, res, got, want)
			}
			// The result already encoded (exec.wait's record as the store
			// encoded it) gives the same response.
			if raw, err := encodeResult(id, json.RawMessage(r)); err != nil || !bytes.Equal(raw, want) {
				t.Errorf("encodeResult(%q, RawMessage of %T) = %s, %v\nwant %s", id, res, raw, err, want)
			}
		}
	}
	if _, err := encodeResult(json.RawMessage(`{bad`), 1); err == nil {
		t.Error("encodeResult with an invalid id: no error")
	}
}

// TestEncodeNoteRawSameBytes: a notification whose params come encoded
// (json.RawMessage, as the reactor sends exec.state with the store's JSON of
// the record) is the same line as the one encoded from the value.
func TestEncodeNoteRawSameBytes(t *testing.T) {
	for _, p := range encodeCases() {
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		fromValue, err := encodeNote(api.NotifyState, p)
		if err != nil {
			t.Fatal(err)
		}
		fromRaw, err := encodeNote(api.NotifyState, json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fromRaw, fromValue) {
			t.Errorf("notification of %T\nfrom raw   %s\nfrom value %s", p, fromRaw, fromValue)
		}
		want, err := json.Marshal(notificationMsg{JSONRPC: version, Method: api.NotifyState, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fromRaw, append(want, '\n')) {
			t.Errorf("notification of %T\n got %s\nwant %s", p, fromRaw, want)
		}
	}
}

// encodedWaiter is a fakeService that also answers exec.wait encoded
// (EncodedWaiter), with js as the record's bytes.
type encodedWaiter struct {
	*fakeService
	jsMu sync.Mutex
	js   json.RawMessage
}

func (f *encodedWaiter) WaitEncoded(ctx context.Context, caller api.Owner, p api.WaitParams) (api.Record, json.RawMessage, error) {
	rec, err := f.Wait(ctx, caller, p)
	f.jsMu.Lock()
	defer f.jsMu.Unlock()
	return rec, f.js, err
}

// TestWaitSendsTheServiceBytes: exec.wait of an EncodedWaiter answers with
// the bytes the service gave (not an encoding of its api.Record), and with
// the record encoded when it gave none.
func TestWaitSendsTheServiceBytes(t *testing.T) {
	js, err := json.Marshal(api.Record{ID: "from-the-bytes", State: api.StateCleaned, Labels: map[string]string{"a": "<&>"}})
	if err != nil {
		t.Fatal(err)
	}
	svc := &encodedWaiter{fakeService: newFake(), js: js}
	path, _ := startServer(t, svc, nil)
	c := dialClient(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := c.Wait(ctx, api.WaitParams{ID: "x"})
	if err != nil || rec.ID != "from-the-bytes" || rec.Labels["a"] != "<&>" {
		t.Errorf("exec.wait = %+v, %v; want the service's bytes (id from-the-bytes, label <&>)", rec, err)
	}
	svc.jsMu.Lock()
	svc.js = nil
	svc.jsMu.Unlock()
	rec, err = c.Wait(ctx, api.WaitParams{ID: "x"})
	if err != nil || rec.ID != "x" {
		t.Errorf("exec.wait without bytes = %+v, %v; want the service's record (id x)", rec, err)
	}
}

// encodedStarter is a fakeService that also answers exec.start encoded
// (EncodedStarter), with js as the record's bytes.
type encodedStarter struct {
	*fakeService
	js json.RawMessage
}

func (f *encodedStarter) StartEncoded(ctx context.Context, caller api.Owner, p api.StartParams) (api.Record, json.RawMessage, error) {
	rec, err := f.Start(ctx, caller, p)
	return rec, f.js, err
}

// TestStartSendsTheServiceBytes: exec.start of an EncodedStarter answers with
// the bytes the service gave, not an encoding of its api.Record.
func TestStartSendsTheServiceBytes(t *testing.T) {
	js, err := json.Marshal(api.Record{ID: "from-the-bytes", State: api.StateRunning, Labels: map[string]string{"a": "<&>"}})
	if err != nil {
		t.Fatal(err)
	}
	path, _ := startServer(t, &encodedStarter{fakeService: newFake(), js: js}, nil)
	c := dialClient(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := c.Start(ctx, api.StartParams{Argv: []string{"true"}})
	if err != nil || rec.ID != "from-the-bytes" || rec.Labels["a"] != "<&>" {
		t.Errorf("exec.start = %+v, %v; want the service's bytes (id from-the-bytes, label <&>)", rec, err)
	}
}

// fullResponse is what the client's general path takes from a line
// (readLoop without plainResponse): ok when it is a response with a
// numeric id and no error.
func fullResponse(line []byte) (id uint64, result json.RawMessage, ok bool) {
	var m clientMessage
	if json.Unmarshal(line, &m) != nil || m.Error != nil || m.ID == nil || string(m.ID) == "null" {
		return 0, nil, false
	}
	var n uint64
	if json.Unmarshal(m.ID, &n) != nil {
		return 0, nil, false
	}
	return n, m.Result, true
}

// TestPlainResponseAsDecoded: every answer the daemon encodes (encodeResult)
// is read by the client's plain path (plainResponse, no decode of the
// envelope) with the id and result bytes a full decode gives; anything
// else (an error, a notification, a member after the result, another
// layout, a broken result) is left to the full decode.
func TestPlainResponseAsDecoded(t *testing.T) {
	for _, id := range []uint64{0, 1, 38, 1 << 40} {
		for _, res := range encodeCases() {
			b, err := encodeResult(json.RawMessage(strconv.FormatUint(id, 10)), res)
			if err != nil {
				t.Fatal(err)
			}
			line := encodeLine(b)
			gotID, got, ok := plainResponse(line)
			wantID, want, wantOK := fullResponse(line)
			if !ok || !wantOK || gotID != wantID || !bytes.Equal(got, want) {
				t.Errorf("plainResponse(%s) = %d, %s, %v; full decode %d, %s, %v", line, gotID, got, ok, wantID, want, wantOK)
			}
		}
	}
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":3,"result":{"a":1},"error":{"code":-32603,"message":"x"}}`,
		`{"jsonrpc":"2.0","id":3,"result":{"a":"},\"x\":{"},"b":2}` + "\n",
		`{"jsonrpc":"2.0","id":3,"error":{"code":-32001,"message":"not found"}}`,
		`{"jsonrpc":"2.0","id":null,"result":1}`,
		`{"jsonrpc":"2.0","id":"3","result":1}`,
		`{"jsonrpc":"2.0","method":"exec.state","params":{"record":{}}}`,
		`{"jsonrpc": "2.0","id":3,"result":1}`,
		`{"jsonrpc":"2.0","id":3,"result":{"a":}`,
		`{"jsonrpc":"2.0","id":3,"result":}`,
		`{"jsonrpc":"2.0","id":99999999999999999999999,"result":1}`,
	} {
		if id, res, ok := plainResponse([]byte(line)); ok {
			t.Errorf("plainResponse(%s) = %d, %s: want it left to the full decode", line, id, res)
		}
	}
}
