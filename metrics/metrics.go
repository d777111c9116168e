// Package metrics exports corrald's Prometheus metrics: counters and
// histograms fed by a reactor.Observer, served at /metrics in the text
// exposition format by Serve, and beside them the daemon's goroutine
// profile at /debug/pprof/goroutine.
//
// Labels are of bounded cardinality only (an outcome, a phase, a stream),
// never an id, an owner or an argv. The Observer methods run on the
// reactor's loop goroutine and only touch atomics (every labelled child is
// made up front); scrapes run on the HTTP server's goroutines.
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/api"
	"github.com/corral-dev/corral/reactor"
)

// Options are what the metrics read from elsewhere, on each scrape.
type Options struct {
	// Running returns the executions not yet cleaned (reactor.Running).
	Running func() int
	// SpansDropped returns the trace spans dropped because the exporter
	// was behind (tracing.Tracer.Dropped); nil: no such metric.
	SpansDropped func() int64
}

// Metrics is corrald's registry and the reactor.Observer that feeds it.
type Metrics struct {
	reg *prometheus.Registry

	started              prometheus.Counter
	finished             map[api.Outcome]prometheus.Counter
	finishedOther        prometheus.Counter
	phaseStart, phaseRun prometheus.Observer
	phaseCleanup         prometheus.Observer
	stdout, stderr       prometheus.Counter
	commit               prometheus.Observer
	commitFailed         prometheus.Counter
}

var _ reactor.Observer = (*Metrics)(nil)

// New makes the registry: corral's families, and the Go runtime and
// process collectors.
func New(o Options) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg, finished: map[api.Outcome]prometheus.Counter{}}
	m.started = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "corral_executions_started_total",
		Help: "Executions created by exec.start.",
	})
	finished := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "corral_executions_finished_total",
		Help: "Executions cleaned up, by outcome.",
	}, []string{"outcome"})
	// One series per api.Outcomes; anything else counts as "other".
	for _, oc := range api.Outcomes {
		m.finished[oc] = finished.WithLabelValues(string(oc))
	}
	m.finishedOther = finished.WithLabelValues("other")
	phase := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "corral_exec_phase_seconds",
		Help: "Time executions spent in each phase: start (created to running, or to exited when the start failed), run (running to exited), cleanup (exited to cleaned).",
		// 1 ms to about 30 min.
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 11),
	}, []string{"phase"})
	m.phaseStart = phase.WithLabelValues("start")
	m.phaseRun = phase.WithLabelValues("run")
	m.phaseCleanup = phase.WithLabelValues("cleanup")
	output := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "corral_output_bytes_total",
		Help: "Bytes read from executions' output, by stream (before redaction and the output limit).",
	}, []string{"stream"})
	m.stdout = output.WithLabelValues("stdout")
	m.stderr = output.WithLabelValues("stderr")
	commit := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "corral_store_commit_seconds",
		Help: "Time from queueing a record's write to the store's acknowledgment.",
		// 50 µs to about 3 s.
		Buckets: prometheus.ExponentialBuckets(0.00005, 3, 11),
	})
	m.commit = commit
	m.commitFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "corral_store_commit_failures_total",
		Help: "Store writes that failed (the reactor retries them).",
	})
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "corral_executions_running",
		Help: "Executions not yet cleaned up.",
	}, func() float64 {
		if o.Running == nil {
			return 0
		}
		return float64(o.Running())
	})
	reg.MustRegister(m.started, finished, phase, output, commit, m.commitFailed, running,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.SpansDropped != nil {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "corral_trace_spans_dropped_total",
			Help: "Trace spans dropped because the OTLP exporter was behind (supervision never waits for it).",
		}, func() float64 { return float64(o.SpansDropped()) }))
	}
	return m
}

