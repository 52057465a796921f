package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/outbox"
)

// walMessages reads, through a temporary test_decoding slot, the logical
// decoding messages of the outbox's prefix that committed since the slot
// was made.
type walSlot struct {
	name string
	b    *bundle
}

func newWALSlot(t *testing.T, b *bundle) *walSlot {
	t.Helper()
	pgtest.RequireLogicalWAL(t, b.pool)
	s := &walSlot{name: pgtest.UniqueName("outbox_test_"), b: b}
	if _, err := b.pool.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", s.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", s.name)
	})
	return s
}

// messages returns the contents of the outbox's messages decoded so far.
func (s *walSlot) messages(t *testing.T) []map[string]any {
	t.Helper()
	rows, err := s.b.pool.Query(context.Background(), "SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)", s.name)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	prefix := "message: transactional: 1 prefix: " + s.b.tables.MessagePrefix() + ", sz: "
	var out []map[string]any
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		_, content, _ := strings.Cut(l, " content:")
		var m map[string]any
		if err := json.Unmarshal([]byte(content), &m); err != nil {
			t.Fatalf("message %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestWriterToTheWAL: with Capture WAL, Enqueue writes no row: each event is
// a transactional message in the WAL, in order, with the event's id and a
// seq from the table's sequence; a rolled-back transaction emits nothing; a
// delayed event goes to the table; validation is the table's.
func TestWriterToTheWAL(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{Capture: outbox.WAL})
	slot := newWALSlot(t, b)
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			ids, err := d.run(t, b, true, outbox.Event{Topic: "orders.paid", Key: "o-1", Payload: []byte(`{"n": 1}`)},
				outbox.Event{Topic: "orders.paid", Key: "o-1", Payload: []byte{0, 1, 2}, ContentType: "application/x-bin", Headers: map[string]string{"h": "v"}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.run(t, b, false, outbox.Event{Topic: "rolled.back"}); err != nil {
				t.Fatal(err)
			}
			msgs := slot.messages(t)
			if len(msgs) != 2 || msgs[0]["id"] != ids[0].String() || msgs[1]["id"] != ids[1].String() {
				t.Fatalf("messages %v, want the two committed events, in order", msgs)
			}
			if msgs[0]["seq"].(float64) >= msgs[1]["seq"].(float64) || msgs[0]["key"] != "o-1" || msgs[0]["payload"].(map[string]any)["n"] != 1.0 {
				t.Fatalf("first message %v", msgs[0])
			}
			if msgs[1]["payload_bin"] != "AAEC" || msgs[1]["content_type"] != "application/x-bin" || msgs[1]["headers"].(map[string]any)["h"] != "v" {
				t.Fatalf("second message %v", msgs[1])
			}
		})
	}
	var rows int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Outbox()).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows in the table (%v), want none", rows, err)
	}
	if _, err := drivers[0].run(t, b, true, outbox.Event{Topic: "later", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Outbox()+" WHERE available_at > now() + interval '59 minutes'").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d delayed rows in the table (%v), want the delayed event", rows, err)
	}
	if len(slot.messages(t)) != 0 {
		t.Fatal("the delayed event was emitted into the WAL")
	}
	if _, err := drivers[0].run(t, b, true, outbox.Event{Topic: ""}); err == nil {
		t.Fatal("an event without a topic was accepted")
	}
}

// TestEmitValidatesLikeTheTable: outbox_emit, called from plain SQL, refuses
// what the table's constraints refuse, naming the field, with the SQLSTATE
// the constraint would raise.
func TestEmitValidatesLikeTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	const notNull, check = "23502", "23514"
	for _, c := range []struct{ sql, want, code string }{
		{"SELECT " + b.tables.Emit() + "('', 'k', '{}')", "topic must be 1 to 255 bytes, got 0", check},
		{"SELECT " + b.tables.Emit() + "(repeat('t', 256), 'k', '{}')", "topic must be 1 to 255 bytes, got 256", check},
		{"SELECT " + b.tables.Emit() + "('t', '', '{}')", "key must be NULL or 1 to 1024 bytes, got 0", check},
		{"SELECT " + b.tables.Emit() + "('t', 'k', '{}', '[]')", "headers must be a JSON object", check},
		{"SELECT " + b.tables.Emit() + "('t', 'k', '{}', '{}', NULL, 0)", "max_attempts must be positive, got 0", check},
		{"SELECT " + b.tables.EmitEvent() + "(NULL, 't', 'k', '{}', NULL, NULL, '{}', NULL, NULL)", "id must not be null", notNull},
		{"SELECT " + b.tables.EmitEvent() + "(gen_random_uuid(), 't', 'k', '{}', '\\x01', NULL, '{}', NULL, NULL)", "a JSON payload or a binary one, not both", check},
		{"SELECT " + b.tables.EmitEvent() + "(gen_random_uuid(), 't', 'k', '{}', NULL, NULL, '{}', '1 hour', 0)", "max_attempts must be positive", check},
	} {
		_, err := b.pool.Exec(context.Background(), c.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, c.want) || pgErr.Code != c.code {
			t.Errorf("%s: %v, want %q (SQLSTATE %s)", c.sql, err, c.want, c.code)
		}
	}
	var id string
	if err := b.pool.QueryRow(context.Background(), "SELECT "+b.tables.Emit()+"('t', NULL, '{\"a\": 1}')::text").Scan(&id); err != nil || len(id) != 36 {
		t.Fatalf("a valid event: id %q (%v)", id, err)
	}
}
