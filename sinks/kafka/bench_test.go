package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func benchEvents(topic string, n int) []sinks.Event {
	events := make([]sinks.Event, n)
	for i := range events {
		key := fmt.Sprintf("customer-%d", i%100)
		e := sinktest.Event(topic, key, fmt.Appendf(nil, `{"order":%d,"customer":%q,"total":"129.90","currency":"EUR","lines":[{"sku":"A-1","qty":2}]}`, i, key))
		e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme"}
		events[i] = e
	}
	return events
}

// BenchmarkEncode measures turning one event into a kafka-go message.
func BenchmarkEncode(b *testing.B) {
	e := benchEvents("bench", 1)[0]
	b.ReportAllocs()
	for b.Loop() {
		m := encode(e)
		_ = messageSize(&m)
	}
}

// BenchmarkPublish measures Publish calls of 500 events (100 keys) to a
// 4-partition topic on an in-process broker over TCP, with acks=all.
func BenchmarkPublish(b *testing.B) {
	c := newCluster(b)
	addr := c.ListenAddrs()[0]
	createTopic(b, c, "bench", 4, nil)
	s := newSink(b, Config{Brokers: []string{addr}})
	events := benchEvents("bench", 500)
	ctx := context.Background()
	requireOK(b, s.Publish(ctx, events)) // connect and load metadata
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		requireOK(b, s.Publish(ctx, events))
	}
	b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkPublishOne measures the latency of publishing a single event for
// several batch_timeout values: the time a partition's batch waits is added
// to every call, which is why the default is 1µs and not kafka-go's 1s.
func BenchmarkPublishOne(b *testing.B) {
	c := newCluster(b)
	addr := c.ListenAddrs()[0]
	createTopic(b, c, "one", 4, nil)
	for _, timeout := range []time.Duration{time.Microsecond, 100 * time.Microsecond, time.Millisecond, 5 * time.Millisecond, time.Second} {
		b.Run("batch_timeout="+timeout.String(), func(b *testing.B) {
			s := newSink(b, Config{Brokers: []string{addr}, BatchTimeout: timeout})
			events := benchEvents("one", 1)
			ctx := context.Background()
			requireOK(b, s.Publish(ctx, events))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				requireOK(b, s.Publish(ctx, events))
			}
		})
	}
}
