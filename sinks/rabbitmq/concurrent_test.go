package rabbitmq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestConcurrentPublish backs the sink's PublishesConcurrently: four calls at
// once, each with keys of its own (as the relay's workers make them), then
// four more on the channels the first ones left idle; every event lands
// once, and each key's events keep their order in the queue.
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test_conc"), nil)
	s := open(t, rabbitmq.Config{URL: secret(u), MaxPending: 64})
	if !s.PublishesConcurrently() {
		t.Fatal("the RabbitMQ sink should allow concurrent Publish calls")
	}
	const rounds, callers, perCaller = 2, 4, 300
	index := map[string]int{} // event id → its position among its key's events
	var all []sinks.Event
	for r := range rounds {
		batches := make([][]sinks.Event, callers)
		for c := range batches {
			for i := range perCaller {
				key := fmt.Sprintf("c%d-k%d", c, i%7)
				e := sinktest.Event(q, key, fmt.Appendf(nil, `{"r":%d,"c":%d,"i":%d}`, r, c, i))
				index[e.ID] = r*perCaller + i
				batches[c] = append(batches[c], e)
				all = append(all, e)
			}
		}
		errs := make([][]error, callers)
		var wg sync.WaitGroup
		for c := range batches {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				errs[c] = s.Publish(ctx, batches[c])
			})
		}
		wg.Wait()
		for c := range errs {
			for i, err := range errs[c] {
				if err != nil {
					t.Fatalf("round %d, caller %d, event %d: %v", r, c, i, err)
				}
			}
		}
	}
	got := b.waitMessages(t, q, len(all))
	if len(got) != len(all) {
		t.Fatalf("queue delivered %d messages, want %d", len(got), len(all))
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, d := range got {
		id, key := d.MessageId, d.Headers[rabbitmq.HeaderKey].(string)
		if seen[id] {
			t.Fatalf("event %s delivered twice", id)
		}
		seen[id] = true
		i, ok := index[id]
		if !ok {
			t.Fatalf("unknown event %s", id)
		}
		if prev, ok := last[key]; ok && i < prev {
			t.Fatalf("key %s: event %d delivered after event %d", key, i, prev)
		}
		last[key] = i
	}
}
