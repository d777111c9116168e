package ipc

import (
	"bytes"
	"encoding/json"
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
