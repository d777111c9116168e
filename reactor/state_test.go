package reactor

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
)

// logLines decodes the JSON log lines in buf.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	buf.Reset()
	return out
}

// TestTransitionStaleOrIllegal: a move the table allows is made; a move to a
// state already reached is stale (Debug); any other is illegal (Error, with
// both states). Neither changes the state. No root: no child is started.
func TestTransitionStaleOrIllegal(t *testing.T) {
	var buf bytes.Buffer
	r := &Reactor{log: zerolog.New(&buf).Level(zerolog.DebugLevel)}
	S, R, C, E, X := api.StateStarted, api.StateRunning, api.StateCanceling, api.StateExited, api.StateCleaned
	for _, tt := range []struct {
		name      string
		from, to  api.State
		moved     bool
		wantLevel string // "" when no line is wanted
	}{
		{"started to running", S, R, true, ""},
		{"started to exited (failed start)", S, E, true, ""},
		{"running to canceling", R, C, true, ""},
		{"canceling to exited", C, E, true, ""},
		{"exited to cleaned", E, X, true, ""},
		{"duplicate running", R, R, false, "debug"},
		{"late timeout after exited", E, C, false, "debug"},
		{"late exit after cleaned", X, E, false, "debug"},
		{"started to canceling skips running", S, C, false, "error"},
		{"running to cleaned skips exited", R, X, false, "error"},
		{"canceling to cleaned skips exited", C, X, false, "error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := &execution{id: "x", state: tt.from, prev: 0}
			e.rec.State = tt.from
			moved := r.transition(e, tt.to)
			if moved != tt.moved {
				t.Fatalf("transition(%s -> %s) = %v, want %v", tt.from, tt.to, moved, tt.moved)
			}
			want, wantPrev := tt.from, api.State(0)
			if tt.moved {
				want, wantPrev = tt.to, tt.from
			}
			if e.state != want || e.rec.State != want || e.prev != wantPrev {
				t.Errorf("after transition(%s -> %s): state %s, record %s, prev %s; want %s, %s, %s",
					tt.from, tt.to, e.state, e.rec.State, e.prev, want, want, wantPrev)
			}
			lines := logLines(t, &buf)
			if tt.wantLevel == "" {
				if len(lines) != 0 {
					t.Errorf("transition(%s -> %s) logged %v, want nothing", tt.from, tt.to, lines)
				}
				return
			}
			if len(lines) != 1 || lines[0]["level"] != tt.wantLevel ||
				lines[0]["state"] != tt.from.String() || lines[0]["to"] != tt.to.String() {
				t.Errorf("transition(%s -> %s) logged %v, want one %s line with state %s and to %s",
					tt.from, tt.to, lines, tt.wantLevel, tt.from, tt.to)
			}
		})
	}
}

// TestCancelWhileStarted: a cancel on an execution still spawning is kept as
// a field, not a state; the first decision wins; the record shows the
// reason at once. (toRunning then applies it; that needs a loop and a
// child, and is not covered here.)
func TestCancelWhileStarted(t *testing.T) {
	var buf bytes.Buffer
	r := &Reactor{log: zerolog.New(&buf).Level(zerolog.DebugLevel)}
	e := &execution{id: "x", state: api.StateStarted}
	e.rec.State = api.StateStarted
	if e.ending() {
		t.Fatal("ending() = true before any cancel")
	}
	r.toCanceling(e, cancelRequest{why: api.OutcomeCancelled, reason: "user asked"})
	r.toCanceling(e, cancelRequest{why: api.OutcomeTimeout, hard: true})
	if e.state != api.StateStarted || e.rec.State != api.StateStarted {
		t.Errorf("state after cancel while started = %s (record %s), want started", e.state, e.rec.State)
	}
	if e.cancel == nil || e.cancel.why != api.OutcomeCancelled || e.cancel.hard {
		t.Errorf("cancel = %+v, want the first decision (cancelled, not hard)", e.cancel)
	}
	if e.rec.CancelReason != "user asked" {
		t.Errorf("CancelReason = %q, want %q", e.rec.CancelReason, "user asked")
	}
	if !e.ending() {
		t.Error("ending() = false after a cancel")
	}
}
