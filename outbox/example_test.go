package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// exampleDatabase migrates a schema of its own for an example and returns a
// pool, the tables and a function that drops the schema.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, migrations.Tables, func()) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = pgtest.DefaultURL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	tables := migrations.Tables{Schema: pgtest.UniqueName("herald_example"), Table: "outbox"}
	m, err := migrations.NewMigrator(pool, tables, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.Up(ctx, 0); err != nil {
		log.Fatal(err)
	}
	return pool, tables, func() {
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{tables.Schema}.Sanitize()+" CASCADE"); err != nil {
			log.Print(err)
		}
		pool.Close()
	}
}

// An application enqueues its events in the transaction that makes its
// business change: they commit, or roll back, together.
func Example() {
	ctx := context.Background()
	pool, tables, cleanup := exampleDatabase(ctx)
	defer cleanup()

	// One Writer per outbox table, shared by the whole application.
	writer, err := outbox.NewWriter(outbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	// ... the business change, e.g. INSERT INTO orders ..., goes here ...

	created, err := outbox.JSON("orders.created", map[string]any{"order": 42, "total": "19.90"})
	if err != nil {
		log.Fatal(err)
	}
	created.Key = "order-42" // events of one order are published in order
	ids, err := writer.Enqueue(ctx, tx, created, outbox.Event{
		Topic:   "orders.receipt",
		Key:     "order-42",
		Payload: []byte("Thank you for your order."),
		// Not JSON: stored as bytes in payload_bin.
		ContentType: "text/plain; charset=utf-8",
		Headers:     map[string]string{"tenant": "acme"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var count int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Outbox()).Scan(&count); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(ids), "ids;", count, "rows committed")
	// Output: 2 ids; 2 rows committed
}

// EnqueueSQL does the same through database/sql, with the pgx driver.
func ExampleWriter_EnqueueSQL() {
	ctx := context.Background()
	pool, tables, cleanup := exampleDatabase(ctx)
	defer cleanup()

	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = pgtest.DefaultURL
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	writer, err := outbox.NewWriter(outbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := writer.EnqueueSQL(ctx, tx, outbox.Event{Topic: "users.signed_up", Payload: []byte(`{"user":7}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	var payload string
	if err := pool.QueryRow(ctx, "SELECT payload::text FROM "+tables.Outbox()).Scan(&payload); err != nil {
		log.Fatal(err)
	}
	fmt.Println(payload)
	// Output: {"user":7}
}

// A refused event is reported with its index and field; nothing of the call
// is written.
func ExampleValidationError() {
	ctx := context.Background()
	pool, tables, cleanup := exampleDatabase(ctx)
	defer cleanup()

	writer, err := outbox.NewWriter(outbox.Config{Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = writer.Enqueue(ctx, tx,
		outbox.Event{Topic: "orders.created", Payload: []byte(`{"order":1}`)},
		outbox.Event{Topic: "orders.created", Payload: []byte(`{"order":`)},
	)
	fmt.Println(err)
	var invalid *outbox.ValidationError
	if errors.As(err, &invalid) {
		fmt.Println(invalid.Index, invalid.Field)
	}
	// Output:
	// outbox: events[1].payload: not valid JSON (content type application/json): unexpected end of JSON input at byte 9
	// 1 payload
}

// JSON marshals a value into an event's payload.
func ExampleJSON() {
	e, err := outbox.JSON("orders.created", struct {
		Order int    `json:"order"`
		Total string `json:"total"`
	}{42, "19.90"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(e.Topic, string(e.Payload))
	// Output: orders.created {"order":42,"total":"19.90"}
}
