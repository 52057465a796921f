package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/kafka"
)

// Publishing two events of one key to a topic. A real deployment lists its
// brokers; the example runs an in-process broker instead.
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()

	sink, err := kafka.New("orders-kafka", kafka.Config{
		Brokers:     cluster.ListenAddrs(),
		Compression: "zstd",
		// TLS:  sinkconfig.TLSConfig{Enabled: true},
		// SASL: kafka.SASLConfig{Mechanism: "SCRAM-SHA-512", Username: "herald", Password: sinkconfig.Secret(os.Getenv("KAFKA_PASSWORD"))},
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer sink.Close(ctx)

	events := []sinks.Event{
		{ID: "0190a6b2-0000-7000-8000-000000000001", Topic: "orders", Destination: "orders", Key: "order-42",
			Payload: []byte(`{"status":"created"}`), ContentType: sinks.ContentTypeJSON},
		{ID: "0190a6b2-0000-7000-8000-000000000002", Topic: "orders", Destination: "orders", Key: "order-42",
			Payload: []byte(`{"status":"paid"}`), ContentType: sinks.ContentTypeJSON},
	}
	for i, err := range sink.Publish(ctx, events) {
		fmt.Println(events[i].ID, "delivered:", err == nil)
	}
	// Output:
	// 0190a6b2-0000-7000-8000-000000000001 delivered: true
	// 0190a6b2-0000-7000-8000-000000000002 delivered: true
}
