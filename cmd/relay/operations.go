package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/admin"
	"github.com/heraldhq/herald/relay/console"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/metrics"
	"github.com/heraldhq/herald/relay/throughput"
)

// backlogEvery spaces the refreshes of the backlog gauges.
const backlogEvery = 10 * time.Second

// The console's throughput charts: the last 15 minutes in 5 s steps.
const (
	throughputWindow = 15 * time.Minute
	throughputStep   = 5 * time.Second
)

// operations are what relay run adds around the engine: the tracer
// provider, the metrics, the throughput history and the admin server.
type operations struct {
	tracer     *sdktrace.TracerProvider // nil: tracing off
	metrics    *metrics.Metrics         // nil: admin server off
	throughput *throughput.History      // nil: admin server off
	store      *deadletter.Store
	server     *admin.Server
	ln         net.Listener

	mu    sync.Mutex
	relay *relay.Relay

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startOperations sets up tracing and the admin server as the
// configuration says, wiring them into cfg (TracerProvider, Observer). The
// admin address is bound now, so a port in use fails before the relay
// starts. Call serve once the relay exists, and stop at the end.
func (s *setup) startOperations(ctx context.Context, db database, cfg *relay.Config) (*operations, error) {
	ops := &operations{}
	if t := s.file.Tracing; t.Enabled() {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(t.OTLPEndpoint))
		if err != nil {
			return nil, fmt.Errorf("tracing.otlp_endpoint: creating the OTLP exporter: %w", err)
		}
		res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "herald-relay")))
		if err != nil {
			res = resource.Default()
		}
		ops.tracer = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.Ratio()))))
		logger := s.logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			logger.Warn("tracing: exporting spans failed", "error", err)
		}))
		cfg.TracerProvider = ops.tracer
		cfg.Propagator = propagation.TraceContext{}
		s.logger.InfoContext(ctx, "tracing: exporting spans over OTLP", "sample_ratio", t.Ratio())
	}
	if !s.file.Admin.Enabled() {
		return ops, nil
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	m, err := metrics.New(reg)
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	store, err := db.deadLetters(s.tables)
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	ops.throughput = throughput.New(throughputWindow, throughputStep)
	var ui http.Handler
	if s.file.Admin.ConsoleEnabled() {
		ui, err = console.New(console.Config{Token: s.file.Admin.Token, ReadOnly: s.file.Admin.ConsoleReadOnly}, console.Deps{
			DeadLetters: store,
			Sinks:       s.file.SinkNames(),
			Routes:      s.file.RouteSinks,
			PausedSinks: ops.pausedSinks,
			PauseErrors: ops.pauseErrors,
			SinkErrors:  ops.sinkErrors,
			Throughput:  ops.throughput,
			Logger:      s.logger,
		})
		if err != nil {
			return nil, ops.shutdownTracer(ctx, err)
		}
	}
	server, err := admin.New(s.file.Admin.Config(), admin.Deps{
		DB:            db,
		PausedSinks:   ops.pausedSinks,
		SinkErrors:    ops.sinkErrors,
		RecordFailure: ops.recordFailure,
		Superseded:    ops.superseded,
		Metrics:       promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		DeadLetters:   store,
		Console:       ui,
		Logger:        s.logger,
	})
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	ln, err := server.Listen()
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	ops.metrics, ops.store, ops.server, ops.ln = m, store, server, ln
	cfg.Observer = relay.Observers(m, ops.throughput)
	return ops, nil
}

// sinkErrors reports the relay's latest sink checks once it exists.
func (o *operations) sinkErrors() map[string]error {
	o.mu.Lock()
	r := o.relay
	o.mu.Unlock()
	if r == nil {
		return nil
	}
	out := map[string]error{}
	for name, c := range r.SinkChecks() {
		out[name] = c.Err
	}
	return out
}

// pausedSinks reports the relay's paused sinks once it exists.
func (o *operations) pausedSinks() map[string]time.Time {
	o.mu.Lock()
	r := o.relay
	o.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.PausedSinks()
}

// pauseErrors reports why the relay's paused sinks are down, once it
// exists.
func (o *operations) pauseErrors() map[string]error {
	o.mu.Lock()
	r := o.relay
	o.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.PauseErrors()
}

// recordFailure reports the relay's record failure once it exists.
func (o *operations) recordFailure() (time.Time, error) {
	o.mu.Lock()
	r := o.relay
	o.mu.Unlock()
	if r == nil {
		return time.Time{}, nil
	}
	return r.RecordFailure()
}

// superseded reports since when a newer configuration has been live, once
// the relay exists.
func (o *operations) superseded() time.Time {
	o.mu.Lock()
	r := o.relay
	o.mu.Unlock()
	if r == nil {
		return time.Time{}
	}
	return r.Superseded()
}

// serve starts the admin server and the backlog refresh, until stop.
func (o *operations) serve(ctx context.Context, r *relay.Relay) {
	o.mu.Lock()
	o.relay = r
	o.mu.Unlock()
	if o.server == nil {
		return
	}
	ctx, o.cancel = context.WithCancel(ctx)
	o.wg.Add(2)
	go func() {
		defer o.wg.Done()
		if err := o.server.Serve(ctx, o.ln); err != nil {
			o.server.Logger().Error("admin: server stopped", "error", err)
		}
	}()
	go func() {
		defer o.wg.Done()
		o.metrics.RefreshBacklog(ctx, backlogEvery, o.store.Totals, o.server.Logger())
	}()
}

// stop shuts the admin server down and flushes the spans.
func (o *operations) stop(ctx context.Context) error {
	if o.cancel != nil {
		o.cancel()
	} else if o.ln != nil {
		_ = o.ln.Close() // bound, never served
	}
	o.wg.Wait()
	return o.shutdownTracer(ctx, nil)
}

// shutdownTracer flushes and stops the tracer provider, joining any error
// to err.
func (o *operations) shutdownTracer(ctx context.Context, err error) error {
	if o.tracer == nil {
		return err
	}
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if serr := o.tracer.Shutdown(flushCtx); serr != nil {
		err = errors.Join(err, fmt.Errorf("flushing spans: %w", serr))
	}
	o.tracer = nil
	return err
}
