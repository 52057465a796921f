// Package sinktest is the conformance suite every Sink runs against a real
// peer: a sink's test supplies a Harness (how to build the sink and how to
// read back what the peer received) and calls Run.
package sinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/sinks"
)

// Received is one message as the peer got it, decoded back by the harness.
type Received struct {
	// ID is the event id the message carries (header, message id…).
	ID string
	// Key is the ordering key the message carries, if the protocol has one.
	Key string
	// Destination is where it arrived (topic, subject, URL path…).
	Destination string
	// Payload is the body as received.
	Payload []byte
	// Headers are the event headers that arrived with it.
	Headers map[string]string
}

// Features says what a sink's protocol can carry; the suite checks what is
// claimed.
type Features struct {
	// Headers: event headers arrive with the message.
	Headers bool
	// Binary: non-JSON payloads arrive byte for byte.
	Binary bool
	// Keys: the event key arrives with the message.
	Keys bool
}

// Harness connects the suite to one sink and its peer.
type Harness struct {
	// NewSink returns a sink publishing to destination (a topic, subject or
	// path unique to the calling test); the suite closes it.
	NewSink func(t *testing.T, destination string) sinks.Sink
	// Received returns everything the peer has received at destination so
	// far, in arrival order. The suite polls it until it sees what it expects.
	Received func(t *testing.T, destination string) []Received
	// Payload optionally rewrites a JSON payload before publishing, for sinks
	// that need particular fields (the email sink's recipient and subject).
	Payload func(i int, key string) []byte
	// Refused optionally returns an event of key the sink must refuse for
	// good before or when the peer sees it (too large, no recipient…); the
	// suite then checks that a batch's results are per event: that one
	// permanent, the others truthful.
	Refused  func(destination, key string) sinks.Event
	Features Features
	// Timeout bounds each wait for the peer. Defaults to 10 seconds.
	Timeout time.Duration
}

// Run runs the suite as subtests of t.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 10 * time.Second
	}
	t.Run("DeliversBatchInKeyOrder", func(t *testing.T) { deliversBatchInKeyOrder(t, h) })
	t.Run("OneResultPerEvent", func(t *testing.T) { oneResultPerEvent(t, h) })
	if h.Refused != nil {
		t.Run("ReportsEachEvent", func(t *testing.T) { reportsEachEvent(t, h) })
	}
	t.Run("CarriesIDHeadersAndKey", func(t *testing.T) { carriesMetadata(t, h) })
	if h.Features.Binary {
		t.Run("BinaryPayload", func(t *testing.T) { binaryPayload(t, h) })
	}
	t.Run("CancelledContextFails", func(t *testing.T) { cancelledContext(t, h) })
}

// Event returns a test event with a fresh id.
func Event(destination, key string, payload []byte) sinks.Event {
	id := uuid.Must(uuid.NewV7()).String()
	return sinks.Event{ID: id, Topic: destination, Destination: destination, Key: key,
		Payload: payload, ContentType: sinks.ContentTypeJSON, CreatedAt: time.Now(), Attempt: 1}
}

// Oversized returns a test event whose JSON payload is size bytes long (a
// string), for sinks that refuse events over a limit.
func Oversized(destination, key string, size int) sinks.Event {
	payload := make([]byte, max(size, 2))
	for i := range payload {
		payload[i] = 'x'
	}
	payload[0], payload[len(payload)-1] = '"', '"'
	return Event(destination, key, payload)
}

func (h Harness) payload(i int, key string) []byte {
	if h.Payload != nil {
		return h.Payload(i, key)
	}
	return fmt.Appendf(nil, `{"n":%d,"key":%q}`, i, key)
}

func destination(t *testing.T) string {
	return "sinktest." + uuid.NewString()[:8]
}

func (h Harness) open(t *testing.T, dest string) sinks.Sink {
	s := h.NewSink(t, dest)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("closing sink: %v", err)
		}
	})
	return s
}

