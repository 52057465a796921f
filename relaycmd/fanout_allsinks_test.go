package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/heraldhq/herald/internal/awstest"
	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/internal/redistest"
	"github.com/heraldhq/herald/internal/smtptest"
	"github.com/heraldhq/herald/sinks/kafka"
	"github.com/heraldhq/herald/sinks/mqtt"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/pubsub"
)

// arrival is one event as a consumer read it from a sink's peer.
type arrival struct{ id, key string }

// fanoutSink is one sink of the all-sinks fan-out: its entry in the
// relay's sinks section, its destination in the route, and a consumer
// returning everything that arrived at its peer so far, duplicates
// included, in arrival order. A new sink type joins the test by adding a
// case to allSinks.
type fanoutSink struct {
	name        string
	entry       string // YAML flow mapping without the name
	destination string // "" for the event's topic
	read        func(t *testing.T) []arrival
	// oneKey: the sink receives only the events of sampledKey (moto, the
	// SQS and SNS peer, takes about a second per FIFO message on a loaded
	// machine: all the events would take minutes).
	oneKey bool
}

// sampledKey is the key whose events every sink receives, oneKey ones too.
const sampledKey = "order-00"

// TestFanOutToAllSinksWithMosquittoRestart runs the built relay with
// fanout.paid routed to every sink type at once, each with a real peer:
// kfake, the local NATS JetStream, an HTTP receiver, an SMTP server, the
// local Redis and RabbitMQ, a private Mosquitto, an in-process pstest
// Pub/Sub server, and a moto server for SQS and SNS (FIFO queue and topic,
// so that a key's order holds; they receive one key's events, through a
// first route with a where filter). Mosquitto is stopped after some events
// reached its subscriber; the relay must pause the MQTT sink
// (herald_sink_paused) while more events are committed, then drain once
// Mosquitto is back on the same port. Every consumer must have read every
// event routed to it, after dedupe by event id, each key's events in the
// order they were committed.
func TestFanOutToAllSinksWithMosquittoRestart(t *testing.T) {
	t.Parallel()
	dbURL, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	cases, broker := allSinks(t)

	var sinkLines, targets, allKeysTargets []string
	for _, c := range cases {
		sinkLines = append(sinkLines, fmt.Sprintf("  - {name: %s, %s}", c.name, c.entry))
		target := c.name
		if c.destination != "" {
			target = fmt.Sprintf("{name: %s, destination: %q}", c.name, c.destination)
		}
		targets = append(targets, target)
		if !c.oneKey {
			allKeysTargets = append(allKeysTargets, target)
		}
	}
	config := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {batch_size: 50, lease: 10s, poll_interval: 100ms, shutdown_timeout: 10s, backoff: {initial: 100ms, max: 1s}, sink_pause: {initial: 100ms, max: 500ms}}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
%s
routes:
  - topics: ["fanout.*"]
    where: 'key == "%s"'
    sinks: [%s]
  - topics: ["fanout.*"]
    sinks: [%s]
`, dbURL, tables.Schema, strings.Join(sinkLines, "\n"), sampledKey, strings.Join(targets, ", "), strings.Join(allKeysTargets, ", ")))

	if r := runRelay(t, nil, "migrate", "up", "--database-url", dbURL, "--schema", tables.Schema); r.code != 0 {
		t.Fatalf("migrate:\n%s", r)
	}
	started := time.Now()
	p := start(t, nil, "run", "--config", config)
	base := adminBase(t, p)
	waitReadyz(t, p, base, func(r readiness) bool { return r.code == http.StatusOK })

	// Events are committed in two rounds over 30 keys; want keeps each
	// key's event ids in commit order.
	const keys = 30
	want := map[string][]string{}
	total := 0
	commit := func(n int) {
		t.Helper()
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(t.Context())
		for range n {
			key := fmt.Sprintf("order-%02d", total%keys)
			var id string
			if err := tx.QueryRow(t.Context(), "INSERT INTO "+tables.Outbox()+` (topic, key, payload) VALUES ('fanout.paid', $1, $2) RETURNING id::text`,
				key, fmt.Sprintf(`{"to": "buyer%d@example.com", "n": %d}`, total, total)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			want[key] = append(want[key], id)
			total++
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	mqttCase := cases[len(cases)-1]

	t.Logf("relay ready after %s", time.Since(started).Round(time.Millisecond))
	commit(240)
	// Stop Mosquitto once some events reached its subscriber, while the
	// others may still be on their way.
	waitArrivals(t, p, "mqtt subscriber", 40, func() int { return len(dedupe(mqttCase.read(t))) })
	broker.stop(t)
	// Committed during the outage, these must meet the stopped broker: the
	// relay pauses the sink instead of spending their attempts.
	commit(120)
	waitMetric(t, p, base, `herald_sink_paused{sink="mqtt"} 1`)
	broker.start(t)

	// wantCount is how many distinct events c must read.
	wantCount := func(c fanoutSink) int {
		if c.oneKey {
			return len(want[sampledKey])
		}
		return total
	}
	for _, c := range cases {
		waitArrivals(t, p, c.name, wantCount(c), func() int { return len(dedupe(c.read(t))) })
		t.Logf("%s: every event read, %s after the relay started", c.name, time.Since(started).Round(time.Millisecond))
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay exit %d:\n%s", code, p.output())
	}
	var left int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+tables.Outbox()).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d events left in the outbox after every sink read them all", left)
	}

	order := map[string]int{} // event id → position within its key
	keyOf := map[string]string{}
	for key, ids := range want {
		for i, id := range ids {
			order[id], keyOf[id] = i, key
		}
	}
	for _, c := range cases {
		got := dedupe(c.read(t))
		last := map[string]int{}
		for _, a := range got {
			pos, ok := order[a.id]
			if !ok {
				t.Fatalf("%s: an event the test did not commit: %q", c.name, a.id)
			}
			if c.oneKey && a.key != sampledKey {
				t.Fatalf("%s: event %s of key %q arrived; the route sends it only %s's", c.name, a.id, a.key, sampledKey)
			}
			if a.key != keyOf[a.id] {
				t.Fatalf("%s: event %s arrived with key %q, committed with %q", c.name, a.id, a.key, keyOf[a.id])
			}
			want := 0 // the key's next event in commit order
			if prev, seen := last[a.key]; seen {
				want = prev + 1
			}
			if pos != want {
				t.Fatalf("%s: key %s: its event #%d (%s) arrived where #%d was due; want commit order", c.name, a.key, pos, a.id, want)
			}
			last[a.key] = pos
		}
		if len(got) != wantCount(c) {
			t.Fatalf("%s: %d distinct events arrived, want %d", c.name, len(got), wantCount(c))
		}
	}
}

// dedupe keeps the first arrival of each event id, in arrival order.
func dedupe(in []arrival) []arrival {
	seen := map[string]bool{}
	var out []arrival
	for _, a := range in {
		if !seen[a.id] {
			seen[a.id] = true
			out = append(out, a)
		}
	}
	return out
}

// waitArrivals polls count until it reaches n, within three minutes (the
// machine is shared; the relay's log is printed on failure).
func waitArrivals(t *testing.T, p *process, what string, n int, count func() int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := count()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d events after 3 minutes; relay output:\n%s", what, got, n, p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMetric polls /metrics until a line equals line.
func waitMetric(t *testing.T, p *process, base, line string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(body), "\n") {
			if l == line {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %s; relay output:\n%s", line, p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// allSinks starts or reaches a peer for every sink type and returns the
// cases, MQTT last, and the private Mosquitto the test restarts. Peers are
// cleaned up when the test ends.
func allSinks(t *testing.T) ([]fanoutSink, *mosquitto) {
	t.Helper()
	broker := startMosquitto(t)
	sqs, sns := awsCases(t)
	return []fanoutSink{kafkaCase(t), natsCase(t), webhookCase(t), emailCase(t), redisCase(t), rabbitmqCase(t),
		pubsubCase(t), sqs, sns, mqttCase(t, broker)}, broker
}

// pubsubCase publishes to a topic of an in-process pstest server, which
// keeps every message published in publish order; the binary reaches it
// through the sink's endpoint.
func pubsubCase(t *testing.T) fanoutSink {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const project, topic = "herald-test", "fanout-paid"
	if _, err := srv.GServer.CreateTopic(t.Context(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
		t.Fatal(err)
	}
	return fanoutSink{
		name:        "pubsub",
		entry:       fmt.Sprintf("type: pubsub, project: %s, endpoint: %q", project, srv.Addr),
		destination: topic,
		read: func(*testing.T) []arrival {
			var out []arrival
			for _, m := range srv.Messages() {
				out = append(out, arrival{m.Attributes[pubsub.AttrID], m.OrderingKey})
			}
			return out
		},
	}
}

// awsCases share one moto server: the sqs sink sends to a FIFO queue, the
// sns sink publishes to a FIFO topic with a FIFO queue subscribed (raw
// delivery). FIFO keeps a message group's order, and the sinks make the
// event key the group. moto serves each request slowly (about a second per
// batch of ten on a loaded machine), so both queues are read from the
// start, in the background, while the relay sends.
func awsCases(t *testing.T) (sqs, sns fanoutSink) {
	endpoint := awstest.Server(t)
	sqsClient, snsClient := awstest.SQS(endpoint), awstest.SNS(endpoint)
	fifo := map[string]string{"FifoQueue": "true"}
	queue := awstest.CreateQueue(t, sqsClient, awstest.QueueName(".fifo"), fifo)
	name := awstest.QueueName(".fifo")
	topic := awstest.CreateTopic(t, snsClient, name, map[string]string{"FifoTopic": "true"})
	subscribed := awstest.CreateQueue(t, sqsClient, name, fifo)
	awstest.SubscribeQueue(t, snsClient, sqsClient, topic, subscribed)
	entry := func(typ string) string {
		return fmt.Sprintf("type: %s, region: %s, endpoint: %q, access_key_id: %s, secret_access_key: %s",
			typ, awstest.Region, endpoint, awstest.AccessKeyID, awstest.SecretAccessKey)
	}
	return fanoutSink{name: "sqs", entry: entry("sqs"), destination: queue, read: readQueue(t, sqsClient, queue), oneKey: true},
		fanoutSink{name: "sns", entry: entry("sns"), destination: topic, read: readQueue(t, sqsClient, subscribed), oneKey: true}
}

// readQueue receives from the queue at url in the background until the
// test ends, deleting what it received (a FIFO queue hands out a group's
// next message only then), and returns a reader of what arrived so far.
func readQueue(t *testing.T, client *awssqs.Client, url string) func(t *testing.T) []arrival {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu   sync.Mutex
		got  []arrival
		fail error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(url),
				MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 300, MessageAttributeNames: []string{"All"}})
			if err == nil && len(out.Messages) > 0 {
				del := make([]sqstypes.DeleteMessageBatchRequestEntry, len(out.Messages))
				mu.Lock()
				for i, m := range out.Messages {
					got = append(got, arrival{aws.ToString(m.MessageAttributes["herald.id"].StringValue),
						aws.ToString(m.MessageAttributes["herald.key"].StringValue)})
					del[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
				}
				mu.Unlock()
				var res *awssqs.DeleteMessageBatchOutput
				if res, err = client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del}); err == nil && len(res.Failed) > 0 {
					err = fmt.Errorf("%d entries not deleted", len(res.Failed))
				}
			}
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				fail = fmt.Errorf("reading queue %s: %w", url, err)
				mu.Unlock()
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func(t *testing.T) []arrival {
		mu.Lock()
		defer mu.Unlock()
		if fail != nil {
			t.Fatal(fail)
		}
		return append([]arrival(nil), got...)
	}
}

func kafkaCase(t *testing.T) fanoutSink {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	if err := cluster.CreateTopic("fanout.paid", 3, nil); err != nil {
		t.Fatal(err)
	}
	addr := cluster.ListenAddrs()[0]
	return fanoutSink{
		name:  "kafka",
		entry: fmt.Sprintf("type: kafka, brokers: [%q]", addr),
		read: func(t *testing.T) []arrival {
			var out []arrival
			for _, m := range readKafka(t, addr, "fanout.paid") {
				var id string
				for _, h := range m.Headers {
					if h.Key == kafka.HeaderID {
						id = string(h.Value)
					}
				}
				out = append(out, arrival{id, string(m.Key)})
			}
			return out
		},
	}
}

// readKafka reads every record of topic, partition after partition (a
// key's records share a partition, so a key's order is kept).
func readKafka(t *testing.T, addr, topic string) []kafkago.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dialer := &kafkago.Dialer{Timeout: 10 * time.Second}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dialling kfake: %v", err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("reading %s's partitions: %v", topic, err)
	}
	var out []kafkago.Message
	for _, part := range parts {
		pc, err := dialer.DialLeader(ctx, "tcp", addr, topic, part.ID)
		if err != nil {
			t.Fatalf("dialling partition %d's leader: %v", part.ID, err)
		}
		last, err := pc.ReadLastOffset()
		if err != nil {
			t.Fatalf("reading partition %d's last offset: %v", part.ID, err)
		}
		for offset := int64(0); offset < last; {
			if _, err := pc.Seek(offset, kafkago.SeekAbsolute); err != nil {
				t.Fatalf("seeking partition %d: %v", part.ID, err)
			}
			_ = pc.SetReadDeadline(time.Now().Add(10 * time.Second))
			batch := pc.ReadBatch(1, 10<<20)
			for {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				out = append(out, m)
				offset = m.Offset + 1
			}
			if err := batch.Close(); err != nil && offset < last {
				t.Fatalf("reading partition %d at offset %d: %v", part.ID, offset, err)
			}
		}
		pc.Close()
	}
	return out
}

func natsCase(t *testing.T) fanoutSink {
	natsURL := natstest.URL(t)
	stream := natstest.Stream(t, natstest.Connect(t, natsURL))
	return fanoutSink{
		name:        "nats",
		entry:       fmt.Sprintf("type: nats, url: %q", natsURL),
		destination: stream.Subject("{{.Topic}}"),
		read: func(t *testing.T) []arrival {
			var out []arrival
			for _, m := range stream.Messages(t) {
				out = append(out, arrival{m.Header.Get(natssink.HeaderMsgID), m.Header.Get(natssink.HeaderKey)})
			}
			return out
		},
	}
}

func webhookCase(t *testing.T) fanoutSink {
	var (
		mu  sync.Mutex
		got []arrival
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env struct{ ID, Key string }
		if err := json.NewDecoder(r.Body).Decode(&env); err != nil || env.ID != r.Header.Get("webhook-id") {
			http.Error(w, "not a Herald envelope", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, arrival{env.ID, env.Key})
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	return fanoutSink{
		name:  "webhook",
		entry: fmt.Sprintf("type: webhook, url: %q, secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", hook.URL),
		read: func(*testing.T) []arrival {
			mu.Lock()
			defer mu.Unlock()
			return append([]arrival(nil), got...)
		},
	}
}

func emailCase(t *testing.T) fanoutSink {
	smtpd, err := smtptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smtpd.Close() })
	templates := t.TempDir()
	if err := os.WriteFile(filepath.Join(templates, "paid.txt"), []byte("Order {{.n}} is paid.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return fanoutSink{
		name: "email",
		entry: fmt.Sprintf("type: email, smtp: {host: %s, port: %d}, from: shop@example.com, templates_dir: %q, template: paid, subject: Paid",
			smtpd.Host(), smtpd.Port(), templates),
		read: func(*testing.T) []arrival {
			var out []arrival
			for _, m := range smtpd.Messages() {
				out = append(out, arrival{m.Header("X-Herald-Event-Id"), m.Header("X-Herald-Key")})
			}
			return out
		},
	}
}

func redisCase(t *testing.T) fanoutSink {
	redisURL := redistest.URL(t)
	client := redistest.Client(t, redisURL)
	stream := redistest.Prefix(t, client) + "fanout"
	return fanoutSink{
		name:        "redis",
		entry:       fmt.Sprintf("type: redis, url: %q", redisURL),
		destination: stream,
		read: func(t *testing.T) []arrival {
			var out []arrival
			for _, m := range redistest.Entries(t, client, stream) {
				id, _ := m.Values["id"].(string)
				key, _ := m.Values["key"].(string)
				out = append(out, arrival{id, key})
			}
			return out
		},
	}
}

// rabbitmqCase publishes through the default exchange to a queue of the
// test's own; its consumer takes messages off the queue and keeps them.
func rabbitmqCase(t *testing.T) fanoutSink {
	rabbitURL := rabbitmqtest.URL(t)
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Fatalf("connecting to RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := "herald_test." + uuid.NewString()[:8]
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declaring queue %s: %v", queue, err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	var got []arrival
	return fanoutSink{
		name:        "rabbitmq",
		entry:       fmt.Sprintf("type: rabbitmq, url: %q", rabbitURL),
		destination: queue,
		read: func(t *testing.T) []arrival {
			for {
				d, ok, err := ch.Get(queue, true)
				if err != nil {
					t.Fatalf("reading queue %s: %v", queue, err)
				}
				if !ok {
					return append([]arrival(nil), got...)
				}
				key, _ := d.Headers["herald-key"].(string)
				got = append(got, arrival{d.MessageId, key})
			}
		},
	}
}

// mqttCase subscribes to broker with QoS 1 and a persistent session (clean
// start false, a session expiry), connecting again after the broker
// restarts: what the broker accepted before it stopped is kept in its store
// and handed to the subscriber after the restart.
func mqttCase(t *testing.T, broker *mosquitto) fanoutSink {
	topic := mqtttest.Prefix() + "/fanout"
	clientID := "herald-test-fanout-" + uuid.NewString()[:8]
	var (
		mu     sync.Mutex
		got    []arrival
		client *paho.Client
	)
	receive := func(pr paho.PublishReceived) (bool, error) {
		var a arrival
		if props := pr.Packet.Properties; props != nil {
			a.id, a.key = props.User.Get(mqtt.PropertyID), props.User.Get(mqtt.PropertyKey)
		}
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
		return true, nil
	}
	connect := func(t *testing.T, first bool) {
		t.Helper()
		nc, err := net.DialTimeout("tcp", broker.addr, 10*time.Second)
		if err != nil {
			t.Fatalf("subscriber dialling the private Mosquitto: %v", err)
		}
		client = paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: nc,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){receive}})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Clean start stays false even on the first connection (the
		// client id is new): Mosquitto 2.0.11 does not restore from its
		// store the session of a client that connected with clean start.
		expiry := uint32(600)
		ack, err := client.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
		if err != nil {
			t.Fatalf("subscriber connecting to the private Mosquitto: %v", err)
		}
		if first {
			if _, err := client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
				t.Fatalf("subscribing to %s: %v", topic, err)
			}
		} else if !ack.SessionPresent {
			t.Fatalf("Mosquitto lost the subscriber's session across its restart; its log: %s", broker.logs)
		}
	}
	connect(t, true)
	// Mosquitto 2.0.11 saves no session of a client still connected when it
	// is stopped, so the subscriber leaves first (its session stays, for
	// the session expiry) and the broker queues what arrives meanwhile.
	broker.beforeStop = func(t *testing.T) {
		if err := client.Disconnect(&paho.Disconnect{}); err != nil {
			t.Fatalf("subscriber disconnecting: %v", err)
		}
		// "disconnected" when Mosquitto read the DISCONNECT packet, "closed
		// its connection" when the socket closed first: either way the
		// client has left and its session stays.
		broker.waitLog(t, "Client "+clientID+" disconnected", "Client "+clientID+" closed its connection")
	}
	broker.afterStart = func(t *testing.T) { connect(t, false) }
	t.Cleanup(func() { _ = client.Disconnect(&paho.Disconnect{}) })
	return fanoutSink{
		name:        "mqtt",
		entry:       fmt.Sprintf("type: mqtt, url: %q", broker.url()),
		destination: topic,
		read: func(*testing.T) []arrival {
			mu.Lock()
			defer mu.Unlock()
			return append([]arrival(nil), got...)
		},
	}
}

// mosquitto is a Mosquitto of the test's own on a fixed free port, with
// persistence, so that stopping it (SIGTERM: it writes its store on the way
// out) and starting it again keeps sessions and their queued messages.
type mosquitto struct {
	bin, conf, addr string
	logs            *lockedBuffer
	cmd             *exec.Cmd
	exited          chan struct{}
	// beforeStop and afterStart run around a restart (the subscriber
	// leaving and connecting again).
	beforeStop, afterStart func(t *testing.T)
}

func (m *mosquitto) url() string { return "mqtt://" + m.addr }

// startMosquitto writes a configuration in a temporary directory and
// starts Mosquitto on a free port; it is killed in cleanup.
func startMosquitto(t *testing.T) *mosquitto {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
		if _, err := os.Stat(bin); err != nil {
			msg := "mosquitto is not installed (apt-get install -y mosquitto)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	// Started as root, Mosquitto drops to the user named in its
	// configuration, who must be able to write the store directory.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "mosquitto.conf")
	body := fmt.Sprintf(`listener %s 127.0.0.1
allow_anonymous true
persistence true
persistence_location %s/
max_queued_messages 0
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
log_type notice
log_type information
`, port, dir)
	if os.Geteuid() == 0 {
		body = "user root\n" + body
	}
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &mosquitto{bin: bin, conf: conf, addr: addr, logs: &lockedBuffer{}}
	m.start(t)
	t.Cleanup(func() {
		if m.cmd != nil {
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	})
	return m
}

// start runs Mosquitto and waits until it accepts connections.
func (m *mosquitto) start(t *testing.T) {
	t.Helper()
	m.cmd = exec.Command(m.bin, "-c", m.conf)
	m.cmd.Stderr = m.logs
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("starting mosquitto: %v", err)
	}
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(m.cmd, m.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", m.addr, time.Second)
		if err == nil {
			c.Close()
			if m.afterStart != nil {
				m.afterStart(t)
			}
			return
		}
		select {
		case <-m.exited:
			t.Fatalf("mosquitto exited at start: %s", m.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto did not listen on %s: %v; its log: %s", m.addr, err, m.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for Mosquitto to exit.
func (m *mosquitto) stop(t *testing.T) {
	t.Helper()
	if m.beforeStop != nil {
		m.beforeStop(t)
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("mosquitto did not exit within 30s of SIGTERM; its log: %s", m.logs)
	}
	m.cmd = nil
}

// waitLog waits for Mosquitto to log a line containing one of lines.
func (m *mosquitto) waitLog(t *testing.T, lines ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs := m.logs.String()
		for _, s := range lines {
			if strings.Contains(logs, s) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto never logged any of %q; its log: %s", lines, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedBuffer is an io.Writer a process writes to while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
