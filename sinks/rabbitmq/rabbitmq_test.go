package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

var quiet = slog.New(slog.DiscardHandler)

// brokerURL returns the shared broker's URL (see rabbitmqtest.URL).
func brokerURL(t *testing.T) string { return rabbitmqtest.URL(t) }

// broker is a test's own connection to the broker, for declaring and
// reading queues.
type broker struct {
	t    *testing.T
	conn *amqp.Connection
	ch   *amqp.Channel
	mu   sync.Mutex
	got  map[string][]amqp.Delivery // queue → messages read so far
}

func newBroker(t *testing.T, u string) *broker {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatalf("connecting to %s: %v", u, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("opening a channel: %v", err)
	}
	return &broker{t: t, conn: conn, ch: ch, got: map[string][]amqp.Delivery{}}
}

// queue declares a queue named name (unique names from uniqueName), deleted
// in the cleanup of t.
func (b *broker) queue(t *testing.T, name string, args amqp.Table) string {
	t.Helper()
	if _, err := b.ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		t.Fatalf("declaring queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := b.ch.QueueDelete(name, false, false, false); err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
		}
	})
	return name
}

// messages returns everything queue q has delivered so far, reading what is
// new with basic.get.
func (b *broker) messages(t *testing.T, q string) []amqp.Delivery {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		d, ok, err := b.ch.Get(q, true)
		if err != nil {
			t.Fatalf("reading queue %s: %v", q, err)
		}
		if !ok {
			return b.got[q]
		}
		b.got[q] = append(b.got[q], d)
	}
}

// waitMessages polls q until it delivered n messages.
func (b *broker) waitMessages(t *testing.T, q string, n int) []amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := b.messages(t, q)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s delivered %d messages, want %d", q, len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func uniqueName(prefix string) string { return prefix + "." + uuid.NewString()[:8] }

