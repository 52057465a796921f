package pubsub_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// requestCounter is a pstest reactor that counts Publish requests and
// their messages, and lets the server handle them.
type requestCounter struct{ requests, messages atomic.Int64 }

func (c *requestCounter) React(req any) (bool, any, error) {
	c.requests.Add(1)
	c.messages.Add(int64(len(req.(*pubsubpb.PublishRequest).Messages)))
	return false, nil, nil
}

// batch returns n events for topic over keys keys (0: no key).
func batch(topic string, n, keys int) []sinks.Event {
	events := make([]sinks.Event, n)
	for i := range events {
		key := ""
		if keys > 0 {
			key = fmt.Sprintf("k%d", i%keys)
		}
		events[i] = sinktest.Event(topic, key, fmt.Appendf(nil, `{"n":%d,"pad":"%0180d"}`, i, 0))
	}
	return events
}

// TestBatchIsFewRequests: the library bundles a call's messages per
// ordering key, and the sink flushes them at the end of the call, so a
// batch costs one request per key (and one for the unkeyed messages), not
// one per event.
func TestBatchIsFewRequests(t *testing.T) {
	t.Parallel()
	for _, keys := range []int{0, 1, 10} {
		t.Run(fmt.Sprintf("keys=%d", keys), func(t *testing.T) {
			t.Parallel()
			counter := &requestCounter{}
			b := setup(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: counter})
			topic := uniqueTopic("few")
			b.createTopic(t, topic)
			s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
			requireDelivered(t, publish(t, s, batch(topic, 1000, keys)))
			// One request per queue; two where a queue's bundle
			// filled (1,000 messages or 5 MB) with more to come.
			queues := max(keys, 1)
			if n := counter.requests.Load(); n < int64(queues) || n > int64(2*queues) {
				t.Fatalf("%d requests for 1000 events over %d keys, want %d to %d", n, keys, queues, 2*queues)
			}
			if m := counter.messages.Load(); m != 1000 {
				t.Fatalf("requests carried %d messages, want 1000", m)
			}
		})
	}
}

// BenchmarkPublishBatch1000 publishes batches of 1,000 events (200-byte
// payloads) to pstest, over 1,000, 100 and 10 keys and none: Pub/Sub
// bundles per ordering key, so keys cost requests.
func BenchmarkPublishBatch1000(b *testing.B) {
	for _, keys := range []int{1000, 100, 10, 0} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			counter := &requestCounter{}
			srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: counter})
			defer srv.Close()
			topic := uniqueTopic("bench")
			if _, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topicName(topic)}); err != nil {
				b.Fatal(err)
			}
			s, err := pubsub.New("bench", pubsub.Config{Project: project, Endpoint: srv.Addr}, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			events := batch(topic, 1000, keys)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			for b.Loop() {
				for i, err := range s.Publish(ctx, events) {
					if err != nil {
						b.Fatalf("event %d: %v", i, err)
					}
				}
				// pstest keeps every message: drop them between batches.
				srv.ClearMessages()
			}
			b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(counter.requests.Load())/float64(b.N), "requests/batch")
		})
	}
}
