package demo_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/examples/orders/internal/demo"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
)

// checkSummary checks the numbers of a short run of n orders.
func checkSummary(t *testing.T, s *demo.Summary, n int) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatalf("summary does not add up: %v\n%+v", err, s)
	}
	if s.OrdersRequested != n || s.OrdersPaid != n {
		t.Fatalf("orders: %d paid of %d requested, want %d", s.OrdersPaid, s.OrdersRequested, n)
	}
	if s.Events["orders.created"] != n || s.Events["orders.paid"] != n || s.Events["email.order_paid"] != n {
		t.Fatalf("events committed: %v", s.Events)
	}
	want := map[string]int{demo.SinkNATS: 2 * n, demo.SinkWebhook: 2 * n, demo.SinkEmail: n}
	if len(s.Sinks) != len(want) {
		t.Fatalf("sinks: %+v", s.Sinks)
	}
	for _, k := range s.Sinks {
		if k.Routed != want[k.Name] || k.Published != want[k.Name] {
			t.Fatalf("sink %s: routed %d, published %d, want %d", k.Name, k.Routed, k.Published, want[k.Name])
		}
		if k.Latency.P50 <= 0 || k.Latency.P99 < k.Latency.P50 || k.Latency.Max < k.Latency.P99 {
			t.Fatalf("sink %s: latency %+v", k.Name, k.Latency)
		}
	}
	// With RejectEvery 50, orders 17 and 67 of 100 are refused by the webhook.
	if s.DeadLettered != int64(n/50) || s.Replayed != s.DeadLettered || s.WebhookRefused != s.DeadLettered {
		t.Fatalf("dead-lettered %d, replayed %d, refused %d; want %d each", s.DeadLettered, s.Replayed, s.WebhookRefused, n/50)
	}
	if s.WebhookUnavailable == 0 || s.Retried == 0 {
		t.Fatalf("the outage made %d 503 answers and %d retries", s.WebhookUnavailable, s.Retried)
	}
	if s.PendingLeft != 0 || s.DeadLeft != 0 || s.NATSStored != uint64(2*n) {
		t.Fatalf("left: %d pending, %d dead; NATS stream holds %d", s.PendingLeft, s.DeadLeft, s.NATSStored)
	}
}

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// TestShortDemoTwice runs the short demo twice in a row in one schema: the
// first run keeps its schema, the second drops and recreates it, then
// removes it.
func TestShortDemoTwice(t *testing.T) {
	t.Parallel()
	schema := pgtest.UniqueName(demo.DefaultSchema)
	pool := pgtest.Pool(t)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema) })
	for i, keep := range []bool{true, false} {
		var progress bytes.Buffer
		s, err := demo.Run(context.Background(), demo.Options{
			DatabaseURL: pgtest.URL(t), Schema: schema, Short: true, Keep: keep, Progress: &progress, Timeout: time.Minute,
		})
		if err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, progress.String())
		}
		checkSummary(t, s, 100)
		if !strings.Contains(progress.String(), "orders 100/100 paid | nats 200/200") {
			t.Fatalf("run %d: no final progress line:\n%s", i+1, progress.String())
		}
		if got := schemaExists(t, schema); got != keep {
			t.Fatalf("run %d (keep %v): schema exists = %v afterwards", i+1, keep, got)
		}
		if keep {
			var paid int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".orders WHERE status = 'paid'`).Scan(&paid); err != nil {
				t.Fatal(err)
			}
			if paid != 100 {
				t.Fatalf("kept schema holds %d paid orders, want 100", paid)
			}
		}
		var out bytes.Buffer
		s.Print(&out)
		for _, want := range []string{"100 of 100 orders paid", "webhook", "dead-lettered: 2 events   replayed: 2", "p99"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("printed summary lacks %q:\n%s", want, out.String())
			}
		}
	}
}

