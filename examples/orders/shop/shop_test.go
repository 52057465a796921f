package shop_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

type testBundle struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	writer *outbox.Writer
	svc    *shop.Service
	client *shop.Client
}

// setup migrates Herald's tables and the orders table into a fresh schema
// and serves the service over a real HTTP server.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	if err := shop.Migrate(ctx, pool, tables.Schema); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.Config{Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	svc := newService(t, pool, tables.Schema, w, nil)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &testBundle{pool: pool, tables: tables, writer: w, svc: svc, client: &shop.Client{BaseURL: srv.URL}}
}

func newService(t *testing.T, pool *pgxpool.Pool, schema string, w *outbox.Writer, headers map[string]string) *shop.Service {
	t.Helper()
	svc, err := shop.New(pool, shop.Config{Schema: schema, Outbox: w, EventHeaders: headers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func sampleOrder() shop.NewOrder {
	return shop.NewOrder{
		Customer: shop.Customer{Name: "Ada Lovelace", Email: "ada@example.com"},
		Items: []shop.Item{
			{Name: "Analytical engine", Qty: 1, Price: "1999.5"},
			{Name: "Punch cards", Qty: 3, Price: "0.25"},
		},
	}
}

type storedEvent struct {
	Topic, Key string
	Payload    map[string]any
}

func (b *testBundle) events(t *testing.T) []storedEvent {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT topic, key, payload::text FROM "+b.tables.Outbox()+" ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []storedEvent
	for rows.Next() {
		var e storedEvent
		var payload string
		if err := rows.Scan(&e.Topic, &e.Key, &payload); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(payload), &e.Payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCreateAndPay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	o, err := b.client.Create(ctx, sampleOrder())
	if err != nil {
		t.Fatal(err)
	}
	if o.Status != shop.StatusCreated || o.Total != "2000.25" || o.Currency != "EUR" || o.Items[0].Price != "1999.50" {
		t.Fatalf("created order = %+v", o)
	}
	paid, err := b.client.Pay(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if paid.Status != shop.StatusPaid || paid.PaidAt == nil {
		t.Fatalf("paid order = %+v", paid)
	}

	evs := b.events(t)
	if len(evs) != 3 {
		t.Fatalf("got %d events, want 3: %+v", len(evs), evs)
	}
	for i, topic := range []string{shop.TopicOrderCreated, shop.TopicOrderPaid, shop.TopicEmailPaid} {
		if evs[i].Topic != topic || evs[i].Key != o.ID {
			t.Fatalf("event %d = %s key %s, want %s key %s", i, evs[i].Topic, evs[i].Key, topic, o.ID)
		}
	}
	// The email payload is what the order_paid templates and to_field read.
	mail := evs[2].Payload
	customer, _ := mail["customer"].(map[string]any)
	items, _ := mail["items"].([]any)
	if customer["email"] != "ada@example.com" || customer["name"] != "Ada Lovelace" || mail["order_id"] != o.ID ||
		mail["total"] != 2000.25 || mail["currency"] != "EUR" || mail["template"] != "order_paid" || len(items) != 2 {
		t.Fatalf("email.order_paid payload = %v", mail)
	}
	item, _ := items[1].(map[string]any)
	if item["name"] != "Punch cards" || item["qty"] != 3.0 || item["price"] != 0.25 {
		t.Fatalf("email item = %v", item)
	}

	// Paying twice changes nothing and enqueues nothing.
	if _, err := b.client.Pay(ctx, o.ID); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("second payment: %v, want 409", err)
	}
	if n := len(b.events(t)); n != 3 {
		t.Fatalf("%d events after the second payment, want 3", n)
	}
}

func TestHTTPErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		order  func(*shop.NewOrder)
		substr string
	}{
		{"no name", func(n *shop.NewOrder) { n.Customer.Name = " " }, "customer.name: required"},
		{"bad email", func(n *shop.NewOrder) { n.Customer.Email = "ada" }, "customer.email"},
		{"no items", func(n *shop.NewOrder) { n.Items = nil }, "items: an order needs at least one item"},
		{"zero qty", func(n *shop.NewOrder) { n.Items[1].Qty = 0 }, "items[1].qty"},
		{"bad price", func(n *shop.NewOrder) { n.Items[0].Price = "1.234" }, "items[0].price"},
		{"negative price", func(n *shop.NewOrder) { n.Items[0].Price = "-1" }, "items[0].price"},
		{"bad currency", func(n *shop.NewOrder) { n.Currency = "euro" }, "currency"},
	}
	for _, c := range cases {
		n := sampleOrder()
		c.order(&n)
		_, err := b.client.Create(ctx, n)
		if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), c.substr) {
			t.Errorf("%s: %v, want 400 naming %q", c.name, err, c.substr)
		}
	}
	for _, id := range []string{"0190a6a0-0000-7000-8000-000000000000", "not-a-uuid"} {
		if _, err := b.client.Pay(ctx, id); err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("paying %s: %v, want 404", id, err)
		}
	}
	resp, err := http.Post(b.client.BaseURL+"/orders", "application/json", strings.NewReader(`{"customer":{},"bogus":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown field: status %d, want 400", resp.StatusCode)
	}
	resp, err = http.Get(b.client.BaseURL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: status %d", resp.StatusCode)
	}
	if n := len(b.events(t)); n != 0 {
		t.Fatalf("refused requests enqueued %d events", n)
	}
}

// TestPayIsAtomic makes the enqueue fail after the status update, once by a
// header the outbox refuses and once by an insert PostgreSQL refuses: the
// order must stay created and no event may exist.
func TestPayIsAtomic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	missingTable, err := outbox.NewWriter(outbox.Config{Tables: migrations.Tables{Schema: b.tables.Schema, Table: "no_such_outbox"}})
	if err != nil {
		t.Fatal(err)
	}
	broken := map[string]*shop.Service{
		"invalid header": newService(t, b.pool, b.tables.Schema, b.writer, map[string]string{"": "no name"}),
		"missing table":  newService(t, b.pool, b.tables.Schema, missingTable, nil),
	}
	for name, svc := range broken {
		o, err := b.svc.Create(ctx, sampleOrder())
		if err != nil {
			t.Fatal(err)
		}
		before := len(b.events(t))
		_, err = svc.Pay(ctx, o.ID)
		var invalid *outbox.ValidationError
		switch {
		case err == nil:
			t.Fatalf("%s: payment succeeded", name)
		case name == "invalid header" && !errors.As(err, &invalid):
			t.Fatalf("%s: %v, want an outbox.ValidationError", name, err)
		}
		got, err := b.svc.Get(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != shop.StatusCreated || got.PaidAt != nil {
			t.Fatalf("%s: order is %s after the failed payment, want created", name, got.Status)
		}
		if after := len(b.events(t)); after != before {
			t.Fatalf("%s: %d events after the failed payment, %d before", name, after, before)
		}
		// The order can still be paid once the outbox works.
		if _, err := b.svc.Pay(ctx, o.ID); err != nil {
			t.Fatalf("%s: paying with a working outbox: %v", name, err)
		}
	}
	// Creating fails the same way: no order row, no event.
	before := len(b.events(t))
	if _, err := broken["missing table"].Create(ctx, sampleOrder()); err == nil {
		t.Fatal("create with a missing outbox table succeeded")
	}
	var orders int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM "`+b.tables.Schema+`".orders`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if orders != 2 || len(b.events(t)) != before {
		t.Fatalf("after a failed create: %d orders (want 2), %d events (want %d)", orders, len(b.events(t)), before)
	}
}

// TestConcurrentPayments pays one order from many requests at once: the row
// lock lets exactly one through.
func TestConcurrentPayments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	o, err := b.client.Create(ctx, sampleOrder())
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok, conf int
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.svc.Pay(ctx, o.ID)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, shop.ErrAlreadyPaid):
				conf++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok != 1 || conf != 7 {
		t.Fatalf("%d payments succeeded and %d were refused, want 1 and 7", ok, conf)
	}
	paid := 0
	for _, e := range b.events(t) {
		if e.Topic == shop.TopicOrderPaid {
			paid++
		}
	}
	if paid != 1 {
		t.Fatalf("%d orders.paid events, want 1", paid)
	}
}

func TestOnCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var commits []shop.Commit
	svc, err := shop.New(b.pool, shop.Config{Schema: b.tables.Schema, Outbox: b.writer, OnCommit: func(c shop.Commit) { commits = append(commits, c) }})
	if err != nil {
		t.Fatal(err)
	}
	o, err := svc.Create(ctx, sampleOrder())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Pay(ctx, o.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Pay(ctx, o.ID); !errors.Is(err, shop.ErrAlreadyPaid) {
		t.Fatalf("second payment: %v", err)
	}
	if len(commits) != 2 || len(commits[0].Events) != 1 || len(commits[1].Events) != 2 ||
		commits[1].Events[0].Topic != shop.TopicOrderPaid || commits[1].OrderID != o.ID || commits[1].At.IsZero() {
		t.Fatalf("commits = %+v", commits)
	}
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := pgtest.UniqueName("orders_t")
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema) })
	for range 2 {
		if err := shop.Migrate(context.Background(), pool, schema); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := shop.New(nil, shop.Config{}); err == nil || !strings.Contains(err.Error(), "Outbox") {
		t.Fatalf("no outbox: %v", err)
	}
	w, _ := outbox.NewWriter(outbox.Config{})
	if _, err := shop.New(nil, shop.Config{Outbox: w, Currency: "eur"}); err == nil || !strings.Contains(err.Error(), "Currency") {
		t.Fatalf("bad currency: %v", err)
	}
}
