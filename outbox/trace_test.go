package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/outbox"
)

// tracedContext returns a context carrying a recording span, with the
// traceparent it propagates as.
func tracedContext(t *testing.T) (context.Context, string) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	t.Cleanup(func() { span.End() })
	ts, err := trace.ParseTraceState("shop=1")
	if err != nil {
		t.Fatal(err)
	}
	ctx = trace.ContextWithSpanContext(ctx, span.SpanContext().WithTraceState(ts))
	sc := span.SpanContext()
	return ctx, fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
}

func TestEnqueueCapturesTraceContext(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{Propagator: propagation.TraceContext{}})
			ctx, traceparent := tracedContext(t)
			many := map[string]string{}
			for i := range outbox.MaxHeaders {
				many[fmt.Sprintf("h%d", i)] = "v"
			}
			events := []outbox.Event{
				{Topic: "plain"},
				{Topic: "with-headers", Headers: map[string]string{"X-Tenant": "acme"}},
				{Topic: "own-traceparent", Headers: map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}},
				{Topic: "own-tracestate", Headers: map[string]string{"Tracestate": "mine=1"}},
				{Topic: "full", Headers: many},
			}
			if _, err := enqueueCtx(ctx, t, b, d, events...); err != nil {
				t.Fatal(err)
			}
			rows := readRows(t, b)
			byTopic := map[string]map[string]string{}
			for _, r := range rows {
				byTopic[r.topic] = r.headers
			}
			if h := byTopic["plain"]; h["traceparent"] != traceparent || h["tracestate"] != "shop=1" || len(h) != 2 {
				t.Fatalf("plain: %v, want traceparent %s", h, traceparent)
			}
			if h := byTopic["with-headers"]; h["traceparent"] != traceparent || h["X-Tenant"] != "acme" || len(h) != 3 {
				t.Fatalf("with-headers: %v", h)
			}
			if h := byTopic["own-traceparent"]; h["traceparent"] != "00-11111111111111111111111111111111-2222222222222222-01" || len(h) != 1 {
				t.Fatalf("own-traceparent was overwritten: %v", h)
			}
			if h := byTopic["own-tracestate"]; h["Tracestate"] != "mine=1" || len(h) != 1 {
				t.Fatalf("own-tracestate was changed: %v", h)
			}
			if h := byTopic["full"]; len(h) != outbox.MaxHeaders || h["traceparent"] != "" {
				t.Fatalf("an event at the header limit got %d headers", len(h))
			}
			// The caller's maps are not modified.
			if len(events[0].Headers) != 0 || len(events[1].Headers) != 1 {
				t.Fatalf("caller's headers changed: %v %v", events[0].Headers, events[1].Headers)
			}
		})
	}
}

func TestEnqueueWithoutSpanAddsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{Propagator: propagation.TraceContext{}})
	if _, err := enqueueCtx(context.Background(), t, b, drivers[0], outbox.Event{Topic: "x"}); err != nil {
		t.Fatal(err)
	}
	// The global propagator writes nothing until the application sets one.
	g := setup(t, outbox.Config{})
	ctx, _ := tracedContext(t)
	if _, err := enqueueCtx(ctx, t, g, drivers[0], outbox.Event{Topic: "x"}); err != nil {
		t.Fatal(err)
	}
	for _, bb := range []*bundle{b, g} {
		if rows := readRows(t, bb); len(rows) != 1 || len(rows[0].headers) != 0 {
			t.Fatalf("headers added: %+v", rows)
		}
	}
}

// enqueueCtx is a driver's Enqueue with the given context, committed.
func enqueueCtx(ctx context.Context, t *testing.T, b *bundle, d driver, events ...outbox.Event) (int, error) {
	t.Helper()
	switch {
	case strings.HasPrefix(d.name, "pgx"):
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		ids, err := b.writer.Enqueue(ctx, tx, events...)
		if err != nil {
			return 0, err
		}
		return len(ids), tx.Commit(ctx)
	default:
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		ids, err := b.writer.EnqueueSQL(ctx, tx, events...)
		if err != nil {
			return 0, err
		}
		return len(ids), tx.Commit()
	}
}
