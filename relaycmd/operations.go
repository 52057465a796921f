package relaycmd

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/metrics"
)

// backlogEvery spaces the refreshes of the backlog gauges, which count the
// whole backlog: once a minute, the first a minute after start.
const backlogEvery = time.Minute

// operations are what relay run adds around the engine: the tracer
// provider, the metrics and the admin server.
type operations struct {
	tracer  *sdktrace.TracerProvider // nil: tracing off
	metrics *metrics.Metrics         // nil: admin server off
	reg     *prometheus.Registry     // the metrics' registry
	store   *deadletter.Store
	server  *admin.Server
	ln      net.Listener

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startOperations sets up tracing and the metrics as the configuration
// says, wiring them into cfg (TracerProvider, Observer). Call listen once
// the relay exists, then serve, and stop at the end.
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
	m, err := metrics.New(reg, metrics.Config{MySQL: db.my != nil, CaptureWAL: s.file.Database.Capture == string(relay.CaptureWAL), Version: s.version})
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	store, err := db.deadLetters(s.tables)
	if err != nil {
		return nil, ops.shutdownTracer(ctx, err)
	}
	ops.metrics, ops.reg, ops.store = m, reg, store
	cfg.Observer = m
	return ops, nil
}

// listen builds the admin server of r, when the configuration asks for
// one, and binds its address, so that a port in use fails before the relay
// runs.
func (o *operations) listen(s *setup, db database, r *relay.Relay) error {
	if o.metrics == nil {
		return nil
	}
	server, err := admin.NewForRelay(r, admin.Opts{
		Config:          s.file.Admin.Config(),
		DB:              db,
		DeadLetters:     o.store,
		Metrics:         promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{}),
		Console:         s.file.Admin.ConsoleEnabled(),
		ConsoleReadOnly: s.file.Admin.ConsoleReadOnly,
		Logger:          s.logger,
	})
	if err != nil {
		return err
	}
	ln, err := server.Listen()
	if err != nil {
		return err
	}
	o.server, o.ln = server, ln
	return nil
}

// serve starts the admin server and the backlog refresh, until stop.
func (o *operations) serve(ctx context.Context) {
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
