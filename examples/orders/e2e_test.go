package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/internal/smtptest"
	"github.com/heraldhq/herald/relay"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/webhook"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// arrival is one event as a sink's real peer received it.
type arrival struct {
	id, topic, key, dest string
}

// collector keeps arrivals per sink.
type collector struct {
	mu  sync.Mutex
	got map[string][]arrival
}

func (c *collector) add(sink string, a arrival) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.got == nil {
		c.got = map[string][]arrival{}
	}
	c.got[sink] = append(c.got[sink], a)
}

func (c *collector) get(sink string) []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arrival(nil), c.got[sink]...)
}

// TestOrdersEndToEnd runs the order service and a relay configured by
// relay.yaml (the file shipped with the example, addresses from the
// environment) against real PostgreSQL, Kafka (kfake), NATS JetStream, a
// webhook receiver and an SMTP server; creates and pays 100 orders over
// HTTP; and checks that every event reached exactly the sinks its route
// names, once, in per-order order, with the emails rendered.
func TestOrdersEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	var got collector

	// Kafka.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	if err := cluster.CreateTopic("orders", kafkaPartitions, nil); err != nil {
		t.Fatal(err)
	}

	// NATS: this test's own stream; relay.yaml's destination puts the
	// prefix in front of the topic.
	natsURL := natstest.URL(t)
	nc := natstest.Connect(t, natsURL)
	stream := natstest.Stream(t, nc)

	// Webhook receiver checking the Standard Webhooks signature.
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(testSecret, r.Header, body, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var env struct{ ID, Topic, Key string }
		if err := json.Unmarshal(body, &env); err != nil || env.ID != r.Header.Get("webhook-id") {
			http.Error(w, "bad envelope", http.StatusBadRequest)
			return
		}
		got.add("webhook", arrival{id: env.ID, topic: env.Topic, key: env.Key, dest: r.URL.Path})
	}))
	t.Cleanup(hook.Close)

	smtpd, err := smtptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smtpd.Close() })

	env := map[string]string{
		"DATABASE_URL":        pgtest.URL(t),
		"HERALD_SCHEMA":       tables.Schema,
		"ORDERS_SCHEMA":       tables.Schema,
		"KAFKA_BROKER":        cluster.ListenAddrs()[0],
		"NATS_URL":            natsURL,
		"NATS_SUBJECT_PREFIX": stream.Prefix,
		"WEBHOOK_URL":         hook.URL + "/hooks/orders",
		"WEBHOOK_SECRET":      testSecret,
		"SMTP_HOST":           smtpd.Host(),
		"SMTP_PORT":           fmt.Sprint(smtpd.Port()),
		"TEMPLATES_DIR":       "templates",
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }

	// The relay, from the example's configuration file.
	file, err := relayconfig.Load("relay.yaml", lookup)
	if err != nil {
		t.Fatal(err)
	}
	built, err := file.Build(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	cfg := built.Config
	cfg.PollInterval = 200 * time.Millisecond
	r, err := relay.NewPostgres(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(runCtx) }()
	var stopOnce sync.Once
	stopRelay := func() {
		stopOnce.Do(func() {
			cancelRelay()
			if err := <-relayDone; err != nil {
				t.Errorf("relay: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stopRelay()
		if err := built.Close(context.Background()); err != nil {
			t.Errorf("closing sinks: %v", err)
		}
	})

	// The order service, as its main runs it.
	svcCtx, stopSvc := context.WithCancel(ctx)
	ready := make(chan string, 1)
	var svcErr error
	svcDone := make(chan struct{})
	go func() {
		defer close(svcDone)
		// The test's stream exists already: no -nats-url, no stream creation.
		svcErr = run(svcCtx, []string{"-listen", "127.0.0.1:0", "-nats-url", ""}, lookup, io.Discard, ready)
	}()
	t.Cleanup(func() {
		stopSvc()
		<-svcDone
		if svcErr != nil {
			t.Errorf("orders service: %v", svcErr)
		}
	})
	var addr string
	select {
	case addr = <-ready:
	case <-svcDone:
		t.Fatal("orders service did not start")
	case <-time.After(30 * time.Second):
		t.Fatal("orders service not ready after 30s")
	}
	client := &shop.Client{BaseURL: "http://" + addr}

	// Kafka and NATS readers, collecting as the relay publishes.
	readCtx, stopReading := context.WithCancel(ctx)
	t.Cleanup(stopReading)
	go readKafka(t, readCtx, cluster.ListenAddrs(), &got)
	sub, err := nc.Subscribe(stream.Prefix+".>", func(m *nats.Msg) {
		got.add("nats", arrival{id: m.Header.Get(natssink.HeaderMsgID), topic: m.Header.Get(natssink.HeaderTopic),
			key: m.Header.Get(natssink.HeaderKey), dest: m.Subject})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// 100 orders, created and paid over HTTP by 8 clients.
	const n = 100
	orders := make([]*shop.Order, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				name := fmt.Sprintf("Customer %03d", i)
				if i%10 == 3 {
					name = fmt.Sprintf("Zoë <b>O'Brien</b> & Co %03d", i)
				}
				o, err := client.Create(ctx, shop.NewOrder{
					Customer: shop.Customer{Name: name, Email: fmt.Sprintf("c%03d@example.com", i)},
					Items:    []shop.Item{{Name: "Widget", Qty: i%3 + 1, Price: "12.5"}, {Name: "Gadget & gizmo", Qty: 1, Price: "0.99"}},
				})
				if err == nil {
					o, err = client.Pay(ctx, o.ID)
				}
				if err != nil {
					errs <- err
					return
				}
				orders[i] = o
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Wait for every sink's share.
	want := map[string]int{"kafka": 2 * n, "nats": 2 * n, "webhook": 2 * n}
	deadline := time.Now().Add(40 * time.Second)
	for {
		done := len(smtpd.Messages()) >= n
		for sink, count := range want {
			done = done && len(got.get(sink)) >= count
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 40s: kafka %d, nats %d, webhook %d of %d events; email %d of %d",
				len(got.get("kafka")), len(got.get("nats")), len(got.get("webhook")), 2*n, len(smtpd.Messages()), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every event done and the relay stopped (Run returns once its
	// publishes have): a marker sent now on each Kafka partition and on
	// NATS reaches the readers behind anything the relay published, a
	// second copy included. Webhook and SMTP peers record synchronously.
	var left int
	for {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Outbox()).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events left in the outbox", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if paused := r.PausedSinks(); len(paused) != 0 {
		t.Fatalf("paused sinks: %v", paused)
	}
	stopRelay()
	sendMarkers(t, ctx, cluster.ListenAddrs(), nc, stream.Prefix+".marker")
	deadline = time.Now().Add(30 * time.Second)
	for markers(got.get("kafka")) < kafkaPartitions || markers(got.get("nats")) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("markers not read within 30s: kafka %d of %d, nats %d of 1", markers(got.get("kafka")), kafkaPartitions, markers(got.get("nats")))
		}
		time.Sleep(20 * time.Millisecond)
	}

	byID := map[string]*shop.Order{}
	for _, o := range orders {
		byID[o.ID] = o
	}
	for sink := range want {
		var arrivals []arrival
		for _, a := range got.get(sink) {
			if a.id != markerID {
				arrivals = append(arrivals, a)
			}
		}
		if len(arrivals) != 2*n {
			t.Fatalf("%s received %d events, want %d", sink, len(arrivals), 2*n)
		}
		seen := map[string]bool{}
		next := map[string]string{} // order id → topic expected next
		for _, a := range arrivals {
			if seen[a.id] {
				t.Fatalf("%s received event %s twice", sink, a.id)
			}
			seen[a.id] = true
			if byID[a.key] == nil {
				t.Fatalf("%s: event %s has key %q, not an order id", sink, a.id, a.key)
			}
			expected := next[a.key]
			if expected == "" {
				expected = shop.TopicOrderCreated
			}
			if a.topic != expected {
				t.Fatalf("%s: order %s: got %s, want %s next (route or order broken)", sink, a.key, a.topic, expected)
			}
			next[a.key] = shop.TopicOrderPaid
			wantDest := map[string]string{"kafka": "orders", "nats": stream.Prefix + "." + a.topic, "webhook": "/hooks/orders"}[sink]
			if a.dest != wantDest {
				t.Fatalf("%s: event %s went to %q, want %q", sink, a.id, a.dest, wantDest)
			}
		}
	}

	// Email: one per paid order, to the customer, rendered.
	msgs := smtpd.Messages()
	if len(msgs) != n {
		t.Fatalf("%d emails, want %d", len(msgs), n)
	}
	mailByID := map[string]bool{}
	checkedEscaping := false
	for _, m := range msgs {
		if m.Header("X-Herald-Topic") != shop.TopicEmailPaid {
			t.Fatalf("email of topic %q: only email.* goes to the email sink", m.Header("X-Herald-Topic"))
		}
		id := m.Header("X-Herald-Event-Id")
		if mailByID[id] {
			t.Fatalf("email for event %s sent twice", id)
		}
		mailByID[id] = true
		o := byID[m.Header("X-Herald-Key")]
		if o == nil || len(m.To) != 1 || m.To[0] != o.Customer.Email {
			t.Fatalf("email to %v for key %s", m.To, m.Header("X-Herald-Key"))
		}
		text, html := mailParts(t, m.Data)
		for _, part := range []string{text, html} {
			if !strings.Contains(part, string(o.Total)+" EUR") || !strings.Contains(part, o.ID) || !strings.Contains(part, id) {
				t.Fatalf("email for order %s lacks total %s, order id or event id:\n%s", o.ID, o.Total, part)
			}
		}
		if !strings.Contains(text, "Hello "+o.Customer.Name+",") {
			t.Fatalf("text part lacks the customer's name %q:\n%s", o.Customer.Name, text)
		}
		if strings.Contains(o.Customer.Name, "<b>") {
			checkedEscaping = true
			if strings.Contains(html, "<b>") || !strings.Contains(html, "&lt;b&gt;O&#39;Brien&lt;/b&gt; &amp; Co") {
				t.Fatalf("HTML part does not escape the customer's name %q:\n%s", o.Customer.Name, html)
			}
			if !strings.Contains(html, "Gadget &amp; gizmo") {
				t.Fatalf("HTML part does not escape the item name:\n%s", html)
			}
		} else if !strings.Contains(html, "Hello "+o.Customer.Name+",") {
			t.Fatalf("HTML part lacks the customer's name %q:\n%s", o.Customer.Name, html)
		}
	}
	if !checkedEscaping {
		t.Fatal("no email had a name needing HTML escaping")
	}
}

// markerID is the event id of the markers sendMarkers sends.
const markerID = "marker"

// kafkaPartitions is the orders topic's partition count.
const kafkaPartitions = 3

// sendMarkers sends a marker record to every partition of the orders topic
// and a marker message to natsSubject.
func sendMarkers(t *testing.T, ctx context.Context, brokers []string, nc *nats.Conn, natsSubject string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for p := range int32(kafkaPartitions) {
		rec := &kgo.Record{Topic: "orders", Partition: p, Headers: []kgo.RecordHeader{{Key: "herald-id", Value: []byte(markerID)}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatalf("sending the Kafka marker to partition %d: %v", p, err)
		}
	}
	msg := nats.NewMsg(natsSubject)
	msg.Header.Set(natssink.HeaderMsgID, markerID)
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatalf("sending the NATS marker: %v", err)
	}
}

// markers counts the markers among arrivals.
func markers(arrivals []arrival) int {
	n := 0
	for _, a := range arrivals {
		if a.id == markerID {
			n++
		}
	}
	return n
}

// readKafka consumes the orders topic from the start until ctx ends.
func readKafka(t *testing.T, ctx context.Context, brokers []string, got *collector) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Error(err)
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(rec *kgo.Record) {
			a := arrival{key: string(rec.Key), dest: rec.Topic}
			for _, h := range rec.Headers {
				switch h.Key {
				case "herald-id":
					a.id = string(h.Value)
				case "herald-topic":
					a.topic = string(h.Value)
				}
			}
			got.add("kafka", a)
		})
	}
}

// mailParts returns the decoded text and HTML parts of a
// multipart/alternative message.
func mailParts(t *testing.T, data []byte) (text, html string) {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" {
		t.Fatalf("Content-Type %q (%v), want multipart/alternative", msg.Header.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart() // decodes quoted-printable
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		switch ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type")); ct {
		case "text/plain":
			text = string(body)
		case "text/html":
			html = string(body)
		}
	}
	if text == "" || html == "" {
		t.Fatalf("message lacks a text or HTML part:\n%s", data)
	}
	return text, html
}
