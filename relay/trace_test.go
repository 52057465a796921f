package relay_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks/webhook"
)

// TestTraceContinuesFromProducerToWebhook: a producer span encloses the
// enqueue; the relay's publish span is its child; the webhook receives the
// publish span's traceparent.
func TestTraceContinuesFromProducerToWebhook(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(ctx) }()
	prop := propagation.TraceContext{}

	got := make(chan http.Header, 1)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Clone():
		default:
		}
	}))
	defer endpoint.Close()
	hook, err := webhook.New("hook", webhook.Config{URL: endpoint.URL}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close(ctx)

	// The producer: a span around the business transaction.
	w, err := outbox.NewWriter(outbox.Config{Tables: tables, Propagator: prop})
	if err != nil {
		t.Fatal(err)
	}
	prodCtx, producer := tp.Tracer("shop").Start(ctx, "place order")
	tx, err := pool.Begin(prodCtx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Enqueue(prodCtx, tx, outbox.Event{Topic: "orders.created", Payload: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(prodCtx); err != nil {
		t.Fatal(err)
	}
	producer.End()

	r, err := relay.NewPostgres(pool, relay.Config{
		Tables: tables, PollOnly: true, PollInterval: 20 * time.Millisecond, TracerProvider: tp, Propagator: prop,
		Routes: []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: hook}}}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { stop(); <-done }()

	var h http.Header
	select {
	case h = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the webhook received nothing")
	}
	var publish tracetest.SpanStub
	deadline := time.Now().Add(5 * time.Second)
	for publish.Name == "" && time.Now().Before(deadline) {
		for _, s := range exp.GetSpans() {
			if strings.HasPrefix(s.Name, "publish ") {
				publish = s
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if publish.Name != "publish orders.created" || publish.SpanKind != trace.SpanKindProducer {
		t.Fatalf("no publish span; spans: %v", exp.GetSpans())
	}
	psc := producer.SpanContext()
	if publish.SpanContext.TraceID() != psc.TraceID() || publish.Parent.SpanID() != psc.SpanID() {
		t.Fatalf("publish span (trace %s, parent %s) does not continue the producer span (trace %s, span %s)",
			publish.SpanContext.TraceID(), publish.Parent.SpanID(), psc.TraceID(), psc.SpanID())
	}
	arrived := prop.Extract(ctx, propagation.HeaderCarrier(h))
	asc := trace.SpanContextFromContext(arrived)
	if !asc.IsValid() || asc.TraceID() != psc.TraceID() || asc.SpanID() != publish.SpanContext.SpanID() {
		t.Fatalf("webhook traceparent %q: want trace %s with parent span %s (the publish span)",
			h.Get("traceparent"), psc.TraceID(), publish.SpanContext.SpanID())
	}
}
