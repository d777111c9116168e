// Package tracing exports one OpenTelemetry trace per execution over OTLP:
// a root span "exec" from created to cleaned, with child spans "start"
// (created to running), "run" (running to exited) and "cleanup" (exited to
// cleaned). It is configured by the standard OTEL_* environment variables
// and off when no OTLP endpoint is set.
//
// Supervision never waits for it: the Tracer is a reactor.Observer whose
// Transition, on the loop goroutine, only copies a cleaned record into a
// bounded channel (dropping it, counted, when full); one goroutine of its
// own builds the spans and hands them to the SDK's batch processor, whose
// exports may be as slow as the collector is.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
)

// spansPerExecution is how many spans one execution's trace has.
const spansPerExecution = 4

// DefaultQueue is how many cleaned executions may wait for the span
// builder before new ones are dropped.
const DefaultQueue = 4096

// Enabled reports whether the environment asks for traces: an OTLP
// endpoint is set (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT), and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none turns them off.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Options configure a Tracer. Zero values take the defaults.
type Options struct {
	Version string // service.version
	Log     zerolog.Logger
	// Queue bounds the executions waiting for the span builder
	// (DefaultQueue).
	Queue int
	// Exporter replaces the OTLP/HTTP exporter the environment configures
	// (tests).
	Exporter sdktrace.SpanExporter
}

// Tracer turns cleaned executions into traces. Its Observer methods may be
// called from one goroutine (the reactor's loop); Shutdown from any.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	log      zerolog.Logger
	jobs     chan job
	done     chan struct{}
	dropped  atomic.Int64
	closed   sync.Once
}

var _ reactor.Observer = (*Tracer)(nil)

// job is what the span builder needs of a cleaned execution: a copy, since
// the record belongs to the loop.
type job struct {
	id, argv0, traceparent, backend string
	uid                             uint32
	pid                             int32
	outcome                         api.Outcome
	exitCode                        *int
	signal                          string
	created                         time.Time
	started, exited, cleaned        *time.Time
	// flushed, when set, makes this a marker: the builder closes it once
	// every job before it is with the SDK.
	flushed chan struct{}
}

// New returns a Tracer exporting over OTLP as the OTEL_* environment says
// (endpoint, headers, timeout, compression, sampler, batch sizes, resource
// attributes). Call it only when Enabled; an exporter is created even if
// the collector is down (exports then fail and are logged, later).
func New(ctx context.Context, o Options) (*Tracer, error) {
	exp := o.Exporter
	if exp == nil {
		if p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("traces: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL %q: only http/protobuf is supported", p)
		}
		if p := os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "" {
			return nil, fmt.Errorf("traces: OTEL_EXPORTER_OTLP_PROTOCOL %q: only http/protobuf is supported", p)
		}
		var err error
		if exp, err = otlptracehttp.New(ctx); err != nil {
			return nil, fmt.Errorf("traces: OTLP exporter: %w", err)
		}
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "corrald"), attribute.String("service.version", o.Version)))
	if err != nil {
		return nil, fmt.Errorf("traces: resource: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the defaults.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	// WithBlocking: when the batch queue is full, the span builder waits
	// for room instead of dropping silently; the loop never waits, since
	// what backs up is the builder's own channel, whose drops are counted.
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithBatcher(exp, sdktrace.WithBlocking()),
	)
	q := o.Queue
	if q <= 0 {
		q = DefaultQueue
	}
	t := &Tracer{
		provider: provider,
		tracer:   provider.Tracer("github.com/corral-dev/corral/tracing"),
		log:      o.Log,
		jobs:     make(chan job, q),
		done:     make(chan struct{}),
	}
	go t.build()
	return t, nil
}

// Dropped returns how many spans were dropped because the builder was
// behind.
func (t *Tracer) Dropped() int64 { return t.dropped.Load() }

