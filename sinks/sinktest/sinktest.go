// Package sinktest is the conformance suite every Sink runs against a real
// peer: a sink's test supplies a Harness (how to build the sink, how to
// build one whose peer is down, an event the sink refuses, and how to read
// back what the peer received) and calls Run. It is public so that a sink
// written outside Herald proves itself with the same suite.
//
// The suite checks what the relay relies on (see package sinks): events
// arrive once each, a key's in order; one result per event; a refused event
// is Permanent and the later events of its key in the call are skipped
// (sinks.ErrSkipped), never sent; a peer that is down is reported
// Unavailable; a call whose context ended delivers nothing; results
// reported early (sinks.WithResultFunc) are reported once each and equal
// the returned ones; and a sink that says it publishes concurrently
// (sinks.ConcurrentPublisher) keeps all of this under concurrent calls. A
// sink that gets one of these wrong fails the suite.
package sinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
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

// Features says what a sink's protocol can carry and how it reports; the
// suite checks what is claimed.
type Features struct {
	// Headers: event headers arrive with the message.
	Headers bool
	// Binary: non-JSON payloads arrive byte for byte.
	Binary bool
	// Keys: the event key arrives with the message.
	Keys bool
	// ReportsEarly: the sink reports every event's result through
	// sinks.WithResultFunc before Publish returns (as sinks.Results
	// does). Without it the suite still checks that what is reported
	// early is reported once and equals the returned result.
	ReportsEarly bool
}

// Harness connects the suite to one sink and its peer.
type Harness struct {
	// NewSink returns a sink publishing to destination (a topic, subject or
	// path unique to the calling test); the suite closes it.
	NewSink func(t *testing.T, destination string) sinks.Sink
	// Unreachable returns a sink like NewSink's whose peer cannot be
	// reached: pointed at a closed port, a directory that does not exist.
	// Required: the suite checks that it reports the peer Unavailable.
	Unreachable func(t *testing.T, destination string) sinks.Sink
	// Received returns everything the peer has received at destination so
	// far, in arrival order. The suite polls it until it sees what it expects.
	Received func(t *testing.T, destination string) []Received
	// Payload optionally rewrites a JSON payload before publishing, for sinks
	// that need particular fields (the email sink's recipient and subject).
	Payload func(i int, key string) []byte
	// Refused returns an event of key that the sink refuses for good before
	// it sends it (too large, no recipient, not a valid destination…).
	// Required: the suite checks that it is reported Permanent and that the
	// later events of its key in the call are skipped, not sent.
	Refused func(destination, key string) sinks.Event
	// RefusedByPeer optionally returns an event of key that the peer
	// refuses for good once the sink sent it (a returned message, a key of
	// the wrong type). The suite checks it is reported Permanent and that
	// every result is truthful: a sink that pipelines may have sent the
	// later events of its key before the refusal came back, and then
	// reports them delivered.
	RefusedByPeer func(t *testing.T, destination, key string) sinks.Event
	Features      Features
	// Timeout bounds each wait for the peer. Defaults to 10 seconds.
	Timeout time.Duration
}

// Run runs the suite as subtests of t.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 10 * time.Second
	}
	if h.NewSink == nil || h.Unreachable == nil || h.Received == nil || h.Refused == nil {
		t.Fatal("sinktest: Harness.NewSink, Unreachable, Received and Refused are required")
	}
	t.Run("DeliversBatchInKeyOrder", func(t *testing.T) { deliversBatchInKeyOrder(t, h) })
	t.Run("ConcurrentCalls", func(t *testing.T) { concurrentCalls(t, h) })
	t.Run("OneResultPerEvent", func(t *testing.T) { oneResultPerEvent(t, h) })
	t.Run("RefusedIsPermanentAndStopsItsKey", func(t *testing.T) { refusedStopsItsKey(t, h) })
	if h.RefusedByPeer != nil {
		t.Run("RefusedByPeerIsPermanent", func(t *testing.T) { refusedByPeer(t, h) })
	}
	t.Run("PeerDownIsUnavailable", func(t *testing.T) { peerDown(t, h) })
	t.Run("CarriesIDHeadersAndKey", func(t *testing.T) { carriesMetadata(t, h) })
	if h.Features.Binary {
		t.Run("BinaryPayload", func(t *testing.T) { binaryPayload(t, h) })
	}
	t.Run("CancelledContextDeliversNothing", func(t *testing.T) { cancelledContext(t, h) })
}

