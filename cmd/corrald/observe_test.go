package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/ipc"

	"github.com/corral-dev/corral/tests/testenv"
)

// daemon is a corrald started by startDaemon (the test binary re-run as
// main), on a socket and state directory of its own.
type daemon struct {
	socket string
	dir    string
	log    *bytes.Buffer
}

// startDaemon starts corrald with the pgroup backend, a memory store and
// args, with env added to its environment, and waits until it answers.
// It is stopped with SIGTERM (and must exit 0) at cleanup.
func startDaemon(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "corrald needs root")
	}
	d := &daemon{dir: t.TempDir(), log: &bytes.Buffer{}}
	d.socket = filepath.Join(d.dir, "corrald.sock")
	cmd := exec.Command(os.Args[0], append([]string{"--config", "/dev/null", "--log-format", "json",
		"--scope", "pgroup", "--store", "memory", "--pool-size", "0", "--socket-group", "",
		"--socket", d.socket, "--state-dir", filepath.Join(d.dir, "state")}, args...)...)
	cmd.Env = append(append(os.Environ(), mainEnv+"=1"), env...)
	var mu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return d.log.Write(p) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("corrald exited: %v", err)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("corrald did not stop within 30s of SIGTERM")
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("corrald's log:\n%s", d.log)
			mu.Unlock()
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := ipc.DialContext(context.Background(), d.socket)
		if err == nil {
			c.Close()
			return d
		}
		select {
		case err := <-exited:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("corrald exited before it listened: %v\n%s", err, d.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not listen within 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// run starts p on d and waits until it is cleaned.
func (d *daemon) run(t *testing.T, p api.StartParams) api.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ipc.DialContext(ctx, d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec, err := c.Start(ctx, p)
	if err != nil {
		t.Fatalf("exec.start %q: %v", p.Argv, err)
	}
	if rec, err = c.Wait(ctx, api.WaitParams{ID: rec.ID}); err != nil {
		t.Fatalf("exec.wait %s: %v", rec.ID, err)
	}
	return rec
}

// scrape GETs /metrics from a Unix socket and returns the text and the
// families parsed by the client library's text parser.
func scrape(t *testing.T, sock string) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://corrald/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return string(body), fams
}

// value is the counter, gauge or histogram count of family name whose
// labels include want.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// TestMetricsScrape: with --metrics-listen, /metrics is valid exposition
// text (the client library's parser, and promtool check metrics), has the
// families the protocol names, and its counters move as executions run.
func TestMetricsScrape(t *testing.T) {
	msock := filepath.Join(t.TempDir(), "metrics.sock")
	d := startDaemon(t, nil, "--metrics-listen", "unix:"+msock)

	text, fams := scrape(t, msock)
	for _, name := range []string{
		"corral_executions_started_total", "corral_executions_finished_total", "corral_executions_running",
		"corral_exec_phase_seconds", "corral_output_bytes_total", "corral_store_commit_seconds",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if _, ok := fams[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	promtool(t, text)
	if got := value(fams, "corral_executions_started_total"); got != 0 {
		t.Errorf("started before any execution = %v, want 0", got)
	}

	d.run(t, api.StartParams{Argv: []string{"sh", "-c", "printf 0123456789; printf abc >&2"}})
	d.run(t, api.StartParams{Argv: []string{"sh", "-c", "exit 3"}})
	d.run(t, api.StartParams{Argv: []string{"sleep", "30"}, TimeoutMS: 200, GraceMS: 100})
	d.run(t, api.StartParams{Argv: []string{"/nonexistent/tool"}})

	text, fams = scrape(t, msock)
	promtool(t, text)
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"corral_executions_started_total", nil, 4},
		{"corral_executions_finished_total", []string{"outcome", "exited"}, 2},
		{"corral_executions_finished_total", []string{"outcome", "timeout"}, 1},
		{"corral_executions_finished_total", []string{"outcome", "start_failed"}, 1},
		{"corral_executions_finished_total", []string{"outcome", "cancelled"}, 0},
		{"corral_executions_running", nil, 0},
		{"corral_exec_phase_seconds", []string{"phase", "start"}, 4},
		{"corral_exec_phase_seconds", []string{"phase", "run"}, 3},
		{"corral_exec_phase_seconds", []string{"phase", "cleanup"}, 4},
	} {
		if got := value(fams, tt.name, tt.labels...); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	if got := value(fams, "corral_output_bytes_total", "stream", "stdout"); got < 10 {
		t.Errorf("corral_output_bytes_total{stream=stdout} = %v, want at least 10", got)
	}
	if got := value(fams, "corral_output_bytes_total", "stream", "stderr"); got < 3 {
		t.Errorf("corral_output_bytes_total{stream=stderr} = %v, want at least 3", got)
	}
	if got := value(fams, "corral_store_commit_seconds"); got < 8 {
		t.Errorf("corral_store_commit_seconds count = %v, want one per durable write (at least 8)", got)
	}
	// Bounded cardinality: no label carries an id, an owner or an argv.
	for name, f := range fams {
		if !strings.HasPrefix(name, "corral_") {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if n := l.GetName(); n != "outcome" && n != "phase" && n != "stream" && n != "le" {
					t.Errorf("%s has label %s=%q", name, n, l.GetValue())
				}
			}
		}
	}
}

// promtool runs `promtool check metrics` on text, when CI has installed
// it (the prometheus package).
func promtool(t *testing.T, text string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool not installed (.ci/run installs the prometheus package): %v", err)
		}
		t.Log("promtool not installed; checked with the client library's parser only")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each export
// request with the OTLP protobuf types and keeps the spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	res   []*commonpb.KeyValue
	url   string
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rcv := &otlpReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("OTLP request: content type %q, %v", r.Header.Get("Content-Type"), err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		rcv.mu.Lock()
		for _, rs := range req.ResourceSpans {
			rcv.res = append(rcv.res, rs.GetResource().GetAttributes()...)
			for _, ss := range rs.ScopeSpans {
				rcv.spans = append(rcv.spans, ss.Spans...)
			}
		}
		rcv.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	rcv.url = "http://" + ln.Addr().String()
	return rcv
}

// waitSpans waits up to 30s for n spans of trace traceID.
func (r *otlpReceiver) waitSpans(t *testing.T, traceID []byte, n int) map[string]*tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.mu.Lock()
		got := map[string]*tracepb.Span{}
		for _, s := range r.spans {
			if bytes.Equal(s.TraceId, traceID) {
				got[s.Name] = s
			}
		}
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the receiver has spans %v of trace %x, want %d", keys(got), traceID, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func keys(m map[string]*tracepb.Span) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func attrs(s *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(v.IntValue)
		}
	}
	return m
}

// TestTracesExportedOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, one
// execution started with a traceparent is one trace at a real OTLP
// receiver: the root span "exec" is a child of the caller's span and
// carries the id, owner, argv[0], outcome and exit code; start, run and
// cleanup are its children, in order, within it.
func TestTracesExportedOverOTLP(t *testing.T) {
	rcv := startReceiver(t)
	d := startDaemon(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.url, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_SERVICE_NAME=", "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=test"})

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	rec := d.run(t, api.StartParams{Argv: []string{"sh", "-c", "exit 7"}, Traceparent: "00-" + traceID + "-" + parentID + "-01"})
	tid, _ := hex.DecodeString(traceID)
	pid, _ := hex.DecodeString(parentID)
	spans := rcv.waitSpans(t, tid, 4)

	root := spans["exec"]
	if root == nil {
		t.Fatalf("no span \"exec\" among %v", keys(spans))
	}
	if !bytes.Equal(root.ParentSpanId, pid) {
		t.Errorf("exec's parent = %x, want the traceparent's span %s", root.ParentSpanId, parentID)
	}
	a := attrs(root)
	for k, want := range map[string]string{
		"corral.exec.id": rec.ID, "corral.exec.owner.uid": fmt.Sprint(os.Getuid()), "corral.exec.argv0": "sh",
		"corral.exec.outcome": "exited", "corral.exec.exit_code": "7",
	} {
		if a[k] != want {
			t.Errorf("exec attribute %s = %q, want %q", k, a[k], want)
		}
	}
	if root.StartTimeUnixNano != uint64(rec.CreatedAt.UnixNano()) || root.EndTimeUnixNano != uint64(rec.CleanedAt.UnixNano()) {
		t.Errorf("exec spans %d..%d, want the record's created_at..cleaned_at %d..%d",
			root.StartTimeUnixNano, root.EndTimeUnixNano, rec.CreatedAt.UnixNano(), rec.CleanedAt.UnixNano())
	}
	prevEnd := root.StartTimeUnixNano
	for _, name := range []string{"start", "run", "cleanup"} {
		s := spans[name]
		if s == nil {
			t.Errorf("no span %q", name)
			continue
		}
		if !bytes.Equal(s.ParentSpanId, root.SpanId) {
			t.Errorf("%s's parent = %x, want exec's %x", name, s.ParentSpanId, root.SpanId)
		}
		if s.StartTimeUnixNano != prevEnd || s.EndTimeUnixNano < s.StartTimeUnixNano || s.EndTimeUnixNano > root.EndTimeUnixNano {
			t.Errorf("%s spans %d..%d; want it to start where the last phase ended (%d) and end within exec (%d)",
				name, s.StartTimeUnixNano, s.EndTimeUnixNano, prevEnd, root.EndTimeUnixNano)
		}
		prevEnd = s.EndTimeUnixNano
	}
	rcv.mu.Lock()
	res := map[string]string{}
	for _, kv := range rcv.res {
		res[kv.Key] = kv.Value.GetStringValue()
	}
	rcv.mu.Unlock()
	if res["service.name"] != "corrald" || res["deployment.environment"] != "test" {
		t.Errorf("resource = %v, want service.name corrald and OTEL_RESOURCE_ATTRIBUTES' deployment.environment", res)
	}
}
