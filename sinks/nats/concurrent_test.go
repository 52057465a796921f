package nats_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestConcurrentPublish backs the sink's PublishesConcurrently: four calls at
// once, each with keys of its own (as the relay's workers make them), all
// land once, and each key's events keep their order in the stream.
func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url, MaxPending: 64})
	if !s.PublishesConcurrently() {
		t.Fatal("the NATS sink should allow concurrent Publish calls")
	}
	const callers, perCaller = 4, 300
	batches := make([][]sinks.Event, callers)
	for c := range batches {
		for i := range perCaller {
			key := fmt.Sprintf("c%d-k%d", c, i%7)
			batches[c] = append(batches[c], sinktest.Event(str.Subject("conc"), key, fmt.Appendf(nil, `{"c":%d,"i":%d}`, c, i)))
		}
	}
	var wg sync.WaitGroup
	for c := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishOK(t, s, batches[c]...)
		}()
	}
	wg.Wait()
	got := str.Messages(t)
	if len(got) != callers*perCaller {
		t.Fatalf("stream holds %d messages, want %d", len(got), callers*perCaller)
	}
	index := map[string]int{}
	for _, b := range batches {
		for i, e := range b {
			index[e.ID] = i
		}
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range got {
		id, key := m.Header.Get(nats.HeaderMsgID), m.Header.Get(nats.HeaderKey)
		if seen[id] {
			t.Fatalf("event %s stored twice", id)
		}
		seen[id] = true
		i, ok := index[id]
		if !ok {
			t.Fatalf("unknown event %s", id)
		}
		if prev, ok := last[key]; ok && i < prev {
			t.Fatalf("key %s: event %d stored after event %d", key, i, prev)
		}
		last[key] = i
	}
}