// open returns a sink closed in cleanup.
func open(t *testing.T, cfg rabbitmq.Config) *rabbitmq.Sink {
	t.Helper()
	s, err := rabbitmq.New("test", cfg, quiet)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

func publishOK(t *testing.T, s sinks.Sink, events ...sinks.Event) {
	t.Helper()
	for i, err := range publish(t, s, events...) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

func secret(u string) sinkconfig.Secret { return sinkconfig.Secret(u) }

func TestConformance(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			b.queue(t, destination, nil)
			s, err := rabbitmq.New("conformance", rabbitmq.Config{URL: secret(u)}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := rabbitmq.New("conformance", rabbitmq.Config{URL: secret("amqp://guest:guest@" + sinktest.ClosedAddr(t) + "/")}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, d := range b.messages(t, destination) {
				headers := map[string]string{}
				for k, v := range d.Headers {
					headers[k], _ = v.(string)
				}
				out = append(out, sinktest.Received{ID: d.MessageId, Key: headers[rabbitmq.HeaderKey],
					Destination: d.RoutingKey, Payload: d.Body, Headers: headers})
			}
			return out
		},
		// A routing key over AMQP's 255 bytes: refused before sending.
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event(destination+"."+strings.Repeat("x", 256), key, []byte(`{"refused":true}`))
		},
		// The broker itself refuses it: no queue is bound to this routing
		// key, and mandatory makes the broker return the message.
		RefusedByPeer: func(t *testing.T, destination, key string) sinks.Event {
			return sinktest.Event(destination+".unbound", key, []byte(`{"refused":true}`))
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
	})
}

func TestDeliversPropertiesAndHeaders(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test"), nil)
	s := open(t, rabbitmq.Config{URL: secret(u), MaxPending: 3}) // a window smaller than the batch
	var events []sinks.Event
	for i := range 40 {
		key := fmt.Sprintf("k%d", i%4)
		if i%10 == 0 {
			key = ""
		}
		e := sinktest.Event(q, key, fmt.Appendf(nil, `{"n":%d}`, i))
		e.Topic = "orders.created"
		e.Headers = map[string]string{"x-n": fmt.Sprint(i)}
		e.CreatedAt = time.Date(2026, 12, 1, 20, 0, i, 0, time.UTC)
		events = append(events, e)
	}
	publishOK(t, s, events...)
	got := b.waitMessages(t, q, len(events))
	if len(got) != len(events) {
		t.Fatalf("queue delivered %d messages, want %d", len(got), len(events))
	}
	for i, d := range got {
		e := events[i] // one channel, one queue: queue order is send order
		if d.MessageId != e.ID || string(d.Body) != string(e.Payload) {
			t.Fatalf("message %d: id %s body %s, want %s %s", i, d.MessageId, d.Body, e.ID, e.Payload)
		}
		if d.ContentType != sinks.ContentTypeJSON || d.DeliveryMode != amqp.Persistent || !d.Timestamp.Equal(e.CreatedAt) {
			t.Fatalf("message %d: content type %q, delivery mode %d, timestamp %s; want %q, %d, %s",
				i, d.ContentType, d.DeliveryMode, d.Timestamp, sinks.ContentTypeJSON, amqp.Persistent, e.CreatedAt)
		}
		if d.Headers[rabbitmq.HeaderTopic] != "orders.created" || d.Headers["x-n"] != fmt.Sprint(i) {
			t.Fatalf("message %d: headers %v", i, d.Headers)
		}
		if k, ok := d.Headers[rabbitmq.HeaderKey]; e.Key == "" && ok || e.Key != "" && k != e.Key {
			t.Fatalf("message %d: %s = %v, want %q", i, rabbitmq.HeaderKey, k, e.Key)
		}
	}
}

func TestNamedExchange(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	exchange := uniqueName("herald_test_x")
	if err := b.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.ch.ExchangeDelete(exchange, false, false) })
	q := b.queue(t, uniqueName("herald_test"), nil)
	if err := b.ch.QueueBind(q, "orders.*", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	s := open(t, rabbitmq.Config{URL: secret(u), Exchange: exchange})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	routed := sinktest.Event("orders.created", "a", []byte(`{}`))
	unrouted := sinktest.Event("invoices.created", "b", []byte(`{}`))
	errs := publish(t, s, routed, unrouted)
	if errs[0] != nil {
		t.Fatalf("routed event: %v", errs[0])
	}
	if !sinks.IsPermanent(errs[1]) || !errors.Is(errs[1], rabbitmq.ErrReturned) || !strings.Contains(errs[1].Error(), "invoices.created") {
		t.Fatalf("unrouted event: %v, want a permanent ErrReturned naming the routing key", errs[1])
	}
	if got := b.waitMessages(t, q, 1); got[0].MessageId != routed.ID || got[0].Exchange != exchange {
		t.Fatalf("queue got %s from exchange %q, want %s from %q", got[0].MessageId, got[0].Exchange, routed.ID, exchange)
	}
}

func TestMandatoryOff(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	off := false
	s := open(t, rabbitmq.Config{URL: secret(u), Mandatory: &off})
	// No queue of that name: the broker drops the message and confirms it.
	if errs := publish(t, s, sinktest.Event(uniqueName("herald_test_nobody"), "", []byte(`{}`))); errs[0] != nil {
		t.Fatalf("with mandatory off an unroutable event counts as delivered, got %v", errs[0])
	}
}

func TestMissingExchangeIsUnavailable(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	exchange := uniqueName("herald_test_missing")
	s := open(t, rabbitmq.Config{URL: secret(u), Exchange: exchange})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), exchange) {
		t.Fatalf("Check: %v, want Unavailable naming %s", err, exchange)
	}
	errs := publish(t, s, sinktest.Event("a", "k", []byte(`{}`)), sinktest.Event("b", "", []byte(`{}`)), sinktest.Event("c", "k", []byte(`{}`)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) && !errors.Is(err, sinks.ErrSkipped) {
			t.Fatalf("event %d: %v, want Unavailable", i, err)
		}
	}
	if !strings.Contains(errs[0].Error(), "404") {
		t.Fatalf("event 0: %v, want the broker's 404", errs[0])
	}
	// Once the exchange exists, the sink publishes on a fresh channel.
	if err := b.ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.ch.ExchangeDelete(exchange, false, false) })
	q := b.queue(t, uniqueName("herald_test"), nil)
	if err := b.ch.QueueBind(q, "", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after declaring the exchange: %v", err)
	}
	e := sinktest.Event("a", "k", []byte(`{}`))
	publishOK(t, s, e)
	if got := b.waitMessages(t, q, 1); got[0].MessageId != e.ID {
		t.Fatalf("queue got %s, want %s", got[0].MessageId, e.ID)
	}
}