// Event returns a test event with a fresh id.
func Event(destination, key string, payload []byte) sinks.Event {
	id := uuid.Must(uuid.NewV7()).String()
	return sinks.Event{ID: id, Topic: destination, Destination: destination, Key: key,
		Payload: payload, ContentType: sinks.ContentTypeJSON, CreatedAt: time.Now(), Attempt: 1}
}

// ClosedAddr returns a loopback host:port that nothing listens on (it
// listened a moment ago), for a Harness.Unreachable sink.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("closing %s: %v", addr, err)
	}
	return addr
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

// events returns test events to dest, one per key, the i-th with payload
// i.
func (h Harness) events(dest string, keys ...string) []sinks.Event {
	events := make([]sinks.Event, len(keys))
	for i, key := range keys {
		events[i] = Event(dest, key, h.payload(i, key))
	}
	return events
}

// publishWithin is publish with a context that ends after d.
func (h Harness) publishWithin(t *testing.T, d time.Duration, s sinks.Sink, events []sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return h.publish(t, ctx, s, events)
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
	return closeAtEnd(t, h.NewSink(t, dest))
}

func closeAtEnd(t *testing.T, s sinks.Sink) sinks.Sink {
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

// publish calls Publish with ctx, asking for early results, and checks the
// results' shape: one per event; each reported early at most once and equal
// to the returned one; with Features.ReportsEarly, every one reported before
// Publish returned.
func (h Harness) publish(t *testing.T, ctx context.Context, s sinks.Sink, events []sinks.Event) []error {
	t.Helper()
	c := call(ctx, s, events)
	h.check(t, c)
	return c.errs
}

// publication is one Publish call and what it reported early.
type publication struct {
	events []sinks.Event
	errs   []error

	mu         sync.Mutex
	reports    [][]error
	outOfRange []int
}

// call runs Publish with a context asking for early results, recording
// them. It does not touch t, so that it may run in another goroutine.
func call(ctx context.Context, s sinks.Sink, events []sinks.Event) *publication {
	c := &publication{events: events, reports: make([][]error, len(events))}
	ctx = sinks.WithResultFunc(ctx, func(i int, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if i < 0 || i >= len(events) {
			c.outOfRange = append(c.outOfRange, i)
			return
		}
		c.reports[i] = append(c.reports[i], err)
	})
	c.errs = s.Publish(ctx, events)
	return c
}

// check checks the shape of c's results.
func (h Harness) check(t *testing.T, c *publication) {
	t.Helper()
	if len(c.errs) != len(c.events) {
		t.Fatalf("Publish returned %d results for %d events", len(c.errs), len(c.events))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.outOfRange) > 0 {
		t.Fatalf("results reported early for events %v of a call of %d", c.outOfRange, len(c.events))
	}
	for i, got := range c.reports {
		e, err := c.events[i], c.errs[i]
		switch {
		case len(got) > 1:
			t.Fatalf("event %d (%s): result reported early %d times (%v), want at most once", i, e.ID, len(got), got)
		case len(got) == 1 && !sameError(got[0], err):
			t.Fatalf("event %d (%s): result reported early %v, but Publish returned %v", i, e.ID, got[0], err)
		case len(got) == 0 && h.Features.ReportsEarly:
			t.Fatalf("event %d (%s): result not reported early (Features.ReportsEarly); Publish returned %v", i, e.ID, err)
		}
	}
}

// sameError reports whether a and b are the same error value.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	if !reflect.TypeOf(a).Comparable() {
		return reflect.DeepEqual(a, b)
	}
	return a == b
}

