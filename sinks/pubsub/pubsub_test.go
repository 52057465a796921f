package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/sinktest"
)

const project = "herald-test"

// testBundle is one pstest server and what a test needs to reach it.
type testBundle struct {
	srv      *pstest.Server
	endpoint string
}

// setup starts an in-process Pub/Sub server (pstest), with errors injected
// by opts, stopped when the test ends. There is no other Pub/Sub here:
// pstest is the peer, and it needs no service started.
func setup(t *testing.T, opts ...pstest.ServerReactorOption) *testBundle {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	return &testBundle{srv: srv, endpoint: srv.Addr}
}

// createTopic creates topic id in the test project.
func (b *testBundle) createTopic(t *testing.T, id string) {
	t.Helper()
	if _, err := b.srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: topicName(id)}); err != nil {
		t.Fatalf("creating topic %s: %v", id, err)
	}
}

func topicName(id string) string { return "projects/" + project + "/topics/" + id }

// received returns the messages the server stored for topic id, in the
// order it accepted them.
func (b *testBundle) received(id string) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range b.srv.Messages() {
		if m.Topic == topicName(id) {
			out = append(out, m)
		}
	}
	return out
}

func newSink(t *testing.T, cfg pubsub.Config) *pubsub.Sink {
	t.Helper()
	if cfg.Project == "" {
		cfg.Project = project
	}
	s, err := pubsub.New("ps", cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func publish(t *testing.T, s sinks.Sink, events []sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

func requireDelivered(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

// uniqueTopic returns a topic id of its own for a test.
func uniqueTopic(prefix string) string {
	return prefix + "." + strings.ReplaceAll(sinktest.Event("", "", nil).ID, "-", "")[:20]
}

func TestSinktest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			b.createTopic(t, destination)
			return newSink(t, pubsub.Config{Endpoint: b.endpoint})
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return newSink(t, pubsub.Config{Endpoint: sinktest.ClosedAddr(t), Timeout: time.Second})
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range b.received(destination) {
				headers := map[string]string{}
				for k, v := range m.Attributes {
					headers[k] = v
				}
				out = append(out, sinktest.Received{ID: m.Attributes[pubsub.AttrID], Key: m.OrderingKey,
					Destination: strings.TrimPrefix(m.Topic, "projects/"+project+"/topics/"), Payload: m.Data, Headers: headers})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 10_000_001)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
	})
}

// TestMessageAttributes checks every attribute the package documents.
func TestMessageAttributes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("attrs")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	e := sinktest.Event(topic, "order-7", []byte(`{"total":3}`))
	e.Topic = "orders.created"
	e.Headers = map[string]string{"tenant": "acme"}
	requireDelivered(t, publish(t, s, []sinks.Event{e}))
	got := b.received(topic)
	if len(got) != 1 {
		t.Fatalf("server stored %d messages, want 1", len(got))
	}
	want := map[string]string{"herald-id": e.ID, "herald-topic": "orders.created", "content-type": "application/json", "tenant": "acme"}
	if fmt.Sprint(got[0].Attributes) != fmt.Sprint(want) {
		t.Fatalf("attributes %v, want %v", got[0].Attributes, want)
	}
	if got[0].OrderingKey != "order-7" || string(got[0].Data) != `{"total":3}` {
		t.Fatalf("ordering key %q, data %q", got[0].OrderingKey, got[0].Data)
	}
}

// TestLargeBatchKeepsKeyOrder publishes more events than fit one request
// (1000 messages), over few keys and two topics, and checks each key's
// order as the server stored it.
func TestLargeBatchKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topics := []string{uniqueTopic("order"), uniqueTopic("order")}
	for _, topic := range topics {
		b.createTopic(t, topic)
	}
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	var events []sinks.Event
	for i := range 3000 {
		key := fmt.Sprintf("k%d", i%4)
		if i%10 == 0 {
			key = "" // unordered events mixed in
		}
		events = append(events, sinktest.Event(topics[i%2], key, fmt.Appendf(nil, `{"n":%d}`, i)))
	}
	requireDelivered(t, publish(t, s, events))
	index := map[string]int{}
	for i, e := range events {
		index[e.ID] = i
	}
	total := 0
	for _, topic := range topics {
		last := map[string]int{}
		for _, m := range b.received(topic) {
			i, ok := index[m.Attributes[pubsub.AttrID]]
			if !ok {
				t.Fatalf("unknown message %v", m.Attributes)
			}
			total++
			if m.OrderingKey == "" {
				continue
			}
			if l, ok := last[m.OrderingKey]; ok && i < l {
				t.Fatalf("topic %s key %s: event %d stored after event %d", topic, m.OrderingKey, i, l)
			}
			last[m.OrderingKey] = i
		}
	}
	if total != len(events) {
		t.Fatalf("server stored %d messages, want %d", total, len(events))
	}
}