// closedPort returns a local address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestConnectionRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	s := open(t, rabbitmq.Config{URL: secret("amqp://guest:hunter2@" + closedPort(t) + "/")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	checkErr := s.Check(ctx)
	errs := publish(t, s, sinktest.Event("q", "", []byte(`{}`)))
	for _, err := range []error{checkErr, errs[0]} {
		if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("got %v, want Unavailable: connection refused", err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("error %q shows the password", err)
		}
	}
}

func TestBadCredentialsAreUnavailable(t *testing.T) {
	t.Parallel()
	good, err := url.Parse(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	good.User = url.UserPassword(good.User.Username(), "wrong-hunter2")
	s := open(t, rabbitmq.Config{URL: secret(good.String())})
	errs := publish(t, s, sinktest.Event("q", "", []byte(`{}`)))
	if !sinks.IsUnavailable(errs[0]) || strings.Contains(errs[0].Error(), "hunter2") {
		t.Fatalf("got %v, want Unavailable without the password", errs[0])
	}
	if !strings.Contains(errs[0].Error(), "[redacted]@") {
		t.Fatalf("error %q does not name the (redacted) server", errs[0])
	}
}

func TestNegativeConfirmIsRetryable(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	// A queue that holds one message and refuses more: the broker nacks.
	q := b.queue(t, uniqueName("herald_test_full"), amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	s := open(t, rabbitmq.Config{URL: secret(u)})
	first, second := sinktest.Event(q, "", []byte(`{"n":1}`)), sinktest.Event(q, "", []byte(`{"n":2}`))
	errs := publish(t, s, first, second)
	if errs[0] != nil {
		t.Fatalf("first event: %v", errs[0])
	}
	err := errs[1]
	if !errors.Is(err, rabbitmq.ErrNacked) || sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
		t.Fatalf("second event: %v, want a retryable ErrNacked", err)
	}
	// Once the queue has room, the retry goes through on the same sink.
	b.waitMessages(t, q, 1)
	publishOK(t, s, second)
	if got := b.waitMessages(t, q, 2); got[1].MessageId != second.ID {
		t.Fatalf("queue got %s, want %s", got[1].MessageId, second.ID)
	}
}

func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test"), nil)
	s := open(t, rabbitmq.Config{URL: secret(u), MaxMessageSize: 64})
	tooLarge := sinktest.Oversized(q, "k", 65)
	afterIt := sinktest.Event(q, "k", []byte(`{}`))
	cc := sinktest.Event(q, "c", []byte(`{}`))
	cc.Headers = map[string]string{"CC": "another-queue"}
	longKey := sinktest.Event(strings.Repeat("q", 256), "", []byte(`{}`))
	ok := sinktest.Event(q, "", []byte(`{"ok":true}`))
	errs := publish(t, s, tooLarge, afterIt, cc, longKey, ok)
	for i, want := range []string{"max_message_size", "", "CC", "routing key"} {
		if i == 1 {
			if !errors.Is(errs[i], sinks.ErrSkipped) {
				t.Fatalf("the event after a refused one of its key: %v, want ErrSkipped", errs[i])
			}
			continue
		}
		if !sinks.IsPermanent(errs[i]) || !strings.Contains(errs[i].Error(), want) {
			t.Fatalf("event %d: %v, want a permanent error about %s", i, errs[i], want)
		}
	}
	if errs[4] != nil {
		t.Fatalf("valid event: %v", errs[4])
	}
	if got := b.waitMessages(t, q, 1); len(got) != 1 || got[0].MessageId != ok.ID {
		t.Fatalf("queue got %d messages (first %s), want only %s", len(got), got[0].MessageId, ok.ID)
	}
}

func TestCheckDestinations(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test"), nil)
	missing := uniqueName("herald_test_missing")
	s := open(t, rabbitmq.Config{URL: secret(u)})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := s.CheckDestinations(ctx, q); err != nil {
		t.Fatalf("CheckDestinations(%s): %v", q, err)
	}
	err := s.CheckDestinations(ctx, q, missing, strings.Repeat("x", 300))
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "over AMQP's limit") || strings.Contains(err.Error(), q+"\"") {
		t.Fatalf("CheckDestinations: %v, want errors naming %s and the long key only", err, missing)
	}
}