func (h Harness) publishOK(t *testing.T, s sinks.Sink, events []sinks.Event) {
	t.Helper()
	for i, err := range h.publishWithin(t, 30*time.Second, s, events) {
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
	h.publishOK(t, s, events[:40])
	h.publishOK(t, s, events[40:])
	h.checkArrivals(t, dest, events)
}

// checkArrivals waits for the peer to have events and checks that each
// arrived once, with its payload, and a key's in slice order.
func (h Harness) checkArrivals(t *testing.T, dest string, events []sinks.Event) {
	t.Helper()
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

// concurrentCalls publishes from several goroutines at once, each call
// with keys of its own (as the relay does), to a sink that says it
// publishes concurrently: every event must arrive once, a key's in order.
func concurrentCalls(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	if cp, ok := s.(sinks.ConcurrentPublisher); !ok || !cp.PublishesConcurrently() {
		t.Skip("the sink does not publish concurrently (sinks.ConcurrentPublisher)")
	}
	const callers, calls, perCall = 3, 2, 8
	batches := make([][][]sinks.Event, callers)
	var all []sinks.Event
	for c := range callers {
		for range calls {
			var batch []sinks.Event
			for i := range perCall {
				key := fmt.Sprintf("c%d-k%d", c, i%3)
				batch = append(batch, Event(dest, key, h.payload(len(all)+len(batch), key)))
			}
			batches[c] = append(batches[c], batch)
			all = append(all, batch...)
		}
	}
	done := make(chan *publication, callers*calls)
	for c := range callers {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, batch := range batches[c] {
				done <- call(ctx, s, batch)
			}
		}()
	}
	for range callers * calls {
		c := <-done
		h.check(t, c)
		for i, err := range c.errs {
			if err != nil {
				t.Fatalf("event %d (%s) of a concurrent call: %v", i, c.events[i].ID, err)
			}
		}
	}
	h.checkArrivals(t, dest, all)
}

func oneResultPerEvent(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	h.publishOK(t, s, nil)
	h.publishOK(t, s, h.events(dest, ""))
	h.waitFor(t, dest, 1)
}

// refusedStopsItsKey publishes a batch holding one event the sink refuses
// for good, followed by two later events of its key, amid events of other
// keys. The refused one must be reported permanent, its key's later ones
// skipped (sinks.ErrSkipped), the others delivered; the peer must get the
// delivered ones and none of the others.
func refusedStopsItsKey(t *testing.T, h Harness) {
	errs, events := h.publishRefused(t, h.Refused)
	for _, i := range []int{2, 4} {
		if !errors.Is(errs[i], sinks.ErrSkipped) {
			t.Fatalf("event %d, behind the refused one of its key: %v, want sinks.ErrSkipped", i, errs[i])
		}
	}
	h.receivedOnly(t, events[0].Destination, events, errs)
}

// refusedByPeer is refusedStopsItsKey with an event the peer refuses, after
// which the later events of its key are skipped or, if the sink had sent
// them, delivered: whatever is reported delivered must have reached the
// peer, and nothing else.
func refusedByPeer(t *testing.T, h Harness) {
	errs, events := h.publishRefused(t, func(dest, key string) sinks.Event { return h.RefusedByPeer(t, dest, key) })
	for _, i := range []int{2, 4} {
		if errs[i] != nil && !errors.Is(errs[i], sinks.ErrSkipped) {
			t.Fatalf("event %d, behind the refused one of its key: %v, want delivered or sinks.ErrSkipped", i, errs[i])
		}
	}
	h.receivedOnly(t, events[0].Destination, events, errs)
}

// publishRefused publishes, to a sink of its own, the events a, refused(b),
// b, c, b, and checks that the refused one is reported permanent and the
// other keys' delivered.
func (h Harness) publishRefused(t *testing.T, refused func(dest, key string) sinks.Event) ([]error, []sinks.Event) {
	t.Helper()
	dest := destination(t)
	s := h.open(t, dest)
	events := h.events(dest, "a", "b", "b", "c", "b")
	events[1] = refused(dest, "b")
	errs := h.publishWithin(t, 30*time.Second, s, events)
	if !sinks.IsPermanent(errs[1]) {
		t.Fatalf("the refused event: %v, want a permanent error", errs[1])
	}
	for _, i := range []int{0, 3} {
		if errs[i] != nil {
			t.Fatalf("event %d of another key: %v", i, errs[i])
		}
	}
	return errs, events
}

// receivedOnly waits for the peer to have every event reported delivered
// and checks that it has no other.
func (h Harness) receivedOnly(t *testing.T, dest string, events []sinks.Event, errs []error) {
	t.Helper()
	want := map[string]bool{}
	for i, err := range errs {
		if err == nil {
			want[events[i].ID] = true
		}
	}
	for _, r := range h.waitFor(t, dest, len(want)) {
		if !want[r.ID] {
			t.Fatalf("peer received %s, which Publish reported not delivered", r.ID)
		}
	}
}

// peerDown publishes to a sink whose peer cannot be reached: no event may
// be reported delivered, or failed in a way that would cost it an attempt
// (a plain or permanent error): the first is Unavailable, and each other
// one Unavailable too or not sent (sinks.ErrSkipped, sinks.ErrNotSent). A
// sink that can check its peer (sinks.Checker) says Unavailable too.
func peerDown(t *testing.T, h Harness) {
	dest := destination(t)
	s := closeAtEnd(t, h.Unreachable(t, dest))
	errs := h.publishWithin(t, 2*h.Timeout, s, h.events(dest, "a", "a", "b", ""))
	if !sinks.IsUnavailable(errs[0]) {
		t.Fatalf("event 0, to a peer that is down: %v, want sinks.Unavailable", errs[0])
	}
	for i, err := range errs {
		notSent := errors.Is(err, sinks.ErrSkipped) || errors.Is(err, sinks.ErrNotSent)
		if err == nil || sinks.IsPermanent(err) || !sinks.IsUnavailable(err) && !notSent {
			t.Fatalf("event %d, to a peer that is down: %v, want sinks.Unavailable (or skipped, not sent)", i, err)
		}
	}
	if c, ok := s.(sinks.Checker); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 2*h.Timeout)
		defer cancel()
		if err := c.Check(ctx); !sinks.IsUnavailable(err) {
			t.Fatalf("Check of a peer that is down: %v, want sinks.Unavailable", err)
		}
	}
}