// Registry returns the registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Transition implements reactor.Observer.
func (m *Metrics) Transition(t reactor.Transition) {
	rec := t.Record
	switch rec.State {
	case api.StateStarted:
		m.started.Inc()
	case api.StateRunning:
		if rec.StartedAt != nil {
			m.phaseStart.Observe(rec.StartedAt.Sub(rec.CreatedAt).Seconds())
		}
	case api.StateExited:
		if rec.ExitedAt == nil {
			return
		}
		if rec.StartedAt != nil {
			m.phaseRun.Observe(rec.ExitedAt.Sub(*rec.StartedAt).Seconds())
		} else {
			m.phaseStart.Observe(rec.ExitedAt.Sub(rec.CreatedAt).Seconds())
		}
	case api.StateCleaned:
		if rec.ExitedAt != nil && rec.CleanedAt != nil {
			m.phaseCleanup.Observe(rec.CleanedAt.Sub(*rec.ExitedAt).Seconds())
		}
		c := m.finishedOther
		if rec.Outcome != nil {
			if oc, ok := m.finished[*rec.Outcome]; ok {
				c = oc
			}
		}
		c.Inc()
	}
}

// Output implements reactor.Observer.
func (m *Metrics) Output(stream string, n int) {
	if stream == "stderr" {
		m.stderr.Add(float64(n))
		return
	}
	m.stdout.Add(float64(n))
}

// StoreCommit implements reactor.Observer.
func (m *Metrics) StoreCommit(d time.Duration, ok bool) {
	if !ok {
		m.commitFailed.Inc()
		return
	}
	m.commit.Observe(d.Seconds())
}

// Handler serves the registry in the exposition formats Prometheus asks
// for.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Listen opens addr for the metrics server: "unix:PATH" or an absolute
// path is a Unix socket (mode 0660, replacing a stale one), anything else
// a TCP host:port that must be a loopback address (metrics are for this
// host: a scraper elsewhere goes through a proxy the operator chooses).
func Listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix:")
	if isUnix || strings.HasPrefix(addr, "/") {
		if !isUnix {
			path = addr
		}
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("--metrics-listen %s: want an absolute socket path", addr)
		}
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(path)
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		if err := os.Chmod(path, 0o660); err != nil {
			ln.Close()
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		return ln, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: want HOST:PORT on loopback or unix:PATH", addr)
	}
	if host != "localhost" {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("--metrics-listen %s: %q is not a loopback address (use 127.0.0.1, [::1] or unix:PATH)", addr, host)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	return ln, nil
}

// Server is the metrics HTTP server.
type Server struct {
	srv  *http.Server
	done chan struct{}
}

// Serve serves m at /metrics on ln until Close, and the goroutine
// profile at /debug/pprof/goroutine when ln is a Unix socket: its file
// mode and group say who may read the daemon's stacks (and stop its world
// for ?debug=2), where a loopback TCP port is open to every local process,
// the commands corral runs with the host's network among them.
func Serve(ln net.Listener, m *Metrics, log zerolog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	if ln.Addr().Network() == "unix" {
		mux.HandleFunc("GET /debug/pprof/goroutine", serveGoroutines)
	}
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	return s
}

// serveGoroutines writes the goroutine profile, as net/http/pprof's
// /debug/pprof/goroutine does (without importing it: it registers on
// http.DefaultServeMux): ?debug=0 (the default) for go tool pprof, 1
// counts by stack, 2 every goroutine's stack with its id, as a crash dump
// shows them. Unlike go_goroutines, a number sampled inside a scrape among
// a varying count of the registry's own collecting goroutines, the profile
// is taken with the world stopped and this request runs the same two
// goroutines each time (its connection's and its background reader), so
// two profiles of an idle daemon list the same goroutines.
func serveGoroutines(w http.ResponseWriter, r *http.Request) {
	debug := 0
	if v := r.FormValue("debug"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 2 {
			http.Error(w, "debug: want 0, 1 or 2", http.StatusBadRequest)
			return
		}
		debug = n
	}
	if debug == 0 {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="goroutine"`)
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	if err := pprof.Lookup("goroutine").WriteTo(w, debug); err != nil {
		http.Error(w, fmt.Sprintf("goroutine profile: %v", err), http.StatusInternalServerError)
	}
}

// Close stops the server and waits for it.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}
