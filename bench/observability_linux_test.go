package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/tests/testd"
)

// obsN is the number of samples per side in the observability measurement.
var obsN = 300

// otlpSink is an OTLP/HTTP trace endpoint that reads and acknowledges
// every export (an empty ExportTraceServiceResponse is an empty protobuf
// message), as a collector on this host would.
func otlpSink(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var bytes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), &bytes
}

// scrapeEvery GETs /metrics from a Unix socket every d until the test
// ends, as Prometheus would (more often than its default 15s), and counts
// the scrapes.
func scrapeEvery(t *testing.T, sock string, d time.Duration) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	go func() {
		defer close(done)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			resp, err := client.Get("http://corrald/metrics")
			if err != nil {
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				n.Add(1)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; client.CloseIdleConnections() })
	return &n
}

// benchObservability is (j): what metrics and traces cost an execution.
// Two cgroup daemons alike but for observability, one with
// --metrics-listen (scraped every second) and an OTLP endpoint (a sink on
// loopback), one with neither; start+wait of /bin/true on each,
// interleaved.
func (s *suite) benchObservability(t *testing.T) {
	off := s.startDaemon(t, "obs-off", "cgroup", 0)
	endpoint, exported := otlpSink(t)
	dir := t.TempDir()
	msock := filepath.Join(dir, "metrics.sock")
	on := testd.Start(t, testd.Config{
		Name: "obs-on", Corrald: s.bin, Dir: dir,
		CgroupBase: testd.StrictCgroupBase(t, cgroupMount, "corral-bench"),
		Args: []string{"--scope", "cgroup", "--log-level", "warn", "--drain", "1s", "--kill-wait", "5s",
			"--max-running", "20000", "--max-per-uid", "20000", "--pool-size", strconv.Itoa(0),
			"--metrics-listen", "unix:" + msock},
		// The SDK's default batching (a batch every 5s or 512 spans).
		Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint},
	})
	scrapes := scrapeEvery(t, msock, time.Second)
	cOff, cOn := off.Client(), on.Client()
	ctx := ctxT(t, 10*time.Minute)
	var wOff, wOn durations
	for i := 0; i < latencyWU+obsN; i++ {
		rec := i >= latencyWU
		rotate(i,
			func() {
				if d := runWait(t, ctx, cOff, nil); rec {
					wOff = append(wOff, d)
				}
			},
			func() {
				if d := runWait(t, ctx, cOn, nil); rec {
					wOn = append(wOn, d)
				}
			})
	}
	// Let the last batch go out, so that the note can say traces were sent.
	deadline := time.Now().Add(10 * time.Second)
	for exported.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if exported.Load() == 0 {
		t.Errorf("the observed daemon exported no trace to the OTLP sink")
	}
	if scrapes.Load() == 0 {
		t.Errorf("no scrape of /metrics succeeded")
	}
	s.latencyTable("(j) what observability costs: exec latency with metrics and traces on",
		fmt.Sprintf("start+wait of /bin/true, cgroup backend, --pool-size 0, sqlite store; %d samples per side after %d warm-up rounds, the two daemons alternating. "+
			"\"on\": --metrics-listen on a Unix socket scraped every second (%d scrapes) and OTEL_EXPORTER_OTLP_ENDPOINT at an OTLP/HTTP sink on loopback (the SDK's default batching; %d bytes of traces received); \"off\": neither.",
			obsN, latencyWU, scrapes.Load(), exported.Load()),
		[]latencyRow{{"metrics + traces on vs off", "corrald --metrics-listen, OTLP on", "corrald, both off", wOn, wOff}})
	s.target("(j) metrics+traces on: p50 within 1.05× of off", float64(wOn.pct(.5))/float64(wOff.pct(.5)), 1.05, "×")
}
