package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestRecordWireShape checks the record as a client reads it
// (docs/protocol.md, "The execution record"): the fields that are null
// until an execution ends are present as null, optional ones are absent
// while unset, and the state is its name.
func TestRecordWireShape(t *testing.T) {
	running := Record{ID: "x", Argv: []string{"sleep", "1"}, State: StateRunning, PID: 42,
		CreatedAt: time.Date(2026, 11, 29, 11, 34, 40, 0, time.UTC)}
	b, err := json.Marshal(running)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"outcome", "exit_code", "signal", "error", "workspace"} {
		if v, ok := m[k]; !ok || string(v) != "null" {
			t.Errorf("running record: %q = %s (present %v), want null", k, v, ok)
		}
	}
	for _, k := range []string{"labels", "scope", "started_at", "exited_at", "cleaned_at", "deadline", "tty", "unenforced"} {
		if v, ok := m[k]; ok {
			t.Errorf("running record: %q = %s, want it absent while unset", k, v)
		}
	}
	tests := []struct {
		key, want string
	}{
		{"state", `"running"`},
		{"pid", "42"},
		{"created_at", `"2026-11-29T11:34:40Z"`},
		{"usage", `{"cpu_user_ms":0,"cpu_system_ms":0,"peak_memory_bytes":0,"tasks_peak":0}`},
		{"stdout", `{"total_bytes":0,"kept_bytes":0,"truncated":false}`},
	}
	for _, tt := range tests {
		if got := string(m[tt.key]); got != tt.want {
			t.Errorf("running record: %q = %s, want %s", tt.key, got, tt.want)
		}
	}
}

// TestRecordRoundTrip: a finished record survives encoding and decoding,
// as it does between the daemon and a client.
func TestRecordRoundTrip(t *testing.T) {
	out, code, errText, ws := OutcomeTimeout, 0, "timeout_ms 100 passed", "/var/lib/corral/work/x"
	at := time.Date(2026, 11, 29, 11, 34, 40, 123000000, time.UTC)
	rec := Record{
		ID: "x", Owner: Owner{UID: 1000, GID: 1000, PID: 4242}, Argv: []string{"sh", "-c", "sleep 9"},
		Labels: map[string]string{"tool_call": "abc"}, State: StateCleaned, Outcome: &out, ExitCode: &code,
		Error: &errText, PID: 7, Scope: "corral-x.scope", Workspace: &ws, CreatedAt: at, StartedAt: &at,
		ExitedAt: &at, CleanedAt: &at, DurationMS: 100, Usage: Usage{CPUUserMS: 1, TasksPeak: 2},
		Stdout: StreamInfo{TotalBytes: 6, KeptBytes: 6}, Backend: "cgroup", TimeoutMS: 100,
		Unenforced: []string{"cpu_ms"},
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if !reflect.DeepEqual(back, rec) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, rec)
	}
}

// TestStdinIsBase64: exec.start's stdin travels as base64 ("data").
func TestStdinIsBase64(t *testing.T) {
	var p StartParams
	if err := json.Unmarshal([]byte(`{"argv":["cat"],"stdin":"aGVsbG8K"}`), &p); err != nil {
		t.Fatal(err)
	}
	if string(p.Stdin) != "hello\n" {
		t.Errorf("stdin = %q, want %q", p.Stdin, "hello\n")
	}
}

// TestErrorKeepsCauseFromClient: the client-visible message is Message
// alone; the internal cause shows in Error() (the log) and through
// errors.Is/As, and ErrorCode finds the code anywhere in a chain.
func TestErrorKeepsCauseFromClient(t *testing.T) {
	cause := errors.New("open /var/lib/corral/corral.db: disk full")
	e := &Error{Code: CodeInternal, Message: "cannot record the execution", Err: cause}
	if got, want := e.Error(), "cannot record the execution: "+cause.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, cause) {
		t.Errorf("errors.Is(e, cause) = false, want true (Unwrap)")
	}
	tests := []struct {
		name string
		err  error
		want Code
	}{
		{"plain error", errors.New("boom"), CodeInternal},
		{"Errorf", Errorf(CodeInvalidParams, "argv: %s", "empty"), CodeInvalidParams},
		{"wrapped", fmt.Errorf("start: %w", Errorf(CodeOverCapacity, "max_running reached")), CodeOverCapacity},
		{"sentinel", ErrNotFound, CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ErrorCode(tt.err); got != tt.want {
				t.Errorf("ErrorCode(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
	if got := Errorf(CodeInvalidParams, "argv: %s", "empty").Message; got != "argv: empty" {
		t.Errorf("Errorf message = %q, want %q", got, "argv: empty")
	}
}

// TestProtocolDocumentsEveryOutcomeAndCode: each outcome and error code
// the daemon can send is in the contract a client reads (docs/protocol.md).
func TestProtocolDocumentsEveryOutcomeAndCode(t *testing.T) {
	b, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, o := range []Outcome{OutcomeExited, OutcomeSignaled, OutcomeTimeout, OutcomeCancelled,
		OutcomeMemoryLimit, OutcomeCPULimit, OutcomeStartFailed, OutcomeLost, OutcomeIdleTimeout} {
		if !strings.Contains(doc, "`"+string(o)+"`") {
			t.Errorf("docs/protocol.md does not name outcome `%s`", o)
		}
	}
	for _, c := range []Code{CodeParseError, CodeInvalidRequest, CodeMethodNotFound, CodeInvalidParams,
		CodeInternal, CodeNotFound, CodePermission, CodeOverCapacity, CodeIdempotency, CodeShuttingDown} {
		if !strings.Contains(doc, fmt.Sprint(int(c))) {
			t.Errorf("docs/protocol.md does not name error code %d", c)
		}
	}
}