// TestMissingTopicPausesTheKeyUntilReported: publishing to a topic that
// does not exist is a setup error (Unavailable, naming the topic). The
// library pauses the key after the failed request, so the events it did
// not send are reported skipped; once the topic exists, the same events go
// through: the sink resumed the key.
func TestMissingTopicPausesTheKeyUntilReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("missing")
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	// More than one request's worth (1000), so that the key's second
	// request finds it paused.
	var events []sinks.Event
	for i := range 1500 {
		events = append(events, sinktest.Event(topic, "k", fmt.Appendf(nil, `{"n":%d}`, i)))
	}
	errs := publish(t, s, events)
	if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), topic) {
		t.Fatalf("first event: %v, want Unavailable naming topic %s", errs[0], topic)
	}
	skipped := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, sinks.ErrSkipped):
			skipped++
		case !sinks.IsUnavailable(err):
			t.Fatalf("event %d: %v, want Unavailable or skipped", i, err)
		}
	}
	if skipped == 0 {
		t.Fatalf("no event reported skipped behind the failed request")
	}
	b.createTopic(t, topic)
	requireDelivered(t, publish(t, s, events))
	if n := len(b.received(topic)); n != len(events) {
		t.Fatalf("server stored %d messages, want %d", n, len(events))
	}
}

// TestRefusedBeforeSending: events Pub/Sub would refuse fail permanently,
// naming what is wrong, and are not sent; later events of their key in
// the call are skipped, other keys go through.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("refused")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	for _, c := range []struct {
		name  string
		edit  func(e *sinks.Event)
		wants string
	}{
		{"topic id too short", func(e *sinks.Event) { e.Destination = "ab" }, "Pub/Sub allows 3 to 255"},
		{"topic id starts with a digit", func(e *sinks.Event) { e.Destination = "1orders" }, "must start with a letter"},
		{"topic id starts with goog", func(e *sinks.Event) { e.Destination = "google-orders" }, `must not start with "goog"`},
		{"topic id with a slash", func(e *sinks.Event) { e.Destination = "orders/eu" }, `character '/' is not allowed`},
		{"reserved attribute", func(e *sinks.Event) { e.Headers = map[string]string{"goog-x": "1"} }, `header "goog-x"`},
		{"attribute value too long", func(e *sinks.Event) { e.Headers = map[string]string{"big": strings.Repeat("v", 1025)} }, "attribute value limit of 1024"},
		{"key too long", func(e *sinks.Event) { e.Key = strings.Repeat("k", 1025) }, "ordering key limit of 1024"},
		{"message over 10 MB", func(e *sinks.Event) { e.Payload = make([]byte, 10_000_001) }, "exceeds the sink's limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := sinktest.Event(topic, "k", []byte(`{}`))
			c.edit(&bad)
			later := sinktest.Event(topic, bad.Key, []byte(`{}`))
			other := sinktest.Event(topic, "other", []byte(`{}`))
			errs := publish(t, s, []sinks.Event{bad, later, other})
			if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), c.wants) || !strings.Contains(errs[0].Error(), bad.ID) {
				t.Fatalf("refused event: %v, want a permanent error naming the event and containing %q", errs[0], c.wants)
			}
			if !errors.Is(errs[1], sinks.ErrSkipped) {
				t.Fatalf("later event of the key: %v, want ErrSkipped", errs[1])
			}
			if errs[2] != nil {
				t.Fatalf("event of another key: %v", errs[2])
			}
			for _, m := range b.received(topic) {
				if id := m.Attributes[pubsub.AttrID]; id == bad.ID || id == later.ID {
					t.Fatalf("server stored %s, which was reported unsent", id)
				}
			}
		})
	}
}

// TestServerErrorClasses injects each status code into the server's
// Publish and checks the class the sink reports.
func TestServerErrorClasses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code  codes.Code
		class string
	}{
		{codes.PermissionDenied, "unavailable"},
		{codes.Unauthenticated, "unavailable"},
		{codes.InvalidArgument, "permanent"},
		{codes.Unavailable, "retryable"},
		{codes.ResourceExhausted, "retryable"},
		{codes.DeadlineExceeded, "retryable"},
	} {
		t.Run(c.code.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, pstest.WithErrorInjection("Publish", c.code, "injected "+c.code.String()))
			topic := uniqueTopic("codes")
			b.createTopic(t, topic)
			// The library retries transient codes itself until timeout;
			// the other codes fail at once, well within it however
			// loaded the machine (a second was not always).
			s := newSink(t, pubsub.Config{Endpoint: b.endpoint, Timeout: 5 * time.Second})
			errs := publish(t, s, []sinks.Event{sinktest.Event(topic, "k", []byte(`{}`)), sinktest.Event(topic, "", []byte(`{}`))})
			for i, err := range errs {
				if got := classOf(err); got != c.class {
					t.Fatalf("event %d: %v is %s, want %s", i, err, got, c.class)
				}
			}
		})
	}
}

func classOf(err error) string {
	switch {
	case err == nil:
		return "delivered"
	case errors.Is(err, sinks.ErrSkipped):
		return "skipped"
	case sinks.IsPermanent(err):
		return "permanent"
	case sinks.IsUnavailable(err):
		return "unavailable"
	}
	return "retryable"
}

