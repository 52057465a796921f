package relay

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
	natssink "github.com/heraldhq/herald/sinks/nats"
)

// outcomeCounter counts the pauses of a sink, its Publish calls and the
// failures that spent an attempt (retry, dead), and the sinks resumed
// after a pause.
type outcomeCounter struct {
	NopObserver
	pauses, resumes, publishes, retries, dead atomic.Int64
}

func (o *outcomeCounter) SinkPublish(string, int, time.Duration) { o.publishes.Add(1) }

func (o *outcomeCounter) SinkPaused(_ string, paused bool) {
	switch {
	case paused:
		o.pauses.Add(1)
	case o.pauses.Load() > 0: // not the gauge's first value
		o.resumes.Add(1)
	}
}

func (o *outcomeCounter) Failed(_, _, outcome string) {
	switch outcome {
	case "retry":
		o.retries.Add(1)
	case "dead":
		o.dead.Add(1)
	}
}

// TestNATSSubjectWithoutStreamPausesSink: events to a subject no JetStream
// stream covers pause the NATS sink instead of spending their attempts
// (each allows one, so a retryable error would dead-letter it at once),
// and are delivered, in order, once a stream covering the subject exists.
//
// PostgreSQL only: it tests the NATS sink's errors, not the store.
func TestNATSSubjectWithoutStreamPausesSink(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	prefix := "herald_nostream_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	topic := prefix + ".orders"

	sink, err := natssink.New("bus", natssink.Config{URL: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close(t.Context()) })
	var obs outcomeCounter
	var logs lockedBuffer
	cfg := b.config(t, sink)
	cfg.Observer = &obs
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	seqs := b.insert(t, ev{topic: topic, key: "k", maxAtt: 1}, ev{topic: topic, key: "k", maxAtt: 1}, ev{topic: topic, maxAtt: 1})
	b.start(t, cfg)

	// Paused once, then probed by publishing again while the stream is
	// still missing.
	waitFor(t, 60*time.Second, "the sink to be paused and probed three times", func() bool {
		if r, d := obs.retries.Load(), obs.dead.Load(); r != 0 || d != 0 {
			t.Fatalf("a subject without a stream spent attempts: %d retries, %d dead letters; want the sink paused", r, d)
		}
		return obs.pauses.Load() == 1 && obs.publishes.Load() >= 4
	})
	if log := logs.String(); !strings.Contains(log, "sink is down, pausing it") || !strings.Contains(log, topic) ||
		!strings.Contains(log, "create a stream") {
		t.Fatalf("the pause is not logged naming the subject %s and saying to create a stream:\n%s", topic, log)
	}
	if r, d := obs.retries.Load(), obs.dead.Load(); r != 0 || d != 0 {
		t.Fatalf("a subject without a stream spent attempts: %d retries, %d dead letters; want the sink paused only", r, d)
	}
	if n := b.countDeliveries(t, "state = 'dead' OR attempts > 0"); n != 0 {
		t.Fatalf("%d deliveries dead or with attempts counted while the sink was paused, want 0", n)
	}

	stream := natstest.Stream(t, nc, func(c *jetstream.StreamConfig) { c.Subjects = []string{prefix + ".>"} })
	waitFor(t, 60*time.Second, "the events to reach the new stream", func() bool {
		return len(stream.Messages(t)) == len(seqs) && b.countDeliveries(t, "true") == 0
	})
	msgs := stream.Messages(t)
	for i, m := range msgs {
		if m.Subject != topic {
			t.Fatalf("message %d on %q, want %q", i, m.Subject, topic)
		}
	}
	if d := obs.dead.Load(); d != 0 {
		t.Fatalf("%d dead letters, want none", d)
	}
}

// lockedBuffer is a bytes.Buffer the relay's goroutines can log to while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