// waitFor polls the peer until want messages arrived, failing after Timeout.
func (h Harness) waitFor(t *testing.T, dest string, want int) []Received {
	t.Helper()
	deadline := time.Now().Add(h.Timeout)
	for {
		got := h.Received(t, dest)
		if len(got) >= want || time.Now().After(deadline) {
			if len(got) < want {
				t.Fatalf("peer received %d messages at %s, want %d", len(got), dest, want)
			}
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func publishOK(t *testing.T, s sinks.Sink, events []sinks.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("event %d (%s): %v", i, events[i].ID, err)
		}
	}
}

func deliversBatchInKeyOrder(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	const keys, perKey = 7, 12
	var events []sinks.Event
	for i := 0; i < keys*perKey; i++ {
		key := fmt.Sprintf("k%d", i%keys)
		events = append(events, Event(dest, key, h.payload(i, key)))
	}
	// Two batches: order must hold across calls too.
	publishOK(t, s, events[:40])
	publishOK(t, s, events[40:])
	got := h.waitFor(t, dest, len(events))
	seen := map[string]int{}
	index := map[string]int{}
	for i, e := range events {
		index[e.ID] = i
	}
	lastByKey := map[string]int{}
	for _, r := range got {
		i, ok := index[r.ID]
		if !ok {
			t.Fatalf("peer received unknown id %q", r.ID)
		}
		seen[r.ID]++
		key := events[i].Key
		if last, ok := lastByKey[key]; ok && i < last {
			t.Fatalf("key %s: event %d arrived after event %d", key, i, last)
		}
		lastByKey[key] = i
		if !bytes.Equal(r.Payload, events[i].Payload) && h.Payload == nil {
			t.Fatalf("event %d payload = %q, want %q", i, r.Payload, events[i].Payload)
		}
	}
	for _, e := range events {
		if seen[e.ID] != 1 {
			t.Fatalf("event %s received %d times, want once", e.ID, seen[e.ID])
		}
	}
}

func oneResultPerEvent(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if errs := s.Publish(ctx, nil); len(errs) != 0 {
		t.Fatalf("Publish(nil) returned %d results", len(errs))
	}
	publishOK(t, s, []sinks.Event{Event(dest, "", h.payload(0, ""))})
	h.waitFor(t, dest, 1)
}

// reportsEachEvent publishes a batch holding one event the sink refuses for
// good, followed by a later event of its key, amid events of other keys.
// The refused one must be reported permanent; every event reported
// delivered must have reached the peer, and no other. (What the refusal
// means for the later event of its key is the relay's to decide: the sink
// may send it or skip it, but must say which.)
func reportsEachEvent(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	events := []sinks.Event{
		Event(dest, "a", h.payload(0, "a")),
		h.Refused(dest, "b"),
		Event(dest, "b", h.payload(2, "b")),
		Event(dest, "c", h.payload(3, "c")),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	if !sinks.IsPermanent(errs[1]) {
		t.Fatalf("the refused event: %v, want a permanent error", errs[1])
	}
	for _, i := range []int{0, 3} {
		if errs[i] != nil {
			t.Fatalf("event %d of another key: %v", i, errs[i])
		}
	}
	want := map[string]bool{}
	for i, err := range errs {
		if err == nil {
			want[events[i].ID] = true
		}
	}
	got := h.waitFor(t, dest, len(want))
	for _, r := range got {
		if !want[r.ID] {
			t.Fatalf("peer received %s, which Publish reported failed", r.ID)
		}
	}
}

func carriesMetadata(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	e := Event(dest, "order-42", h.payload(1, "order-42"))
	e.Headers = map[string]string{"x-tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	publishOK(t, s, []sinks.Event{e})
	got := h.waitFor(t, dest, 1)[0]
	if got.ID != e.ID {
		t.Fatalf("received id %q, want %q", got.ID, e.ID)
	}
	if h.Features.Keys && got.Key != e.Key {
		t.Fatalf("received key %q, want %q", got.Key, e.Key)
	}
	if h.Features.Headers {
		for k, v := range e.Headers {
			if got.Headers[k] != v {
				t.Fatalf("header %s = %q, want %q (all: %v)", k, got.Headers[k], v, got.Headers)
			}
		}
	}
}

func binaryPayload(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	e := Event(dest, "bin", []byte{0x0a, 0x03, 0x00, 0xff, 0xfe, 'x', 0x00})
	e.ContentType = "application/x-protobuf"
	publishOK(t, s, []sinks.Event{e})
	got := h.waitFor(t, dest, 1)[0]
	if !bytes.Equal(got.Payload, e.Payload) {
		t.Fatalf("binary payload = %x, want %x", got.Payload, e.Payload)
	}
}

func cancelledContext(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	events := []sinks.Event{Event(dest, "a", h.payload(0, "a")), Event(dest, "b", h.payload(1, "b"))}
	done := make(chan []error, 1)
	go func() { done <- s.Publish(ctx, events) }()
	select {
	case errs := <-done:
		if len(errs) != len(events) {
			t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
		}
		delivered := 0
		for i, err := range errs {
			if err == nil {
				// A sink may have delivered before noticing the cancellation;
				// it must then say so truthfully, which the peer confirms.
				delivered++
				continue
			}
			if sinks.IsPermanent(err) {
				t.Fatalf("event %d: a cancelled context is not a permanent failure: %v", i, err)
			}
			if !errors.Is(err, context.Canceled) && !sinks.IsUnavailable(err) && !errors.Is(err, sinks.ErrSkipped) {
				t.Logf("event %d failed with %v (not wrapping context.Canceled)", i, err)
			}
		}
		if delivered > 0 {
			h.waitFor(t, dest, delivered)
		}
	case <-time.After(h.Timeout):
		t.Fatal("Publish with a cancelled context did not return")
	}
}
