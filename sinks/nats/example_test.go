package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/nats"
)

// ExampleNew builds a JetStream sink, checks at start that streams cover
// the subjects the routes publish to, and publishes one event.
func ExampleNew() {
	sink, err := nats.New("events", nats.Config{
		URL:        "nats://127.0.0.1:4222",
		AckTimeout: 5 * time.Second,
	}, slog.Default())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sink.CheckSubjects(ctx, "orders.created"); err != nil {
		fmt.Println(err) // names each subject no stream covers
		return
	}
	errs := sink.Publish(ctx, []sinks.Event{{
		ID: "0190f3c2-7d3a-7c1e-9a53-2b8f1c4d5e6f", Topic: "orders.created", Key: "order-42",
		Destination: "orders.created", Payload: []byte(`{"id":42}`), ContentType: sinks.ContentTypeJSON,
	}})
	fmt.Println(errs[0])
}
