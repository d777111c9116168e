package main

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/corral-dev/corral/metrics"
	"github.com/corral-dev/corral/reactor"
	"github.com/corral-dev/corral/tracing"
)

// observability is what watches the reactor: Prometheus metrics (with
// --metrics-listen) and OpenTelemetry traces (with an OTLP endpoint in the
// environment). Either, both or neither.
type observability struct {
	metrics *metrics.Metrics
	ln      net.Listener
	server  *metrics.Server
	tracer  *tracing.Tracer
	reactor atomic.Pointer[reactor.Reactor] // for the running gauge
}

// startObservability opens the metrics listener and the trace exporter;
// the metrics are served once serveMetrics has the reactor.
func startObservability(ctx context.Context, c *config, log zerolog.Logger) (*observability, error) {
	o := &observability{}
	if tracing.Enabled(os.Getenv) {
		t, err := tracing.New(ctx, tracing.Options{Version: version, Log: log})
		if err != nil {
			return nil, err
		}
		o.tracer = t
		log.Info().Msg("exporting a trace per execution over OTLP")
	}
	if c.metricsAddr != "" {
		ln, err := metrics.Listen(c.metricsAddr)
		if err != nil {
			o.close(log)
			return nil, err
		}
		opts := metrics.Options{Running: func() int {
			if r := o.reactor.Load(); r != nil {
				return r.Running()
			}
			return 0
		}}
		if o.tracer != nil {
			opts.SpansDropped = o.tracer.Dropped
		}
		o.metrics, o.ln = metrics.New(opts), ln
	}
	return o, nil
}

// observer is the reactor.Observer of what is on, or nil.
func (o *observability) observer() reactor.Observer {
	var obs []reactor.Observer
	if o.metrics != nil {
		obs = append(obs, o.metrics)
	}
	if o.tracer != nil {
		obs = append(obs, o.tracer)
	}
	switch len(obs) {
	case 0:
		return nil
	case 1:
		return obs[0]
	}
	return reactor.Observers(obs...)
}

// serveMetrics starts the metrics server, if any, for r.
func (o *observability) serveMetrics(r *reactor.Reactor, log zerolog.Logger) {
	o.reactor.Store(r)
	if o.metrics != nil {
		o.server = metrics.Serve(o.ln, o.metrics, log)
		log.Info().Str("metrics", o.ln.Addr().String()).Msg("serving metrics at /metrics")
	}
}

// flush exports the traces queued so far, for at most a second, before a
// handover replaces this image (which would lose them). Not on the loop.
func (o *observability) flush(log zerolog.Logger) {
	if o.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := o.tracer.Flush(ctx); err != nil {
		log.Warn().Err(err).Msg("traces not all exported before the handover")
	}
}

// close stops the metrics server and flushes the traces (for at most 5s:
// a collector that is down must not hold up the exit). After the loop.
func (o *observability) close(log zerolog.Logger) {
	if o.server != nil {
		o.server.Close()
	} else if o.ln != nil {
		o.ln.Close()
	}
	if o.tracer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := o.tracer.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("traces not all exported")
		}
	}
}