// TestDemoStartsPostgresWhenNoneAnswers points the demo at a closed port: it
// must call StartPostgres, and use (then stop) what it returns.
func TestDemoStartsPostgresWhenNoneAnswers(t *testing.T) {
	t.Parallel()
	schema := pgtest.UniqueName(demo.DefaultSchema)
	started, stopped := false, false
	var progress bytes.Buffer
	s, err := demo.Run(context.Background(), demo.Options{
		DatabaseURL: "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		StartPostgres: func(context.Context) (string, func(), error) {
			started = true
			return pgtest.URL(t), func() { stopped = true }, nil
		},
		Schema: schema, Orders: 20, Rate: -1, Outage: -1, RejectEvery: 10, Progress: &progress, Timeout: time.Minute,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if !started || !stopped {
		t.Fatalf("StartPostgres called: %v, its stop called: %v", started, stopped)
	}
	if !s.Container || !strings.Contains(progress.String(), "started PostgreSQL in a container") {
		t.Fatalf("the demo did not say it started PostgreSQL:\n%s", progress.String())
	}
	// RejectEvery 10 refuses orders 7 and 17; no outage, so the webhook never
	// answered 503. (A loaded machine may still time a delivery out and
	// retry it: retries are no measure of the outage.)
	if s.OrdersPaid != 20 || s.DeadLettered != 2 || s.Replayed != 2 || s.WebhookUnavailable != 0 {
		t.Fatalf("summary: %+v", s)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestDemoWithoutPostgres(t *testing.T) {
	t.Parallel()
	_, err := demo.Run(context.Background(), demo.Options{
		DatabaseURL: "postgres://postgres:Secret-Pw-9@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		StartPostgres: func(context.Context) (string, func(), error) {
			return "", nil, errors.New("no Docker engine")
		},
	})
	var noDB *demo.NoDatabaseError
	if !errors.As(err, &noDB) {
		t.Fatalf("error %v, want a NoDatabaseError", err)
	}
	msg := err.Error()
	for _, want := range []string{"docker run -d --name herald-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17",
		"pg_ctlcluster", "no Docker engine", "127.0.0.1:1"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "Secret-Pw-9") {
		t.Fatalf("message shows the password:\n%s", msg)
	}
}

func TestDemoOptionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		opts demo.Options
		want string
	}{
		{demo.Options{Schema: "public"}, `schema: "public" must start with "herald_demo"`},
		{demo.Options{Orders: -1}, "orders:"},
		{demo.Options{Outage: 2 * time.Minute}, "outage:"},
		{demo.Options{DatabaseURL: "postgres://h/d?sslmode=bogus"}, "database url:"},
		{demo.Options{Schema: `herald_demo"x`}, "database.schema"},
		{demo.Options{DatabaseURL: "mysql://root@127.0.0.1:3306/a/b"}, `database url: database "a/b": a database name has no slash`},
		{demo.Options{DatabaseURL: "mysql://root@127.0.0.1:3306/test", Schema: "herald_demo`x"}, "must not contain a backtick"},
		{demo.Options{Brokers: []string{"kafka"}}, `sinks: unknown sink "kafka" (known: redis, rabbitmq, mqtt, pubsub, sqs, sns)`},
		{demo.Options{Brokers: []string{"redis", "mqtt", "redis"}}, "sinks: redis named twice"},
	}
	for _, c := range cases {
		_, err := demo.Run(context.Background(), c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", c.opts, err, c.want)
		}
	}
}

func TestSummaryCheck(t *testing.T) {
	t.Parallel()
	good := func() *demo.Summary {
		lat := demo.Latency{P50: demo.Duration(time.Millisecond), P99: demo.Duration(2 * time.Millisecond)}
		return &demo.Summary{OrdersRequested: 2, OrdersPaid: 2, DeadLettered: 1, Replayed: 1, Retried: 3,
			Outage: demo.Duration(time.Second),
			Sinks:  []demo.SinkSummary{{Name: "nats", Routed: 4, Published: 4, Latency: lat}}}
	}
	if err := good().Check(); err != nil {
		t.Fatalf("a good summary fails: %v", err)
	}
	cases := map[string]func(*demo.Summary){
		"orders paid":                  func(s *demo.Summary) { s.OrdersPaid = 1 },
		"3 events published, 4 routed": func(s *demo.Summary) { s.Sinks[0].Published = 3 },
		"latency":                      func(s *demo.Summary) { s.Sinks[0].Latency = demo.Latency{} },
		"dead-lettered":                func(s *demo.Summary) { s.DeadLettered, s.Replayed = 0, 0 },
		"replayed":                     func(s *demo.Summary) { s.Replayed = 0 },
		"pending":                      func(s *demo.Summary) { s.PendingLeft = 1 },
		"no retry":                     func(s *demo.Summary) { s.Retried = 0 },
	}
	for want, breakIt := range cases {
		s := good()
		breakIt(s)
		if err := s.Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Check() = %v", want, err)
		}
	}
}
