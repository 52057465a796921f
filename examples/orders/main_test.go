package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
)

func TestCreateStream(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	name, prefix := "ORDERS_TEST_"+id, "orders_test."+id
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	for range 2 { // creating it again is fine
		if err := createStream(context.Background(), url, name, prefix); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if subj := s.CachedInfo().Config.Subjects; len(subj) != 1 || subj[0] != prefix+".>" {
		t.Fatalf("stream subjects = %v", subj)
	}
	// Another stream on the same subjects is refused with the flag's name.
	if err := createStream(context.Background(), url, name+"_2", prefix); err == nil || !strings.Contains(err.Error(), "-nats-stream") {
		t.Fatalf("overlapping stream: %v", err)
	}
}

func TestServeAndHealthcheck(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "HERALD_SCHEMA": tables.Schema, "ORDERS_SCHEMA": tables.Schema}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-listen", "127.0.0.1:0"}, lookup, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("service stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("service not ready after 30s")
	}
	if err := run(context.Background(), []string{"-listen", addr, "healthcheck"}, lookup, io.Discard, nil); err != nil {
		t.Fatalf("healthcheck of a running service: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("service: %v", err)
	}
	// Stopped: the health check fails.
	if err := run(context.Background(), []string{"-listen", addr, "healthcheck"}, lookup, io.Discard, nil); err == nil {
		t.Fatal("healthcheck of a stopped service succeeded")
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	none := func(string) (string, bool) { return "", false }
	if err := run(context.Background(), []string{"frobnicate"}, none, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("unknown command: %v", err)
	}
	// No outbox in the schema: the service waits, then gives up when ctx ends.
	schema := pgtest.UniqueName("orders_t")
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := run(ctx, []string{"-database-url", pgtest.URL(t), "-outbox-schema", schema, "-listen", "127.0.0.1:0"}, none, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "waiting for the outbox") {
		t.Fatalf("unmigrated outbox: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := run(context.Background(), []string{"-listen", addr, "healthcheck"}, none, io.Discard, nil); err == nil {
		t.Fatal("healthcheck with nothing listening succeeded")
	}
}

// TestServeOnMySQL serves the shop on MariaDB/MySQL (a mysql://
// DATABASE_URL, the outbox migrated by Herald's MySQL migrator): an order
// placed over HTTP commits with its event.
func TestServeOnMySQL(t *testing.T) {
	t.Parallel()
	db, url := mysqltest.Database(t)
	m, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-listen", "127.0.0.1:0"}, lookup, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("service stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("service not ready after 30s")
	}
	client := &shop.Client{BaseURL: "http://" + addr}
	o, err := client.Create(context.Background(), shop.NewOrder{
		Customer: shop.Customer{Name: "Ada Lovelace", Email: "ada@example.com"},
		Items:    []shop.Item{{Name: "Analytical engine", Qty: 1, Price: "1999.5"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var topic, key, headers string
	if err := db.QueryRowContext(context.Background(), "SELECT topic, `key`, headers FROM outbox").Scan(&topic, &key, &headers); err != nil {
		t.Fatal(err)
	}
	if topic != shop.TopicOrderCreated || key != o.ID || !strings.Contains(headers, `"x-service"`) {
		t.Fatalf("outbox row: %s %s %s, want %s of order %s with x-service", topic, key, headers, shop.TopicOrderCreated, o.ID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("service: %v", err)
	}
}
