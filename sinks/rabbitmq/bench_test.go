package rabbitmq

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/rabbitmq/rabbitmqtest"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func benchEvent(queue string, i int) sinks.Event {
	e := sinktest.Event(queue, fmt.Sprintf("customer-%d", i%16), make([]byte, 200))
	e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme"}
	return e
}

func BenchmarkEncode(b *testing.B) {
	e := benchEvent("orders.created", 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(e, DefaultMaxMessageSize); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishBatch1000 publishes batches of 1,000 events (the relay's
// default batch size) with confirms to a durable queue (the broker writes
// each persistent message before confirming it) and to a transient one
// (it does not), which shows what the disk costs.
func BenchmarkPublishBatch1000(b *testing.B) {
	for _, durable := range []bool{true, false} {
		b.Run(fmt.Sprintf("durable=%v", durable), func(b *testing.B) {
			url := rabbitmqtest.URL(b)
			conn, err := amqp.Dial(url)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			queue := "herald_bench_" + uuid.NewString()[:8]
			if _, err := ch.QueueDeclare(queue, durable, false, false, false, amqp.Table{"x-max-length": int32(100_000)}); err != nil {
				b.Fatal(err)
			}
			defer ch.QueueDelete(queue, false, false, false)
			s, err := New("bench", Config{URL: sinks.Secret(url)}, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			events := make([]sinks.Event, 1000)
			b.ReportAllocs()
			for b.Loop() {
				for i := range events {
					events[i] = benchEvent(queue, i)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				for i, err := range s.Publish(ctx, events) {
					if err != nil {
						b.Fatalf("event %d: %v", i, err)
					}
				}
				cancel()
			}
			b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
		})
	}
}
