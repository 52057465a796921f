package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// mysqlSetup returns a migrated MariaDB database of the test's own and a
// MySQL Writer for it.
func mysqlSetup(t *testing.T) (*sql.DB, *outbox.Writer) {
	t.Helper()
	db, _, _ := mysqltest.Migrated(t)
	w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	return db, w
}

// mysqlEnqueue runs EnqueueSQL in a transaction of its own and commits it,
// or rolls it back when commit is false or Enqueue failed.
func mysqlEnqueue(t *testing.T, db *sql.DB, w *outbox.Writer, commit bool, events ...outbox.Event) ([]uuid.UUID, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ids, err := w.EnqueueSQL(ctx, tx, events...)
	if err != nil || !commit {
		return ids, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids, nil
}

func mysqlCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLManyEventsInOneTransaction: more events than one INSERT can
// carry, in the caller's transaction, stored in the slice's order.
func TestMySQLManyEventsInOneTransaction(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	const n = 7000 // more than the 6,553 rows of one statement
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{Topic: "orders.created", Key: fmt.Sprintf("order-%d", i%10), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	ids, err := mysqlEnqueue(t, db, w, true, events...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d ids for %d events", len(ids), n)
	}
	rows, err := db.Query("SELECT id, payload FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	i := 0
	for rows.Next() {
		var id, payload string
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		if id != ids[i].String() || payload != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("row %d in seq order: id %s payload %s, want %s {\"n\":%d}", i, id, payload, ids[i], i)
		}
		i++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if i != n {
		t.Fatalf("%d rows stored, want %d", i, n)
	}
}

func TestMySQLRollbackLeavesNone(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	if _, err := mysqlEnqueue(t, db, w, false, outbox.Event{Topic: "a"}, outbox.Event{Topic: "b"}); err != nil {
		t.Fatal(err)
	}
	if n := mysqlCount(t, db); n != 0 {
		t.Fatalf("%d rows after rollback", n)
	}
}

// TestMySQLPayloads: JSON byte for byte (spacing, duplicate keys, nesting
// deeper than MariaDB's JSON type allows), binary in payload_bin, with the
// same NULLs as on PostgreSQL.
func TestMySQLPayloads(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	events := []outbox.Event{
		{Topic: "json", Payload: []byte(`{ "b": 1,  "a": 2, "a": 3 }`)},
		{Topic: "deep", Payload: []byte(deep)},
		{Topic: "empty-json"},
		{Topic: "binary", ContentType: "application/octet-stream", Payload: []byte{0, 0xff, 'x', 0}},
		{Topic: "empty-binary", ContentType: "application/protobuf"},
		{Topic: "json-suffix", ContentType: "application/cloudevents+json; charset=utf-8", Payload: []byte(`"é"`)},
	}
	if _, err := mysqlEnqueue(t, db, w, true, events...); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT topic, payload, payload_bin, content_type, payload_bytes FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type row struct {
		payload, payloadBin []byte
		contentType         sql.NullString
		bytes               int
	}
	got := map[string]row{}
	for rows.Next() {
		var (
			topic string
			r     row
		)
		if err := rows.Scan(&topic, &r.payload, &r.payloadBin, &r.contentType, &r.bytes); err != nil {
			t.Fatal(err)
		}
		got[topic] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	check := func(topic string, payload, bin []byte, contentType string, size int) {
		t.Helper()
		r := got[topic]
		if string(r.payload) != string(payload) || (payload == nil) != (r.payload == nil) ||
			string(r.payloadBin) != string(bin) || (bin == nil) != (r.payloadBin == nil) ||
			r.contentType.String != contentType || r.contentType.Valid != (contentType != "") || r.bytes != size {
			t.Errorf("%s: payload %q payload_bin %q content_type %v payload_bytes %d; want %q %q %q %d",
				topic, r.payload, r.payloadBin, r.contentType, r.bytes, payload, bin, contentType, size)
		}
	}
	check("json", []byte(`{ "b": 1,  "a": 2, "a": 3 }`), nil, "", 27)
	check("deep", []byte(deep), nil, "", 400)
	check("empty-json", nil, nil, "", 0)
	check("binary", nil, []byte{0, 0xff, 'x', 0}, "application/octet-stream", 4)
	check("empty-binary", nil, []byte{}, "application/protobuf", 0)
	check("json-suffix", []byte(`"é"`), nil, "application/cloudevents+json; charset=utf-8", 4)
}

func TestMySQLHeaders(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	if _, err := mysqlEnqueue(t, db, w, true,
		outbox.Event{Topic: "a", Headers: map[string]string{"X-Tenant": "acme", "é": "ü\"\\"}},
		outbox.Event{Topic: "b"}); err != nil {
		t.Fatal(err)
	}
	var tenant, accented, empty string
	if err := db.QueryRow(`SELECT json_value(headers, '$."X-Tenant"'), json_value(headers, '$."é"') FROM outbox WHERE topic = 'a'`).Scan(&tenant, &accented); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT headers FROM outbox WHERE topic = 'b'`).Scan(&empty); err != nil {
		t.Fatal(err)
	}
	if tenant != "acme" || accented != "ü\"\\" || empty != "{}" {
		t.Fatalf("headers read back as %q, %q and %q", tenant, accented, empty)
	}
}

// TestMySQLDelayedDelivery: Delay counts from the database's clock at the
// insert, AvailableAt is stored to the microsecond in UTC, and neither
// follows the session's time zone.
func TestMySQLDelayedDelivery(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET time_zone = '-07:00'"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.FixedZone("CEST", 2*3600))
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := w.EnqueueSQL(ctx, tx,
		outbox.Event{Topic: "now"},
		outbox.Event{Topic: "delayed", Delay: time.Hour},
		outbox.Event{Topic: "at", AvailableAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var nowDelay, delayedDelay float64
	if err := db.QueryRow(`SELECT TIMESTAMPDIFF(MICROSECOND, created_at, available_at) / 1e6 FROM outbox WHERE topic = 'now'`).Scan(&nowDelay); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT TIMESTAMPDIFF(MICROSECOND, utc_timestamp(6), available_at) / 1e6 FROM outbox WHERE topic = 'delayed'`).Scan(&delayedDelay); err != nil {
		t.Fatal(err)
	}
	if nowDelay < 0 || nowDelay > 5 {
		t.Errorf("an event without delay is due %.3fs after its created_at", nowDelay)
	}
	if delayedDelay < 3600-60 || delayedDelay > 3600 {
		t.Errorf("an event delayed by an hour is due in %.3fs", delayedDelay)
	}
	var stored time.Time
	if err := db.QueryRow(`SELECT available_at FROM outbox WHERE topic = 'at'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !stored.Equal(at) {
		t.Errorf("AvailableAt %s stored as %s", at.UTC(), stored)
	}
}

// TestMySQLValidation: the PostgreSQL writer's validation, naming the event
// and the field, and nothing of the call written.
func TestMySQLValidation(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	for _, c := range []struct {
		events []outbox.Event
		index  int
		field  string
	}{
		{[]outbox.Event{{Topic: "ok"}, {Topic: "ok"}, {Topic: ""}}, 2, "topic"},
		{[]outbox.Event{{Topic: "ok"}, {Topic: "t", Payload: []byte("{")}}, 1, "payload"},
		{[]outbox.Event{{Topic: "t", Key: strings.Repeat("k", 1025)}}, 0, "key"},
		{[]outbox.Event{{Topic: "t", Headers: map[string]string{"X-Bad": "a\x00b"}}}, 0, `headers["X-Bad"]`},
		{[]outbox.Event{{Topic: "t", Delay: -time.Second}}, 0, "delay"},
		{[]outbox.Event{{Topic: "ok"}, {Topic: "t", AvailableAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}, 1, "available_at"},
	} {
		_, err := mysqlEnqueue(t, db, w, true, c.events...)
		var v *outbox.ValidationError
		if !errors.As(err, &v) || v.Index != c.index || v.Field != c.field {
			t.Errorf("got %v, want a ValidationError for events[%d].%s", err, c.index, c.field)
		}
	}
	if n := mysqlCount(t, db); n != 0 {
		t.Fatalf("%d rows written by refused calls", n)
	}
}

// TestMySQLPlainInsertMatchesTheWriter: the table contract. A row written
// by a plain INSERT from any language and one written by the Writer carry
// the same defaults.
func TestMySQLPlainInsertMatchesTheWriter(t *testing.T) {
	t.Parallel()
	db, w := mysqlSetup(t)
	if _, err := db.Exec("INSERT INTO outbox (topic, `key`, payload) VALUES ('orders.created', 'order-42', '{\"id\": 42}')"); err != nil {
		t.Fatal(err)
	}
	if _, err := mysqlEnqueue(t, db, w, true, outbox.Event{Topic: "orders.created", Key: "order-42", Payload: []byte(`{"id": 42}`)}); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT CONCAT_WS('|', topic, `key`, payload, IFNULL(payload_bin, 'NULL'), IFNULL(content_type, 'NULL'), headers," +
		" IFNULL(max_attempts, 'NULL'), status, IFNULL(finished_at, 'NULL'), lane, payload_bytes," +
		" available_at >= created_at AND available_at < created_at + INTERVAL 5 SECOND) FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("plain and library rows differ:\n  %v", strings.Join(got, "\n  "))
	}
}

func TestMySQLWriterRefusesPgx(t *testing.T) {
	_, w := mysqlSetup(t)
	_, err := w.Enqueue(context.Background(), nil, outbox.Event{Topic: "a"})
	if err == nil || !strings.Contains(err.Error(), "use EnqueueSQL") {
		t.Fatalf("Enqueue on a MySQL Writer: got %v, want an error pointing to EnqueueSQL", err)
	}
	if _, err := outbox.NewWriter(outbox.Config{Dialect: outbox.Dialect(7)}); err == nil {
		t.Fatal("NewWriter accepted an unknown dialect")
	}
}

// TestMySQLErrorNamesTheTable: a database without the tables.
func TestMySQLErrorNamesTheTable(t *testing.T) {
	t.Parallel()
	db, _ := mysqltest.Database(t)
	w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL, Tables: migrations.Tables{Table: "events"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = mysqlEnqueue(t, db, w, true, outbox.Event{Topic: "a"})
	if err == nil || !strings.Contains(err.Error(), "`events`") {
		t.Fatalf("got %v, want an error naming `events`", err)
	}
}
