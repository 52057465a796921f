package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/webhook"
)

func TestSeenIDsIsBounded(t *testing.T) {
	t.Parallel()
	s := newSeenIDs(3)
	for _, id := range []string{"a", "b", "c"} {
		if s.seen(id) {
			t.Fatalf("%s seen before it was recorded", id)
		}
	}
	if !s.seen("a") { // a is now the most recent
		t.Fatal("a forgotten")
	}
	if s.seen("d") { // evicts b, the least recently seen
		t.Fatal("d seen before it was recorded")
	}
	if s.seen("b") {
		t.Fatal("b still remembered beyond the bound")
	}
	if s.order.Len() != 3 || len(s.ids) != 3 {
		t.Fatalf("remembers %d ids (%d in the map), want 3", s.order.Len(), len(s.ids))
	}
}

// syncBuffer is an io.Writer safe for the consumer's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestConsumerDeduplicates delivers every event twice through each source
// (a real JetStream stream, Kafka broker and signed webhook) and expects one
// line per event and source, and one "duplicate" line per second copy.
func TestConsumerDeduplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	natsURL := natstest.URL(t)
	nc := natstest.Connect(t, natsURL)
	// A short duplicate window, so the stream keeps the second copy and the
	// consumer has to drop it.
	stream := natstest.Stream(t, nc, func(c *jetstream.StreamConfig) { c.Duplicates = 100 * time.Millisecond })

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)

	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	env := map[string]string{
		"NATS_URL": natsURL, "NATS_STREAM": stream.Name, "NATS_DURABLE": "test",
		"KAFKA_BROKER": cluster.ListenAddrs()[0], "KAFKA_GROUP": "test",
		"WEBHOOK_LISTEN": "127.0.0.1:0", "WEBHOOK_SECRET": secret,
	}
	var out syncBuffer
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, io.Discard, ready)
	}()
	var hookAddr string
	select {
	case hookAddr = <-ready:
	case err := <-done:
		t.Fatalf("consumer stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("consumer not ready after 20s")
	}
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})

	const id = "0190a6a0-1111-7000-8000-000000000001"
	payload := []byte(`{"order_id":"o1","customer":{"name":"Ada"},"total":12.50,"currency":"EUR"}`)

	// NATS: the same event id twice, outside the stream's duplicate window.
	for range 2 {
		msg := nats.NewMsg(stream.Subject("orders.paid"))
		msg.Header.Set(natssink.HeaderMsgID, id)
		msg.Header.Set(natssink.HeaderTopic, "orders.paid")
		msg.Header.Set(natssink.HeaderKey, "o1")
		msg.Data = payload
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Kafka: two records carrying the same herald-id.
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for range 2 {
		rec := &kgo.Record{Topic: "orders", Key: []byte("o1"), Value: payload,
			Headers: []kgo.RecordHeader{{Key: "herald-id", Value: []byte(id)}, {Key: "herald-topic", Value: []byte("orders.paid")}}}
		if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// Webhook: the real sink, publishing the same event twice, signed.
	hook, err := webhook.New("hook", webhook.Config{URL: "http://" + hookAddr + "/webhook", Secret: secret}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close(ctx)
	ev := sinks.Event{ID: id, Topic: "orders.paid", Key: "o1", Payload: payload, ContentType: "application/json", CreatedAt: time.Now()}
	for range 2 {
		if errs := hook.Publish(ctx, []sinks.Event{ev}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	// A request with a wrong signature is refused.
	bad, err := webhook.New("bad", webhook.Config{URL: "http://" + hookAddr + "/webhook", Secret: "whsec_c2VjcmV0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close(ctx)
	if errs := bad.Publish(ctx, []sinks.Event{ev}); errs[0] == nil {
		t.Fatal("the consumer accepted a request signed with another secret")
	}

	// Each source got the event twice: wait until it has handled both
	// copies, then one must have been printed and the other dropped.
	printedAndDropped := func(text, source string) (printed, dropped int) {
		printed = strings.Count(text, fmt.Sprintf("%-7s %-18s key=o1 id=%s 12.50 EUR for \"Ada\"", source, "orders.paid", id))
		dropped = strings.Count(text, fmt.Sprintf("%-7s duplicate of %s", source, id))
		return printed, dropped
	}
	sources := []string{"nats", "kafka", "webhook"}
	deadline := time.Now().Add(20 * time.Second)
	for {
		text, handled := out.String(), 0
		for _, source := range sources {
			if p, d := printedAndDropped(text, source); p+d >= 2 {
				handled++
			}
		}
		if handled == len(sources) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s the consumer printed:\n%s", text)
		}
		time.Sleep(50 * time.Millisecond)
	}
	text := out.String()
	for _, source := range sources {
		if printed, dropped := printedAndDropped(text, source); printed != 1 || dropped != 1 {
			t.Fatalf("%s: printed %d times, dropped %d duplicates; want 1 and 1:\n%s", source, printed, dropped, text)
		}
	}

	// The health check answers while the webhook listener runs.
	if err := run(ctx, []string{"-webhook-listen", hookAddr, "healthcheck"}, func(string) (string, bool) { return "", false }, io.Discard, io.Discard, nil); err != nil {
		t.Fatalf("healthcheck: %v", err)
	}
	resp, err := http.Get("http://" + hookAddr + "/webhook")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /webhook: %d", resp.StatusCode)
	}
}

func TestConsumerSettings(t *testing.T) {
	t.Parallel()
	none := func(string) (string, bool) { return "", false }
	cases := []struct {
		args []string
		want string
	}{
		{nil, "nothing to read"},
		{[]string{"-dedupe-size", "0", "-webhook-listen", ":0"}, "-dedupe-size"},
		{[]string{"frob"}, "unknown command"},
		{[]string{"healthcheck"}, "needs -webhook-listen"},
		{[]string{"-kafka-broker", "127.0.0.1:1", "-kafka-topics", " , "}, "-kafka-topics"},
		{[]string{"-webhook-listen", "256.0.0.1:http"}, "-webhook-listen"},
	}
	for _, c := range cases {
		err := run(context.Background(), c.args, none, io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
