package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/smtptest"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/email"
	"github.com/heraldhq/herald/sinks/kafka"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/webhook"
)

// arrival is one event as observed at a sink's real peer.
type arrival struct{ id, key string }

// TestFanOutToEveryRealSink routes orders.* to Kafka (kfake), NATS JetStream,
// a webhook and email at once, with the webhook failing its first three
// requests. Every peer must get every event, in key order; the webhook's
// failures must cause no second copy anywhere else.
func TestFanOutToEveryRealSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)

	// Kafka: an in-process broker speaking the wire protocol.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	if err := cluster.CreateTopic("orders.paid", 3, nil); err != nil {
		t.Fatal(err)
	}
	kafkaSink, err := kafka.New("events-kafka", kafka.Config{Brokers: cluster.ListenAddrs()}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// NATS JetStream: a stream of this test's own, reached through a
	// destination template.
	nc := natstest.Connect(t, natstest.URL(t))
	stream := natstest.Stream(t, nc)
	natsSink, err := natssink.New("bus", natssink.Config{URL: natstest.URL(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Webhook: a real HTTP server answering 500 to its first three requests
	// (counted, not timed: a loaded machine may reach it late).
	const hookFailures = 3
	var (
		hookMu   sync.Mutex
		hookGot  []arrival
		requests atomic.Int32
		failures atomic.Int32
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if requests.Add(1) <= hookFailures {
			failures.Add(1)
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
		var env struct{ ID, Key string }
		if err := json.Unmarshal(body, &env); err != nil || env.ID != r.Header.Get("webhook-id") {
			http.Error(w, "bad envelope", http.StatusBadRequest)
			return
		}
		hookMu.Lock()
		hookGot = append(hookGot, arrival{env.ID, env.Key})
		hookMu.Unlock()
	}))
	t.Cleanup(hook.Close)
	hookSink, err := webhook.New("billing", webhook.Config{URL: hook.URL, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}

	// Email: a real SMTP conversation with an in-process server.
	smtpd, err := smtptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smtpd.Close() })
	mailSink, err := email.New("mail", email.Config{
		SMTP:         email.SMTPConfig{Host: smtpd.Host(), Port: smtpd.Port()},
		From:         "shop@example.com",
		TemplatesDir: "../sinks/email/testdata/templates",
		Template:     "order_paid",
		Subject:      "Your order is paid",
		ToField:      "customer.email",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}

	cfg := relay.Config{
		Tables:       tables,
		BatchSize:    50,
		Lease:        10 * time.Second,
		PollInterval: 100 * time.Millisecond,
		Backoff:      relay.Backoff{Initial: 200 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger:       slog.New(slog.DiscardHandler),
		Routes: []relay.Route{{Topics: []string{"orders.*"}, Targets: []relay.Target{
			{Sink: kafkaSink},
			{Sink: natsSink, Destination: template.Must(template.New("d").Parse(stream.Prefix + ".{{.Topic}}"))},
			{Sink: hookSink},
			{Sink: mailSink},
		}}},
	}
	r, err := relay.NewPostgres(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}

	// 60 paid orders over 8 keys, committed in one transaction.
	const n, keys = 60, 8
	want := map[string]int64{} // event id → seq
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := fmt.Sprintf("order-%d", i%keys)
		payload := fmt.Sprintf(`{"order_id":%q,"total":"%d.00","currency":"EUR","customer":{"name":"Ada","email":"ada%d@example.com"},"items":[{"name":"Widget","qty":1,"price":"%d.00"}]}`, key, i, i, i)
		var id string
		var seq int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+tables.Outbox()+` (topic, key, payload) VALUES ('orders.paid', $1, $2) RETURNING id::text, seq`,
			key, payload).Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		want[id] = seq
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay.Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		for _, s := range []sinks.Sink{kafkaSink, natsSink, hookSink, mailSink} {
			_ = s.Close(context.Background())
		}
	})

	readKafka := func() []arrival {
		var out []arrival
		for _, part := range readKafkaTopic(t, cluster.ListenAddrs()[0], "orders.paid") {
			for _, m := range part {
				out = append(out, arrival{kafkaHeader(m, kafka.HeaderID), string(m.Key)})
			}
		}
		return out
	}
	readNATS := func() []arrival {
		var out []arrival
		for _, m := range stream.Messages(t) {
			out = append(out, arrival{m.Header.Get(natssink.HeaderMsgID), m.Header.Get(natssink.HeaderKey)})
		}
		return out
	}
	readHook := func() []arrival {
		hookMu.Lock()
		defer hookMu.Unlock()
		return append([]arrival(nil), hookGot...)
	}
	readMail := func() []arrival {
		var out []arrival
		for _, m := range smtpd.Messages() {
			out = append(out, arrival{m.Header("X-Herald-Event-Id"), m.Header("X-Herald-Key")})
		}
		return out
	}

	deadline := time.Now().Add(2 * time.Minute)
	for {
		if len(readKafka()) >= n && len(readNATS()) >= n && len(readHook()) >= n && len(readMail()) >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2m: kafka %d, nats %d, webhook %d, email %d of %d events",
				len(readKafka()), len(readNATS()), len(readHook()), len(readMail()), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every event done on every sink, and the relay stopped (Run returns
	// once its publishes have): a second copy would be in the sinks now.
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
	stop()

	if failures.Load() == 0 {
		t.Fatal("the webhook never failed; the test proves nothing about retries")
	}
	for name, got := range map[string][]arrival{"kafka": readKafka(), "nats": readNATS(), "webhook": readHook(), "email": readMail()} {
		// Exactly once everywhere: the webhook's retries went to it alone.
		count := map[string]int{}
		lastSeq := map[string]int64{}
		for _, a := range got {
			seq, ok := want[a.id]
			if !ok {
				t.Fatalf("%s: unknown event id %q", name, a.id)
			}
			count[a.id]++
			if prev, ok := lastSeq[a.key]; ok && seq < prev {
				t.Fatalf("%s: key %s seq %d arrived after seq %d", name, a.key, seq, prev)
			}
			lastSeq[a.key] = seq
		}
		for id := range want {
			if count[id] != 1 {
				t.Fatalf("%s received event %s %d times, want once", name, id, count[id])
			}
		}
	}
	// The rendered email is the template's, with the payload's values.
	m := smtpd.Messages()[0]
	if !bytes.Contains(m.Data, []byte("we received your payment of")) || m.Header("Subject") != "Your order is paid" {
		t.Fatalf("email not rendered from the template:\n%s", m.Data)
	}
}

func kafkaHeader(m kafkago.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// readKafkaTopic reads every record of topic, partition by partition.
func readKafkaTopic(t *testing.T, addr, topic string) [][]kafkago.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dialer := &kafkago.Dialer{Timeout: 5 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dialing kafka: %v", err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("reading partitions: %v", err)
	}
	out := make([][]kafkago.Message, len(parts))
	for _, p := range parts {
		pc, err := dialer.DialLeader(ctx, "tcp", addr, topic, p.ID)
		if err != nil {
			t.Fatalf("dialing leader: %v", err)
		}
		last, err := pc.ReadLastOffset()
		if err != nil {
			t.Fatalf("reading last offset: %v", err)
		}
		for offset := int64(0); offset < last; {
			if _, err := pc.Seek(offset, kafkago.SeekAbsolute); err != nil {
				t.Fatalf("seeking: %v", err)
			}
			_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
			batch := pc.ReadBatch(1, 10<<20)
			for {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				out[p.ID] = append(out[p.ID], m)
				offset = m.Offset + 1
			}
			_ = batch.Close()
		}
		pc.Close()
	}
	return out
}