func carriesMetadata(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	e := Event(dest, "order-42", h.payload(1, "order-42"))
	e.Headers = map[string]string{"x-tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	h.publishOK(t, s, []sinks.Event{e})
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
	h.publishOK(t, s, []sinks.Event{e})
	got := h.waitFor(t, dest, 1)[0]
	if !bytes.Equal(got.Payload, e.Payload) {
		t.Fatalf("binary payload = %x, want %x", got.Payload, e.Payload)
	}
}

// cancelledContext publishes with a context cancelled before the call:
// nothing is delivered, and every result says the call ended (wrapping
// context.Canceled, or sinks.ErrNotSent, sinks.ErrSkipped), never a
// permanent failure or an unavailable peer.
func cancelledContext(t *testing.T, h Harness) {
	dest := destination(t)
	s := h.open(t, dest)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	events := h.events(dest, "a", "a", "b")
	done := make(chan *publication, 1)
	go func() { done <- call(ctx, s, events) }()
	select {
	case c := <-done:
		h.check(t, c)
		for i, err := range c.errs {
			ended := errors.Is(err, context.Canceled) || errors.Is(err, sinks.ErrNotSent) || errors.Is(err, sinks.ErrSkipped)
			if err == nil || sinks.IsPermanent(err) || sinks.IsUnavailable(err) || !ended {
				t.Fatalf("event %d, published with a cancelled context: %v, want a failure saying the call ended", i, err)
			}
		}
	case <-time.After(h.Timeout):
		t.Fatal("Publish with a cancelled context did not return")
	}
}