// closedPort returns an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestConnectionRefused: a closed port is Unavailable, for Publish and
// Check, naming the endpoint.
func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	addr := closedPort(t)
	s := newSink(t, pubsub.Config{Endpoint: addr, Timeout: time.Second})
	errs := publish(t, s, []sinks.Event{sinktest.Event("orders", "k", []byte(`{}`))})
	if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), addr) || !strings.Contains(errs[0].Error(), "connection refused") {
		t.Fatalf("Publish: %v, want Unavailable naming %s and the refused connection", errs[0], addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Check(ctx); !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Check: %v, want Unavailable naming %s", err, addr)
	}
}

// TestCheck: Check passes against a server; CheckDestinations names each
// topic that is missing or not a topic id.
func TestCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("check")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := s.CheckDestinations(ctx, topic); err != nil {
		t.Fatalf("CheckDestinations(existing): %v", err)
	}
	err := s.CheckDestinations(ctx, topic, "absent-topic", "goog")
	if err == nil || !strings.Contains(err.Error(), `topic "absent-topic" does not exist in project "herald-test"`) ||
		!strings.Contains(err.Error(), `"goog" is 4 characters`) && !strings.Contains(err.Error(), `must not start with "goog"`) {
		t.Fatalf("CheckDestinations: %v, want the missing and the invalid topic named", err)
	}
	if strings.Contains(err.Error(), topic) {
		t.Fatalf("CheckDestinations names the existing topic: %v", err)
	}
}

// TestCancelledContextIsRetryable: a Publish whose context ends before the
// server answers reports retryable errors, not success.
func TestCancelledContextIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("ctx")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := s.Publish(ctx, []sinks.Event{sinktest.Event(topic, "k", []byte(`{}`))})
	if len(errs) != 1 || classOf(errs[0]) != "retryable" || !errors.Is(errs[0], context.Canceled) {
		t.Fatalf("Publish with a cancelled context: %v, want a retryable context error", errs)
	}
}

// proxy forwards TCP connections to a server and can drop them all, or
// stop listening, as a network failure would.
type proxy struct {
	t        *testing.T
	target   string
	addr     string
	mu       sync.Mutex
	ln       net.Listener
	conns    []net.Conn
	accepted int
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target, addr: "127.0.0.1:0"}
	p.listen()
	t.Cleanup(func() { p.stop(); p.drop() })
	return p
}

// listen starts accepting on p.addr (the same port after stop).
func (p *proxy) listen() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy listen: %v", err)
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.accepted++
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.ln.Close()
}

// drop closes every connection through the proxy.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *proxy) acceptedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// TestReconnects: after the connection drops, the next Publish goes
// through a new connection; while nothing listens, Publish is Unavailable;
// once the endpoint listens again, Publish goes through.
func TestReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("reconnect")
	b.createTopic(t, topic)
	p := newProxy(t, b.endpoint)
	s := newSink(t, pubsub.Config{Endpoint: p.addr, Timeout: 5 * time.Second})
	batch := func() []sinks.Event {
		return []sinks.Event{sinktest.Event(topic, "k", []byte(`{}`)), sinktest.Event(topic, "k", []byte(`{}`))}
	}
	requireDelivered(t, publish(t, s, batch()))
	before := p.acceptedCount()

	p.drop()
	requireDelivered(t, publish(t, s, batch()))
	if after := p.acceptedCount(); after <= before {
		t.Fatalf("proxy accepted %d connections before the drop and %d after: no new connection", before, after)
	}

	p.stop()
	p.drop()
	errs := publish(t, s, batch())
	if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "connection refused") {
		t.Fatalf("Publish while nothing listens: %v, want Unavailable (connection refused)", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) && !sinks.IsUnavailable(errs[1]) {
		t.Fatalf("second event of the key: %v, want skipped or Unavailable", errs[1])
	}

	p.listen()
	// gRPC waits out its reconnect backoff before dialling again; the
	// relay's pause does the same, so retry as it would.
	deadline := time.Now().Add(60 * time.Second)
	for {
		errs := publish(t, s, batch())
		if errs[0] == nil && errs[1] == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish after the endpoint came back: %v", errs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(b.received(topic)); n < 6 {
		t.Fatalf("server stored %d messages, want at least 6", n)
	}
}

// TestPublisherCacheIsBounded: with max_topics 2, publishing to three
// topics in turn, and to the first ones again after their publishers were
// evicted, delivers every event: an evicted publisher is stopped and never
// used again (a stopped one refuses every message). That eviction happens
// is not observed here, only that it breaks nothing.
func TestPublisherCacheIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topics := []string{uniqueTopic("cache"), uniqueTopic("cache"), uniqueTopic("cache")}
	for _, topic := range topics {
		b.createTopic(t, topic)
	}
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint, MaxTopics: 2})
	for _, topic := range append(topics, topics[0], topics[1]) {
		requireDelivered(t, publish(t, s, []sinks.Event{sinktest.Event(topic, "k", []byte(`{}`))}))
	}
	for i, topic := range topics {
		want := 1
		if i < 2 {
			want = 2
		}
		if n := len(b.received(topic)); n != want {
			t.Fatalf("topic %d: server stored %d messages, want %d", i, n, want)
		}
	}
}
