package rabbitmq

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func benchEvent(queue string, i int) sinks.Event {
	e := sinktest.Event(queue, fmt.Sprintf("customer-%d", i%16), make([]byte, 200))
	e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme"}
	return e
}

// BenchmarkEncode encodes one event in each format: the cost of
// format: cloudevents next to the herald format.
func BenchmarkEncode(b *testing.B) {
	e := benchEvent("orders.created", 1)
	// 200 bytes of JSON, which the structured mode embeds as it is.
	e.Payload = []byte(`{"pad":"` + strings.Repeat("x", 190) + `"}`)
	for _, f := range []struct {
		name string
		cfg  Config
	}{
		{"herald", Config{}},
		{"cloudevents-binary", Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/bench"}}},
		{"cloudevents-structured", Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/bench"}}},
	} {
		b.Run(f.name, func(b *testing.B) {
			cfg := f.cfg.WithDefaults()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encode(e, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPublishBatch1000 publishes batches of 1,000 events (the relay's
// default batch size) with confirms to a durable classic queue (the broker
// writes each persistent message before confirming it), the same with
// RabbitMQ 3.10's second classic queue storage format (x-queue-version 2),
// and a transient queue (nothing written), which shows what storage costs.
func BenchmarkPublishBatch1000(b *testing.B) {
	queues := []struct {
		name    string
		durable bool
		args    amqp.Table
	}{
		{"durable", true, amqp.Table{}},
		{"durable-v2", true, amqp.Table{"x-queue-version": int32(2)}},
		{"transient", false, amqp.Table{}},
	}
	for _, qc := range queues {
		b.Run(qc.name, func(b *testing.B) {
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
			args := amqp.Table{"x-max-length": int32(100_000)}
			for k, v := range qc.args {
				args[k] = v
			}
			if _, err := ch.QueueDeclare(queue, qc.durable, false, false, false, args); err != nil {
				b.Fatal(err)
			}
			defer ch.QueueDelete(queue, false, false, false)
			s, err := New("bench", Config{URL: sinkconfig.Secret(url)}, slog.New(slog.DiscardHandler))
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
