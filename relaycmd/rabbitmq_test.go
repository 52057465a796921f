package relaycmd

import (
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/rabbitmqtest"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// rabbitChannel returns a channel of the test's own on the shared broker.
func rabbitChannel(t *testing.T, u string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatalf("connecting to RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// bindQueue declares exchange (a topic exchange deleted with its last
// binding) and a queue of the test's own bound to it with pattern; the
// queue is deleted in cleanup, which deletes the exchange too.
func bindQueue(t *testing.T, ch *amqp.Channel, exchange, pattern string) string {
	t.Helper()
	q := "herald_test." + uuid.NewString()[:8]
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	// The exchange appears with its way to q already in place: declared
	// first and bound after, a relay that publishes in between gets the
	// message back unroutable (a dead letter, rightly). Its alternate
	// exchange takes what no binding routes, so the queue gets every
	// message from the moment the exchange exists.
	alternate := exchange + ".alternate"
	if err := ch.ExchangeDeclare(alternate, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatalf("declaring exchange %s: %v", alternate, err)
	}
	if err := ch.QueueBind(q, "", alternate, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, amqp.Table{"alternate-exchange": alternate}); err != nil {
		t.Fatalf("declaring exchange %s: %v", exchange, err)
	}
	if err := ch.QueueBind(q, pattern, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	return q
}

// waitDelivery polls queue q for one message.
func waitDelivery(t *testing.T, ch *amqp.Channel, q string, what func() string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing arrived in queue %s:\n%s", q, what())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRunRabbitMQ runs the binary with a RabbitMQ sink whose exchange does
// not exist yet: /readyz names the exchange, the event waits with the sink
// paused (no attempt spent), and once the exchange and a bound queue exist
// the event arrives with its id as message_id. The broker password is never
// printed.
func TestRunRabbitMQ(t *testing.T) {
	t.Parallel()
	rabbitURL := rabbitmqtest.URL(t)
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ch := rabbitChannel(t, rabbitURL)
	exchange := "herald_test_x." + uuid.NewString()[:8]
	config := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s, sink_pause: {initial: 100ms, max: 300ms}}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - {name: rabbit, type: rabbitmq, url: %q, exchange: %q}
routes:
  - {topics: ["orders.*"], sinks: [{name: rabbit, destination: "{{.Topic}}"}]}
`, url, tables.Schema, rabbitURL, exchange))
	if r := runRelay(t, nil, "migrate", "up", "--database-url", url, "--schema", tables.Schema); r.code != 0 {
		t.Fatalf("migrate:\n%s", r)
	}
	p := start(t, nil, "run", "--config", config)
	base := adminBase(t, p)
	r := waitReadyz(t, p, base, func(r readiness) bool { return r.Sinks["rabbit"] != "" })
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.Sinks["rabbit"], exchange) || !strings.Contains(r.Sinks["rabbit"], "404") {
		t.Fatalf("/readyz with the exchange missing: %d %s", r.code, r.body)
	}
	id := insertRaw(t, pool, tables, "topic, key, payload", "'orders.created', 'o-1', '{\"total\":42}'")
	deadline := time.Now().Add(time.Minute)
	for {
		s := runRelay(t, nil, "status", "--database-url", url, "--schema", tables.Schema)
		if s.code != 0 {
			t.Fatalf("status:\n%s", s)
		}
		if regexp.MustCompile(`(?m)^\S+\s+\d+\s+\S+\s+\S+\s+yes\s+rabbit$`).MatchString(s.stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay status never showed rabbit paused:\n%s\nrelay output:\n%s", s, p.output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	q := bindQueue(t, ch, exchange, "orders.#")
	waitReadyz(t, p, base, func(r readiness) bool { return r.code == http.StatusOK && r.Sinks["rabbit"] == "ok" })
	d := waitDelivery(t, ch, q, p.output)
	if d.MessageId != id || d.RoutingKey != "orders.created" || string(d.Body) != `{"total": 42}` && string(d.Body) != `{"total":42}` ||
		d.Headers["herald-key"] != "o-1" || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("delivered message: id %s key %s body %s headers %v mode %d; want id %s", d.MessageId, d.RoutingKey, d.Body, d.Headers, d.DeliveryMode, id)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), "guest:guest@") {
		t.Fatalf("the relay printed the broker password:\n%s", p.output())
	}
}

// TestREADMERabbitMQExample: docs/sinks.md's RabbitMQ example loads as written
// (with RABBITMQ_URL pointing at the local broker) and its sink, through its
// route's destination, delivers to a queue bound to the example's exchange.
func TestREADMERabbitMQExample(t *testing.T) {
	t.Parallel()
	rabbitURL := rabbitmqtest.URL(t)
	text := doc(t, "sinks.md")
	at := strings.Index(text, "\n## RabbitMQ (`type: rabbitmq`")
	if at < 0 {
		t.Fatal("docs/sinks.md: no RabbitMQ section")
	}
	section := text[at:]
	start := strings.Index(section, "```yaml\n")
	end := strings.Index(section[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("docs/sinks.md: no YAML example in the RabbitMQ section")
	}
	example := "database: {url: postgres://postgres@127.0.0.1:5432/postgres}\n" + section[start+8:start+8+end]
	env := map[string]string{"RABBITMQ_URL": rabbitURL}
	f, err := relayconfig.Parse("README RabbitMQ example", []byte(example), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("docs/sinks.md's RabbitMQ example does not load: %v", err)
	}
	exchange := regexp.MustCompile(`(?m)^\s+exchange: (\S+)`).FindStringSubmatch(example)
	if exchange == nil {
		t.Fatal("docs/sinks.md: the RabbitMQ example names no exchange")
	}
	ch := rabbitChannel(t, rabbitURL)
	q := bindQueue(t, ch, exchange[1], "orders.#")
	b, err := f.Build(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(t.Context())
	target := b.Config.Routes[0].Targets[0]
	var dest strings.Builder
	if err := target.Destination.Execute(&dest, relay.DestinationData{Topic: "orders.created"}); err != nil {
		t.Fatal(err)
	}
	e := sinktest.Event(dest.String(), "o-1", []byte(`{"total":42}`))
	if errs := target.Sink.Publish(t.Context(), []sinks.Event{e}); errs[0] != nil {
		t.Fatalf("publishing through docs/sinks.md's sink: %v", errs[0])
	}
	if d := waitDelivery(t, ch, q, func() string { return "" }); d.MessageId != e.ID || d.RoutingKey != "orders.created" {
		t.Fatalf("got %s with routing key %s, want %s with orders.created", d.MessageId, d.RoutingKey, e.ID)
	}
}
