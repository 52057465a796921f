package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// bundle is what most tests need: a pool, a migrated schema of their own, a
// database/sql handle on the same pool, and a Writer for the schema.
type bundle struct {
	pool   *pgxpool.Pool
	db     *sql.DB
	tables migrations.Tables
	writer *outbox.Writer
}

func setup(t testing.TB, cfg outbox.Config) *bundle {
	t.Helper()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	cfg.Tables = tables
	w, err := outbox.NewWriter(cfg)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	return &bundle{pool: pool, db: db, tables: tables, writer: w}
}

// driver runs Enqueue (pgx) or EnqueueSQL (database/sql) in a transaction of
// its own, then commits it or rolls it back. A failed Enqueue rolls back.
type driver struct {
	name string
	run  func(t *testing.T, b *bundle, commit bool, events ...outbox.Event) ([]uuid.UUID, error)
}

var drivers = []driver{
	{"pgx", func(t *testing.T, b *bundle, commit bool, events ...outbox.Event) ([]uuid.UUID, error) {
		ctx := context.Background()
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		ids, err := b.writer.Enqueue(ctx, tx, events...)
		if err != nil {
			return nil, err
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
		return ids, nil
	}},
	{"database/sql", func(t *testing.T, b *bundle, commit bool, events ...outbox.Event) ([]uuid.UUID, error) {
		ctx := context.Background()
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		ids, err := b.writer.EnqueueSQL(ctx, tx, events...)
		if err != nil {
			return nil, err
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
		return ids, nil
	}},
}

// storedRow is an outbox row as the tests inspect it.
type storedRow struct {
	seq          int64
	id           uuid.UUID
	topic        string
	key          pgtype.Text
	payload      pgtype.Text // the json column's text, as stored
	payloadBin   []byte
	contentType  pgtype.Text
	headers      map[string]string
	createdAt    time.Time
	availableAt  time.Time
	maxAttempts  pgtype.Int4
	status       string
	delayMicros  int64 // available_at - created_at
	payloadIsBin bool  // payload_bin IS NOT NULL
}

func readRows(t testing.TB, b *bundle) []storedRow {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT seq, id, topic, key, payload::text, payload_bin, content_type,
		headers, created_at, available_at, max_attempts, status,
		(extract(epoch FROM available_at - created_at) * 1000000)::bigint, payload_bin IS NOT NULL
		FROM `+b.tables.Outbox()+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storedRow, error) {
		var s storedRow
		var headers []byte
		err := r.Scan(&s.seq, &s.id, &s.topic, &s.key, &s.payload, &s.payloadBin, &s.contentType,
			&headers, &s.createdAt, &s.availableAt, &s.maxAttempts, &s.status, &s.delayMicros, &s.payloadIsBin)
		if err == nil {
			err = json.Unmarshal(headers, &s.headers)
		}
		return s, err
	})
	if err != nil {
		t.Fatalf("reading outbox rows: %v", err)
	}
	return out
}

func TestEnqueueWritesEveryColumn(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{})
			explicit := uuid.MustParse("0190d5a4-7c3e-7d6f-9a1b-2c3d4e5f6a7b")
			at := time.Date(2031, 4, 5, 6, 7, 8, 123456000, time.UTC)
			jsonText := `{ "b" : 1,"a":[1, 2.50, "x"] ,"b":2 }` // spacing, key order and a duplicate key kept
			events := []outbox.Event{
				{Topic: "orders.created", Payload: []byte(jsonText)},
				{ID: explicit, Topic: "orders.paid", Key: "order-42", Payload: []byte(`"é"`),
					Headers: map[string]string{"X-Tenant": "acme", "traceparent": "00-abc-01"}, Delay: 90 * time.Second, MaxAttempts: 3},
				{Topic: "images.resized", Payload: []byte{0, 1, 2, 0xff, 0xfe}, ContentType: "image/png", AvailableAt: at},
				{Topic: "pings"},
				{Topic: "files.empty", ContentType: "application/octet-stream"},
				{Topic: "cloud", Payload: []byte(`{"specversion":"1.0"}`), ContentType: "application/cloudevents+json; charset=utf-8"},
			}
			ids, err := d.run(t, b, true, events...)
			if err != nil {
				t.Fatalf("enqueue: %v", err)
			}
			if len(ids) != len(events) {
				t.Fatalf("got %d ids for %d events", len(ids), len(events))
			}
			if ids[1] != explicit {
				t.Errorf("ids[1] = %s, want the explicit %s", ids[1], explicit)
			}
			for _, i := range []int{0, 2, 3, 4, 5} {
				if ids[i].Version() != 7 {
					t.Errorf("ids[%d] = %s is not a UUIDv7", i, ids[i])
				}
			}
			rows := readRows(t, b)
			if len(rows) != len(events) {
				t.Fatalf("%d rows stored, want %d", len(rows), len(events))
			}
			for i, r := range rows {
				if r.id != ids[i] || r.topic != events[i].Topic || r.status != "pending" {
					t.Errorf("row %d: id %s topic %q status %q; want id %s topic %q pending",
						i, r.id, r.topic, r.status, ids[i], events[i].Topic)
				}
			}

			r := rows[0]
			if r.key.Valid || r.contentType.Valid || r.payloadIsBin || r.maxAttempts.Valid || len(r.headers) != 0 {
				t.Errorf("row 0: key %v content_type %v payload_bin set %v max_attempts %v headers %v; want NULL, NULL, false, NULL, {}",
					r.key, r.contentType, r.payloadIsBin, r.maxAttempts, r.headers)
			}
			if r.payload.String != jsonText {
				t.Errorf("row 0 payload = %q, want it byte for byte: %q", r.payload.String, jsonText)
			}
			if r.delayMicros < 0 || r.delayMicros > (5*time.Second).Microseconds() {
				t.Errorf("row 0: available_at - created_at = %dµs, want the time from the transaction's start to the insert", r.delayMicros)
			}

			r = rows[1]
			if r.key.String != "order-42" || r.payload.String != `"é"` || r.maxAttempts.Int32 != 3 {
				t.Errorf("row 1: key %v payload %v max_attempts %v", r.key, r.payload, r.maxAttempts)
			}
			if r.headers["X-Tenant"] != "acme" || r.headers["traceparent"] != "00-abc-01" || len(r.headers) != 2 {
				t.Errorf("row 1 headers = %v", r.headers)
			}
			if d := time.Duration(r.delayMicros) * time.Microsecond; d < 90*time.Second || d > 95*time.Second {
				t.Errorf("row 1: available_at - created_at = %s, want the insert's time plus 90s (created_at is the transaction's start)", d)
			}

			r = rows[2]
			if !r.payloadIsBin || string(r.payloadBin) != "\x00\x01\x02\xff\xfe" || r.payload.Valid || r.contentType.String != "image/png" {
				t.Errorf("row 2: payload_bin %x payload %v content_type %v", r.payloadBin, r.payload, r.contentType)
			}
			if !r.availableAt.Equal(at) {
				t.Errorf("row 2 available_at = %s, want %s", r.availableAt, at)
			}

			r = rows[3]
			if r.payload.Valid || r.payloadIsBin || r.contentType.Valid {
				t.Errorf("row 3 (no payload): payload %v payload_bin set %v content_type %v; want all NULL", r.payload, r.payloadIsBin, r.contentType)
			}

			r = rows[4]
			if !r.payloadIsBin || len(r.payloadBin) != 0 || r.payload.Valid || r.contentType.String != "application/octet-stream" {
				t.Errorf("row 4 (empty binary): payload_bin set %v %x payload %v content_type %v; want an empty, non-NULL payload_bin",
					r.payloadIsBin, r.payloadBin, r.payload, r.contentType)
			}

			r = rows[5]
			if r.payload.String != `{"specversion":"1.0"}` || r.payloadIsBin || r.contentType.String != "application/cloudevents+json; charset=utf-8" {
				t.Errorf("row 5 (+json): payload %v payload_bin set %v content_type %v", r.payload, r.payloadIsBin, r.contentType)
			}
		})
	}
}

func TestEnqueueKeepsSliceOrder(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{})
			events := make([]outbox.Event, 2000)
			for i := range events {
				events[i] = outbox.Event{Topic: "t", Key: fmt.Sprint(i % 7), Payload: []byte(fmt.Sprint(i))}
			}
			ids, err := d.run(t, b, true, events...)
			if err != nil {
				t.Fatal(err)
			}
			rows := readRows(t, b)
			if len(rows) != len(events) {
				t.Fatalf("%d rows, want %d", len(rows), len(events))
			}
			for i, r := range rows {
				if r.id != ids[i] || r.payload.String != fmt.Sprint(i) {
					t.Fatalf("row at seq position %d holds event %s (payload %s); want event %d", i, r.id, r.payload.String, i)
				}
			}
		})
	}
}

func TestRolledBackTransactionWritesNothing(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{})
			ids, err := d.run(t, b, false, outbox.Event{Topic: "a"}, outbox.Event{Topic: "b"})
			if err != nil || len(ids) != 2 {
				t.Fatalf("enqueue: %v, %d ids", err, len(ids))
			}
			if rows := readRows(t, b); len(rows) != 0 {
				t.Fatalf("%d rows after rollback, want 0", len(rows))
			}
		})
	}
}

func TestDuplicateIDIsRefusedByTheUniqueIndex(t *testing.T) {
	t.Parallel()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{})
			id := uuid.Must(uuid.NewV7())
			if _, err := d.run(t, b, true, outbox.Event{ID: id, Topic: "first"}); err != nil {
				t.Fatal(err)
			}
			for name, events := range map[string][]outbox.Event{
				"already stored":  {{Topic: "ok"}, {ID: id, Topic: "again"}},
				"twice in a call": {{ID: uuid.Must(uuid.NewV7()), Topic: "x"}, {Topic: "y"}},
			} {
				if name == "twice in a call" {
					events[1].ID = events[0].ID
				}
				_, err := d.run(t, b, true, events...)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
					t.Fatalf("%s: err = %v, want a wrapped unique violation (23505)", name, err)
				}
				want := "outbox: inserting 2 events into " + b.tables.Outbox() + ": "
				if !strings.HasPrefix(err.Error(), want) {
					t.Errorf("%s: error %q does not start with %q", name, err, want)
				}
			}
			rows := readRows(t, b)
			if len(rows) != 1 || rows[0].topic != "first" {
				t.Fatalf("rows = %+v, want only the first event", rows)
			}
		})
	}
}

func TestPlainSQLInsertUsesDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	// The insert comes 50 ms into its transaction: created_at is the
	// transaction's start, available_at the insert's time.
	_, err := b.pool.Exec(context.Background(), `SELECT pg_sleep(0.05);
INSERT INTO `+b.tables.Outbox()+` (topic, key, payload) VALUES ('orders.created', 'order-1', '{"id": 1}')`)
	if err != nil {
		t.Fatalf("plain insert: %v", err)
	}
	rows := readRows(t, b)
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.id == uuid.Nil || r.key.String != "order-1" || r.payload.String != `{"id": 1}` || r.payloadIsBin ||
		r.contentType.Valid || len(r.headers) != 0 || r.status != "pending" ||
		r.maxAttempts.Valid {
		t.Fatalf("defaults not applied: %+v", r)
	}
	if d := time.Duration(r.delayMicros) * time.Microsecond; d < 50*time.Millisecond || d > 5*time.Second {
		t.Fatalf("available_at - created_at = %s, want the 50 ms from the transaction's start to the insert", d)
	}
}

func TestEnqueueWithoutEventsOrTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	ids, err := b.writer.Enqueue(ctx, nil, outbox.Event{Topic: "a"})
	if err == nil || err.Error() != "outbox: Enqueue: nil transaction" {
		t.Errorf("Enqueue(nil tx) = %v, %v", ids, err)
	}
	ids, err = b.writer.EnqueueSQL(ctx, nil, outbox.Event{Topic: "a"})
	if err == nil || err.Error() != "outbox: EnqueueSQL: nil transaction" {
		t.Errorf("EnqueueSQL(nil tx) = %v, %v", ids, err)
	}
	for _, d := range drivers {
		ids, err := d.run(t, b, true)
		if err != nil || ids != nil {
			t.Errorf("%s: no events = %v, %v; want nil, nil", d.name, ids, err)
		}
	}
	if rows := readRows(t, b); len(rows) != 0 {
		t.Fatalf("%d rows, want 0", len(rows))
	}
}

func TestEnqueueFailsOnAnAbortedTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	_, err = b.writer.Enqueue(ctx, tx, outbox.Event{Topic: "a"})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25P02" || !strings.HasPrefix(err.Error(), "outbox: inserting 1 events into ") {
		t.Fatalf("err = %v, want a wrapped in_failed_sql_transaction (25P02)", err)
	}
}

func TestNewWriterValidatesTables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tables migrations.Tables
		want   string
	}{
		{migrations.Tables{Table: `out"box`}, `outbox: Config.Tables: database.table: "out\"box" must not contain quotes, semicolons, backslashes or NUL`},
		{migrations.Tables{Schema: strings.Repeat("s", 60)}, "outbox: Config.Tables: database.schema: "},
	} {
		w, err := outbox.NewWriter(outbox.Config{Tables: tc.tables})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("NewWriter(%+v) = %v, %v; want an error starting %q", tc.tables, w, err, tc.want)
		}
	}
	if _, err := outbox.NewWriter(outbox.Config{}); err != nil {
		t.Errorf("NewWriter(zero Config) = %v; want the defaults (public.outbox) to be accepted", err)
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	e, err := outbox.JSON("orders.created", map[string]any{"id": 7, "note": "<ok>"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Topic != "orders.created" || string(e.Payload) != `{"id":7,"note":"\u003cok\u003e"}` || e.ContentType != "" {
		t.Errorf("JSON = %+v (payload %s)", e, e.Payload)
	}
	_, err = outbox.JSON("bad", make(chan int))
	var unsupported *json.UnsupportedTypeError
	if !errors.As(err, &unsupported) || !strings.HasPrefix(err.Error(), `outbox: marshalling payload of a "bad" event: `) {
		t.Errorf("JSON(chan) error = %v", err)
	}
}
