package kafka

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestReportsEachPartitionWhenAcknowledged holds the produce request of one
// partition in the broker and checks that the event of another partition,
// led by another broker, is reported delivered meanwhile
// (sinks.WithResultFunc), before Publish returns.
func TestReportsEachPartitionWhenAcknowledged(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(2))
	const topic = "early.results"
	createTopic(t, c, topic, 2, nil)
	// Two leaders: two connections, one produce request each.
	if err := c.MoveTopicPartition(topic, 1, 1-c.LeaderFor(topic, 0)); err != nil {
		t.Fatal(err)
	}
	keyOf := func(partition int) string {
		for n := 0; ; n++ {
			k := fmt.Sprintf("k%d", n)
			if (&kafkago.Murmur2Balancer{}).Balance(kafkago.Message{Key: []byte(k)}, 0, 1) == partition {
				return k
			}
		}
	}
	events := []sinks.Event{
		sinktest.Event(topic, keyOf(0), []byte(`{"n":0}`)),
		sinktest.Event(topic, keyOf(1), []byte(`{"n":1}`)),
	}
	release := make(chan struct{})
	var hold sync.Once
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range rt.Partitions {
				if p.Partition == 1 {
					hold.Do(func() { c.SleepControl(func() { <-release }) })
				}
			}
		}
		return nil, nil, false // the broker then handles it as usual
	})
	reported := make(chan int, len(events))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = sinks.WithResultFunc(ctx, func(i int, err error) {
		if err != nil {
			t.Errorf("event %d: %v", i, err)
		}
		reported <- i
	})
	s := newSink(t, Config{Brokers: []string{c.ListenAddrs()[0]}})
	done := make(chan []error, 1)
	go func() { done <- s.Publish(ctx, events) }()
	select {
	case i := <-reported:
		if i != 0 {
			t.Fatalf("event %d reported while partition 1's request was held", i)
		}
	case errs := <-done:
		t.Fatalf("Publish returned %v while partition 1's request was held", errs)
	case <-ctx.Done():
		t.Fatal("partition 0's event was not reported while partition 1's request was held")
	}
	close(release)
	requireOK(t, <-done)
	if i := <-reported; i != 1 {
		t.Fatalf("second report for event %d, want 1", i)
	}
}
