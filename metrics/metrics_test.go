package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
)

// TestListenLoopbackOnly: metrics listen on loopback or a Unix socket,
// never on an address other hosts reach.
func TestListenLoopbackOnly(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want string // "" ok, else part of the error
	}{
		{"127.0.0.1:0", ""},
		{"localhost:0", ""},
		{"unix:" + filepath.Join(t.TempDir(), "m.sock"), ""},
		{filepath.Join(t.TempDir(), "m2.sock"), ""},
		{"0.0.0.0:9464", "not a loopback address"},
		{":9464", "not a loopback address"},
		{"192.0.2.1:9464", "not a loopback address"},
		{"example.com:9464", "not a loopback address"},
		{"unix:relative.sock", "absolute"},
		{"9464", "HOST:PORT"},
	} {
		ln, err := Listen(tt.addr)
		if tt.want == "" {
			if err != nil {
				t.Errorf("Listen(%q) = %v", tt.addr, err)
				continue
			}
			ln.Close()
			continue
		}
		if err == nil {
			ln.Close()
			t.Errorf("Listen(%q) = nil error, want one saying %q", tt.addr, tt.want)
		} else if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Listen(%q) = %v, want one saying %q", tt.addr, err, tt.want)
		}
	}
}

// TestFamilies: the registry gathers every family the protocol names, the
// gauge and the dropped-spans counter read their sources at scrape time,
// and a transition to cleaned counts its outcome.
func TestFamilies(t *testing.T) {
	running, dropped := 3, int64(8)
	m := New(Options{Running: func() int { return running }, SpansDropped: func() int64 { return dropped }})
	now := time.Now()
	later := now.Add(time.Second)
	out := api.OutcomeTimeout
	m.Transition(reactor.Transition{Record: &api.Record{State: api.StateStarted, CreatedAt: now}})
	m.Transition(reactor.Transition{From: api.StateExited, Record: &api.Record{State: api.StateCleaned, CreatedAt: now, ExitedAt: &now, CleanedAt: &later, Outcome: &out}})
	idle := api.OutcomeIdleTimeout
	m.Transition(reactor.Transition{From: api.StateExited, Record: &api.Record{State: api.StateCleaned, CreatedAt: now, ExitedAt: &now, CleanedAt: &later, Outcome: &idle}})
	m.Output("stderr", 5)
	m.StoreCommit(time.Millisecond, true)
	m.StoreCommit(time.Millisecond, false)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mm := range f.Metric {
			key := f.GetName()
			for _, l := range mm.Label {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case mm.Counter != nil:
				got[key] = mm.Counter.GetValue()
			case mm.Gauge != nil:
				got[key] = mm.Gauge.GetValue()
			case mm.Histogram != nil:
				got[key] = float64(mm.Histogram.GetSampleCount())
			}
		}
	}
	for key, want := range map[string]float64{
		"corral_executions_started_total":                        1,
		"corral_executions_finished_total{outcome=timeout}":      1,
		"corral_executions_finished_total{outcome=exited}":       0,
		"corral_executions_finished_total{outcome=idle_timeout}": 1,
		"corral_executions_finished_total{outcome=other}":        0,
		"corral_executions_running":                              3,
		"corral_exec_phase_seconds{phase=cleanup}":               2,
		"corral_output_bytes_total{stream=stderr}":               5,
		"corral_store_commit_seconds":                            1,
		"corral_store_commit_failures_total":                     1,
		"corral_trace_spans_dropped_total":                       8,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %t), want %v", key, v, ok, want)
		}
	}
	if _, ok := got["go_goroutines"]; !ok {
		t.Error("no Go runtime collector")
	}
}

// TestGoroutineProfile: /debug/pprof/goroutine serves the goroutine
// profile in the three forms net/http/pprof does (the server's own
// goroutine in it), and refuses any other form.
func TestGoroutineProfile(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	ln, err := Listen("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(ln, New(Options{}), zerolog.Nop())
	defer srv.Close()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer tr.CloseIdleConnections()
	get := func(query string) (int, string) {
		t.Helper()
		resp, err := (&http.Client{Transport: tr}).Get("http://corrald/debug/pprof/goroutine" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := get("?debug=2"); code != http.StatusOK || !strings.HasPrefix(body, "goroutine ") || !strings.Contains(body, "corral/metrics.Serve") {
		t.Errorf("?debug=2: %d %.300q, want every goroutine's stack, the metrics server's among them", code, body)
	}
	if code, body := get("?debug=1"); code != http.StatusOK || !strings.HasPrefix(body, "goroutine profile: total ") {
		t.Errorf("?debug=1: %d %.300q, want the counts by stack", code, body)
	}
	if code, body := get(""); code != http.StatusOK || !strings.HasPrefix(body, "\x1f\x8b") {
		t.Errorf("no debug: %d %.30q, want the gzipped protobuf profile go tool pprof reads", code, body)
	}
	if code, _ := get("?debug=3"); code != http.StatusBadRequest {
		t.Errorf("?debug=3: %d, want 400", code)
	}
}

// On a loopback TCP port, which every local process can reach, the
// goroutine profile is not served; /metrics is.
func TestGoroutineProfileOnlyOnUnixSocket(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Serve(ln, New(Options{}), zerolog.Nop())
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for path, want := range map[string]int{"/metrics": http.StatusOK, "/debug/pprof/goroutine?debug=2": http.StatusNotFound} {
		resp, err := c.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s on TCP: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
