package tracing

import (
	"context"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
)

func TestEnabled(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "corrald"}, false},
	} {
		if got := Enabled(func(k string) string { return tt.env[k] }); got != tt.want {
			t.Errorf("Enabled(%v) = %t, want %t", tt.env, got, tt.want)
		}
	}
}

// stuckExporter blocks every export until released, as a collector that
// does not answer would.
type stuckExporter struct {
	release chan struct{}
	mu      sync.Mutex
	spans   int
}

func (e *stuckExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	e.spans += len(spans)
	e.mu.Unlock()
	return nil
}

func (e *stuckExporter) Shutdown(context.Context) error { return nil }

func cleaned(i int) reactor.Transition {
	now := time.Now()
	code := 0
	out := api.OutcomeExited
	return reactor.Transition{From: api.StateExited, Record: &api.Record{
		ID: "exec-" + string(rune('a'+i%26)), State: api.StateCleaned, Argv: []string{"true"},
		CreatedAt: now, StartedAt: &now, ExitedAt: &now, CleanedAt: &now, ExitCode: &code, Outcome: &out,
	}}
}

// TestExportNeverBlocks: with the exporter stuck, Transition still returns
// at once for every execution; what does not fit in the bounded queues is
// dropped and counted, and every span is either exported or counted.
func TestExportNeverBlocks(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
	exp := &stuckExporter{release: make(chan struct{})}
	tr, err := New(context.Background(), Options{Exporter: exp, Queue: 2})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	done := make(chan struct{})
	go func() {
		for i := 0; i < n; i++ {
			tr.Transition(cleaned(i))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Transition blocked behind a stuck exporter")
	}
	if tr.Dropped() == 0 || tr.Dropped()%spansPerExecution != 0 {
		t.Errorf("Dropped() = %d, want a positive multiple of %d", tr.Dropped(), spansPerExecution)
	}
	close(exp.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	exp.mu.Lock()
	defer exp.mu.Unlock()
	if got := int64(exp.spans) + tr.Dropped(); got != n*spansPerExecution {
		t.Errorf("exported %d + dropped %d = %d spans, want %d", exp.spans, tr.Dropped(), got, n*spansPerExecution)
	}
}

// TestFlush: Flush hands everything queued before it to the exporter,
// without shutting the tracer down.
func TestFlush(t *testing.T) {
	exp := &stuckExporter{release: make(chan struct{})}
	close(exp.release)
	tr, err := New(context.Background(), Options{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	for i := 0; i < 3; i++ {
		tr.Transition(cleaned(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	exp.mu.Lock()
	got := exp.spans
	exp.mu.Unlock()
	if got != 3*spansPerExecution {
		t.Errorf("after Flush the exporter has %d spans, want %d", got, 3*spansPerExecution)
	}
	tr.Transition(cleaned(3)) // still taking executions
}
