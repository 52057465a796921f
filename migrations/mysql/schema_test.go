package mysql_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mysqltest"
)

// TestPlainInsertTakesDefaults: the table contract. A plain INSERT of a
// topic, key and payload gets an id, times in UTC whatever the session's
// time zone, its lane, its payload size, no headers, pending.
func TestPlainInsertTakesDefaults(t *testing.T) {
	t.Parallel()
	db, _, _ := mysqltest.Migrated(t)
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A session far from UTC: the defaults must not follow it.
	if _, err := conn.ExecContext(t.Context(), "SET time_zone = '+09:00'"); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Add(-time.Second)
	if _, err := conn.ExecContext(t.Context(), "INSERT INTO outbox (topic, `key`, payload) VALUES ('orders.created', 'order-42', '{\"id\": 42}')"); err != nil {
		t.Fatal(err)
	}
	after := time.Now().UTC().Add(time.Second)
	var (
		id, topic, key, payload, headers, status string
		createdAt, availableAt                   time.Time
		lane, size                               int
	)
	err = conn.QueryRowContext(t.Context(), "SELECT id, topic, `key`, payload, headers, status, created_at, available_at, lane, payload_bytes FROM outbox").
		Scan(&id, &topic, &key, &payload, &headers, &status, &createdAt, &availableAt, &lane, &size)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(id) {
		t.Errorf("id %q is not a canonical UUID", id)
	}
	if key != "order-42" || payload != `{"id": 42}` || headers != "{}" || status != "pending" {
		t.Errorf("row: key %q payload %q headers %q status %q", key, payload, headers, status)
	}
	for name, at := range map[string]time.Time{"created_at": createdAt, "available_at": availableAt} {
		if at.Before(before) || at.After(after) {
			t.Errorf("%s = %s, not between %s and %s (UTC)", name, at, before, after)
		}
	}
	var wantLane int
	if err := conn.QueryRowContext(t.Context(), "SELECT crc32('order-42') & 63").Scan(&wantLane); err != nil {
		t.Fatal(err)
	}
	if lane != wantLane || size != len(`{"id": 42}`) {
		t.Errorf("lane %d (want %d), payload_bytes %d (want %d)", lane, wantLane, size, len(`{"id": 42}`))
	}
}

// TestTableRefusesWhatTheRelayCannotCarry: the checks PostgreSQL's table
// makes, and those MySQL needs besides (UTF-8 keys, zero dates).
func TestTableRefusesWhatTheRelayCannotCarry(t *testing.T) {
	t.Parallel()
	db, _, _ := mysqltest.Migrated(t)
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A lax session, as an old application may run: strict mode off, zero
	// dates allowed. The checks must hold all the same.
	if _, err := conn.ExecContext(t.Context(), "SET sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, insert string }{
		{"empty topic", "INSERT INTO outbox (topic) VALUES ('')"},
		{"topic of 256 bytes", "INSERT INTO outbox (topic) VALUES (REPEAT('t', 256))"},
		{"topic of 300 characters", "INSERT INTO outbox (topic) VALUES (REPEAT('t', 300))"},
		{"empty key", "INSERT INTO outbox (topic, `key`) VALUES ('a', '')"},
		{"key of 1025 bytes", "INSERT INTO outbox (topic, `key`) VALUES ('a', REPEAT('k', 1025))"},
		{"key of 5000 bytes", "INSERT INTO outbox (topic, `key`) VALUES ('a', REPEAT('k', 5000))"},
		{"key not UTF-8", "INSERT INTO outbox (topic, `key`) VALUES ('a', x'ff')"},
		{"both payloads", "INSERT INTO outbox (topic, payload, payload_bin) VALUES ('a', '1', x'01')"},
		{"headers an array", "INSERT INTO outbox (topic, headers) VALUES ('a', '[]')"},
		{"headers not JSON", "INSERT INTO outbox (topic, headers) VALUES ('a', '{')"},
		{"max_attempts 0", "INSERT INTO outbox (topic, max_attempts) VALUES ('a', 0)"},
		{"id not canonical", "INSERT INTO outbox (topic, id) VALUES ('a', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')"},
		{"zero created_at", "INSERT INTO outbox (topic, created_at) VALUES ('a', '0000-00-00 00:00:00')"},
		{"zero month in available_at", "INSERT INTO outbox (topic, available_at) VALUES ('a', '2026-00-10 00:00:00')"},
	} {
		if _, err := conn.ExecContext(t.Context(), c.insert); err == nil {
			t.Errorf("%s: the insert was accepted", c.name)
		}
	}
	var n int
	if err := conn.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows stored (err %v), want none", n, err)
	}
	// What PostgreSQL stores, MySQL stores: JSON nested deeper than
	// MariaDB's JSON type allows (32 levels), keys differing only by a
	// trailing space, a topic of 255 bytes.
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	for _, insert := range []string{
		"INSERT INTO outbox (topic, payload) VALUES ('a', '" + deep + "')",
		"INSERT INTO outbox (topic, `key`) VALUES ('a', 'k'), ('a', 'k ')",
		"INSERT INTO outbox (topic) VALUES (REPEAT('t', 255))",
	} {
		if _, err := conn.ExecContext(t.Context(), insert); err != nil {
			t.Errorf("%s: %v", insert, err)
		}
	}
	if err := conn.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM outbox WHERE `key` = 'k'").Scan(&n); err != nil || n != 1 {
		t.Errorf("key = 'k' matches %d rows (err %v), want 1: keys compare as bytes", n, err)
	}
}

// TestOneHeadPerQueue: the unique head index, emulated with a virtual
// column, allows one head per key and sink, any number of waiting
// deliveries and of dead letters that do not stop their key.
func TestOneHeadPerQueue(t *testing.T) {
	t.Parallel()
	db, _, _ := mysqltest.Migrated(t)
	insert := func(seq int, sink, state string, stops bool) error {
		var next, dead any
		switch state {
		case "ready":
			next = "2026-01-01 00:00:00"
		case "dead":
			dead = "2026-01-01 00:00:00"
		}
		_, err := db.Exec("INSERT INTO outbox_deliveries (sink, seq, lane, id, topic, `key`, created_at, state, stops_key, next_at, dead_at)"+
			" VALUES (?, ?, 1, uuid(), 't', 'k', utc_timestamp(6), ?, ?, ?, ?)", sink, seq, state, stops, next, dead)
		return err
	}
	for _, ok := range []struct {
		seq         int
		sink, state string
		stops       bool
	}{
		{1, "kafka", "ready", false},
		{2, "kafka", "waiting", false},
		{3, "kafka", "waiting", false},
		{4, "kafka", "dead", false},
		{5, "kafka", "dead", false},
		{6, "nats", "dead", true}, // a head of its own sink's queue
	} {
		if err := insert(ok.seq, ok.sink, ok.state, ok.stops); err != nil {
			t.Fatalf("delivery %d: %v", ok.seq, err)
		}
	}
	if err := insert(7, "kafka", "ready", false); err == nil {
		t.Error("a second ready head of key k on kafka was accepted")
	}
	if err := insert(8, "nats", "ready", false); err == nil {
		t.Error("a ready head behind nats's stopping dead letter was accepted")
	}
	if err := insert(9, "kafka", "waiting", true); err == nil {
		t.Error("a waiting delivery stopping its key was accepted")
	}
}
