package nats

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func benchEvent(subject string, i int) sinks.Event {
	e := sinktest.Event(subject, fmt.Sprintf("customer-%d", i%16), make([]byte, 256))
	e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme"}
	return e
}

func BenchmarkEncode(b *testing.B) {
	e := benchEvent("orders.created", 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(e, 1<<20, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPublishBatch500(b *testing.B) {
	for _, mode := range []Mode{ModeJetStream, ModeCore} {
		b.Run(string(mode), func(b *testing.B) {
			url := natstest.URL(b)
			str := natstest.Stream(b, natstest.Connect(b, url))
			s, err := New("bench", Config{URL: url, Mode: mode}, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			events := make([]sinks.Event, 500)
			for i := range events {
				events[i] = benchEvent(str.Subject("bench"), i)
			}
			b.ReportAllocs()
			for b.Loop() {
				for i := range events { // fresh ids: no duplicate short cut
					events[i] = benchEvent(str.Subject("bench"), i)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				for i, err := range s.Publish(ctx, events) {
					if err != nil {
						b.Fatalf("event %d: %v", i, err)
					}
				}
				cancel()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
		})
	}
}