// Transition implements reactor.Observer: a cleaned execution's record is
// queued for the span builder; nothing else is kept. Never blocks.
func (t *Tracer) Transition(tr reactor.Transition) {
	rec := tr.Record
	if rec.State != api.StateCleaned {
		return
	}
	j := job{
		id: rec.ID, traceparent: tr.Traceparent, backend: rec.Backend,
		uid: rec.Owner.UID, pid: rec.Owner.PID, created: rec.CreatedAt,
		started: rec.StartedAt, exited: rec.ExitedAt, cleaned: rec.CleanedAt,
		exitCode: rec.ExitCode,
	}
	if len(rec.Argv) > 0 {
		j.argv0 = rec.Argv[0]
	}
	if rec.Outcome != nil {
		j.outcome = *rec.Outcome
	}
	if rec.Signal != nil {
		j.signal = *rec.Signal
	}
	select {
	case t.jobs <- j:
	default:
		t.dropped.Add(spansPerExecution)
	}
}

// Output implements reactor.Observer; traces have no use for it.
func (t *Tracer) Output(string, int) {}

// StoreCommit implements reactor.Observer; traces have no use for it.
func (t *Tracer) StoreCommit(time.Duration, bool) {}

func (t *Tracer) build() {
	defer close(t.done)
	for j := range t.jobs {
		if j.flushed != nil {
			close(j.flushed)
			continue
		}
		t.emit(j)
	}
}

// emit records j's trace, with the record's own timestamps.
func (t *Tracer) emit(j job) {
	ctx := context.Background()
	if j.traceparent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": j.traceparent})
	}
	end := j.created
	for _, ts := range []*time.Time{j.started, j.exited, j.cleaned} {
		if ts != nil {
			end = *ts
		}
	}
	attrs := []attribute.KeyValue{
		attribute.String("corral.exec.id", j.id),
		attribute.Int64("corral.exec.owner.uid", int64(j.uid)),
		attribute.Int64("corral.exec.owner.pid", int64(j.pid)),
		attribute.String("corral.exec.argv0", j.argv0),
		attribute.String("corral.exec.outcome", string(j.outcome)),
		attribute.String("corral.backend", j.backend),
	}
	if j.exitCode != nil {
		attrs = append(attrs, attribute.Int("corral.exec.exit_code", *j.exitCode))
	}
	if j.signal != "" {
		attrs = append(attrs, attribute.String("corral.exec.signal", j.signal))
	}
	ctx, root := t.tracer.Start(ctx, "exec", trace.WithTimestamp(j.created), trace.WithAttributes(attrs...))
	child := func(name string, from time.Time, to *time.Time) {
		if to == nil {
			return
		}
		_, s := t.tracer.Start(ctx, name, trace.WithTimestamp(from))
		s.End(trace.WithTimestamp(*to))
	}
	switch {
	case j.started != nil:
		child("start", j.created, j.started)
		child("run", *j.started, j.exited)
	default: // the start failed (or the record was settled at start-up)
		child("start", j.created, j.exited)
	}
	if j.exited != nil {
		child("cleanup", *j.exited, j.cleaned)
	}
	// A command's own non-zero exit is its business; corral ending it
	// (timeout, limits, cancel) or failing to run it is an error.
	if j.outcome != api.OutcomeExited {
		root.SetStatus(codes.Error, string(j.outcome))
	}
	root.End(trace.WithTimestamp(end))
}

// Flush exports what was queued before the call, within ctx; Transition
// may go on meanwhile. Not on the loop goroutine (it waits); not after
// Shutdown.
func (t *Tracer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case t.jobs <- job{flushed: done}:
	case <-ctx.Done():
		return fmt.Errorf("traces: flush: %w", ctx.Err())
	}
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("traces: flush: %w", ctx.Err())
	}
	if err := t.provider.ForceFlush(ctx); err != nil {
		return fmt.Errorf("traces: flush: %w", err)
	}
	return nil
}

// Shutdown stops taking executions, builds the queued ones' spans and
// flushes them to the exporter, within ctx. Call it once the reactor's
// loop has stopped: no Transition may follow it.
func (t *Tracer) Shutdown(ctx context.Context) error {
	t.closed.Do(func() { close(t.jobs) })
	select {
	case <-t.done:
	case <-ctx.Done():
		return fmt.Errorf("traces: shutdown: %w", ctx.Err())
	}
	if n := t.dropped.Load(); n > 0 {
		t.log.Warn().Int64("spans_dropped", n).Msg("traces: spans were dropped while the exporter was behind")
	}
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("traces: shutdown: %w", err)
	}
	return nil
}
