package shop_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// TestCreateAndPayOnMySQL runs the service on MariaDB/MySQL: the same
// logic as on PostgreSQL, the orders and their events in one *sql.Tx.
func TestCreateAndPayOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, tables := mysqltest.Migrated(t)
	// Twice: every statement is IF NOT EXISTS.
	for range 2 {
		if err := shop.MigrateMySQL(ctx, db, ""); err != nil {
			t.Fatal(err)
		}
	}
	w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	var commits []shop.Commit
	svc, err := shop.NewMySQL(db, shop.Config{Outbox: w, Logger: slog.New(slog.DiscardHandler),
		OnCommit: func(c shop.Commit) { commits = append(commits, c) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	client := &shop.Client{BaseURL: srv.URL}

	o, err := client.Create(ctx, sampleOrder())
	if err != nil {
		t.Fatal(err)
	}
	if o.Status != shop.StatusCreated || o.Total != "2000.25" || o.Currency != "EUR" || o.Items[0].Price != "1999.50" || o.CreatedAt.IsZero() {
		t.Fatalf("created order = %+v", o)
	}
	paid, err := client.Pay(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if paid.Status != shop.StatusPaid || paid.PaidAt == nil || paid.PaidAt.Before(o.CreatedAt) {
		t.Fatalf("paid order = %+v", paid)
	}
	got, err := svc.Get(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != shop.StatusPaid || got.Customer != o.Customer || !got.CreatedAt.Equal(o.CreatedAt) {
		t.Fatalf("read back %+v, want %+v paid", got, o)
	}
	if _, err := client.Pay(ctx, o.ID); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("second payment: %v, want 409", err)
	}
	if _, err := svc.Pay(ctx, "0190a0b4-0000-7000-8000-000000000000"); !errors.Is(err, shop.ErrNotFound) {
		t.Fatalf("paying an unknown order: %v, want ErrNotFound", err)
	}

	rows, err := db.QueryContext(ctx, "SELECT id, topic, `key`, payload FROM "+tables.Outbox()+" ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids, topics []string
	for rows.Next() {
		var id, topic, key, payload string
		if err := rows.Scan(&id, &topic, &key, &payload); err != nil {
			t.Fatal(err)
		}
		var p struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal([]byte(payload), &p); err != nil || key != o.ID || p.OrderID != o.ID {
			t.Fatalf("event %s %s: key %s, payload %s (%v), want order %s", id, topic, key, payload, err, o.ID)
		}
		ids, topics = append(ids, id), append(topics, topic)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{shop.TopicOrderCreated, shop.TopicOrderPaid, shop.TopicEmailPaid}; strings.Join(topics, ",") != strings.Join(want, ",") {
		t.Fatalf("outbox topics %v, want %v", topics, want)
	}
	if len(commits) != 2 || len(commits[1].Events) != 2 || commits[0].Events[0].ID.String() != ids[0] || commits[1].Events[1].ID.String() != ids[2] {
		t.Fatalf("OnCommit saw %+v, the outbox holds %v", commits, ids)
	}
}

// TestPayIsAtomicOnMySQL: when the outbox write fails, the payment rolls
// back with it.
func TestPayIsAtomicOnMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, _ := mysqltest.Migrated(t)
	if err := shop.MigrateMySQL(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	newSvc := func(table string) *shop.Service {
		w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL, Tables: migrations.Tables{Table: table}})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := shop.NewMySQL(db, shop.Config{Outbox: w, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	o, err := newSvc("").Create(ctx, sampleOrder())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newSvc("no_such_outbox").Pay(ctx, o.ID); err == nil || !strings.Contains(err.Error(), "enqueueing events") {
		t.Fatalf("paying with no outbox table: %v, want an enqueue error", err)
	}
	got, err := newSvc("").Get(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != shop.StatusCreated || got.PaidAt != nil {
		t.Fatalf("after the failed payment: %+v, want it unpaid", got)
	}
}
