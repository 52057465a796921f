package relaybench

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
)

// TestNATSStreamKeepsTheNewestMessages checks that the throwaway stream
// discards its oldest messages past NATSMaxMsgs while publishes still
// succeed, and that a negative cap keeps them all.
func TestNATSStreamKeepsTheNewestMessages(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		maxMsgs int
		want    uint64
	}{{maxMsgs: 5, want: 5}, {maxMsgs: -1, want: 12}} {
		t.Run(fmt.Sprint(c.maxMsgs), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			name := "cap" + uuid.NewString()[:8]
			cfg := Config{Sink: SinkNATS, NATSURL: url, NATSMaxMsgs: c.maxMsgs}.WithDefaults()
			d, err := startDestination(ctx, cfg, name, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := d.close(context.WithoutCancel(ctx)); err != nil {
					t.Error(err)
				}
			}()
			sink, err := d.newSink("nats")
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close(context.WithoutCancel(ctx))
			events := make([]sinks.Event, 12)
			for i := range events {
				events[i] = sinks.Event{ID: uuid.NewString(), Seq: int64(i + 1), Topic: "bench", Key: "k",
					Destination: "herald_bench." + name + ".events", Payload: []byte(`{}`),
					ContentType: "application/json", CreatedAt: time.Now(), Attempt: 1}
			}
			for i, err := range sink.Publish(ctx, events) {
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			stream, err := js.Stream(ctx, "HERALD_BENCH_"+name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != c.want || info.State.LastSeq != 12 {
				t.Fatalf("stream holds %d messages up to seq %d, want %d up to 12", info.State.Msgs, info.State.LastSeq, c.want)
			}
		})
	}
}