// proxy forwards TCP connections to the broker and can cut them all, as a
// broker-side close or a network failure would, or hold back what the
// broker sends, as a stalled broker would.
type proxy struct {
	l        net.Listener
	upstream string
	// held is write-locked while the broker's bytes are held back; the
	// copier read-locks it around each write to the client.
	held     sync.RWMutex
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
}

func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, upstream: upstream}
	t.Cleanup(func() { l.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.accepted++
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { p.copyHeld(c, up); c.Close() }()
	}
}

// copyHeld copies from to to, waiting while the proxy holds.
func (p *proxy) copyHeld(to io.Writer, from io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.held.RLock()
			_, werr := to.Write(buf[:n])
			p.held.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes every connection made so far.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func TestReconnectsAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test"), nil)
	direct, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, direct.Host)
	viaProxy := *direct
	viaProxy.Host = p.l.Addr().String()
	s := open(t, rabbitmq.Config{URL: secret(viaProxy.String())})
	before := sinktest.Event(q, "k", []byte(`{"n":1}`))
	publishOK(t, s, before)
	p.cut()
	// The sink learns of the loss either on its next publish (Unavailable)
	// or before it (it then dials at once); either way it must publish
	// again without being recreated, on a new connection.
	after := sinktest.Event(q, "k", []byte(`{"n":2}`))
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := publish(t, s, after)[0]
		if err == nil {
			break
		}
		if !sinks.IsUnavailable(err) {
			t.Fatalf("publishing after the connection was cut: %v, want Unavailable until it reconnects", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful publish within 30s of the cut; last error: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := p.connections(); n < 2 {
		t.Fatalf("proxy saw %d connections, want a new one after the cut", n)
	}
	got := b.waitMessages(t, q, 2)
	if got[0].MessageId != before.ID || got[len(got)-1].MessageId != after.ID {
		t.Fatalf("queue got %s … %s, want %s … %s", got[0].MessageId, got[len(got)-1].MessageId, before.ID, after.ID)
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	s, err := rabbitmq.New("test", rabbitmq.Config{URL: secret(u)}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx, []sinks.Event{sinktest.Event("q", "", []byte(`{}`))})[0]; !errors.Is(err, rabbitmq.ErrClosed) || !sinks.IsUnavailable(err) {
		t.Fatalf("Publish after Close: %v, want Unavailable ErrClosed", err)
	}
}

// TestConfirmTimeoutIsRetryable holds back everything the broker sends
// (confirms included) while a batch waits: each event fails retryable after
// confirm_timeout, not permanent and not unavailable. Once the broker's
// bytes flow again, the same sink publishes the batch again on a fresh
// channel, and the late confirms of the first attempt are not taken for
// the second's.
func TestConfirmTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test"), nil)
	direct, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, direct.Host)
	viaProxy := *direct
	viaProxy.Host = p.l.Addr().String()
	s := open(t, rabbitmq.Config{URL: secret(viaProxy.String()), ConfirmTimeout: 300 * time.Millisecond})
	publishOK(t, s, sinktest.Event(q, "", []byte(`{"warm":true}`))) // connected, a channel idle
	events := []sinks.Event{sinktest.Event(q, "k", []byte(`{"n":1}`)), sinktest.Event(q, "k", []byte(`{"n":2}`)), sinktest.Event(q, "j", []byte(`{"n":3}`))}
	p.held.Lock()
	errs := publish(t, s, events...)
	p.held.Unlock()
	for i, err := range errs {
		if err == nil || sinks.IsPermanent(err) || sinks.IsUnavailable(err) {
			t.Fatalf("event %d while the broker's confirms are held back: %v, want a retryable error", i, err)
		}
	}
	if !strings.Contains(errs[0].Error(), "confirm_timeout") {
		t.Fatalf("event 0: %v, want it to name confirm_timeout", errs[0])
	}
	publishOK(t, s, events...)
	// The first attempt reached the queue too (the confirms, not the
	// messages, were held): 1 + 3 + 3.
	got := b.waitMessages(t, q, 7)
	if got[len(got)-1].MessageId != events[2].ID {
		t.Fatalf("last message %s, want %s", got[len(got)-1].MessageId, events[2].ID)
	}
}
