package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/internal/pgtest"
)

// The test harness's WAL capture on PostgreSQL: the events a behavioural
// test writes are emitted into the write-ahead log with outbox_emit (no
// row), and its relays read them from the schema's replication slot
// (Config.Capture = CaptureWAL). Everything else is the table store's.

// pgWALDB is a test's schema on a PostgreSQL server writing logical WAL.
type pgWALDB struct{ pgDB }

// setupWALStore returns a bundle whose events go through the WAL. The
// slot is created first: an event emitted before it exists is in no slot.
func setupWALStore(t testing.TB) *testBundle {
	t.Helper()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	b := pgBundle(pool, pgtest.Schema(t, pool))
	if _, err := b.pool.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", b.tables.SlotName()); err != nil {
		t.Fatalf("creating the test's replication slot: %v", err)
	}
	b.db = pgWALDB{b.db.(pgDB)}
	return b
}

// insert emits evs with outbox_emit in one transaction and returns their
// seqs (outbox_emit takes each from the outbox's sequence, as a row would).
func (d pgWALDB) insert(t testing.TB, evs []ev, commit bool) []int64 {
	t.Helper()
	// Evaluated left to right, row by row: currval is the seq the row's
	// outbox_emit has just taken.
	return d.insertWith(t, `SELECT `+d.tables.Emit()+`(u.topic, u.key, u.payload::jsonb,
    delay => nullif(u.delay, interval '0'), max_attempts => u.max) IS NOT NULL,
  currval(pg_get_serial_sequence($6, 'seq'))
FROM unnest($1::text[], $2::text[], $3::text[], $4::interval[], $5::int[])
  WITH ORDINALITY AS u(topic, key, payload, delay, max, n) ORDER BY u.n`,
		append(evArrays(evs), d.tables.Outbox()), commit,
		func(rows pgx.Rows) (seq int64, err error) {
			var emitted bool
			err = rows.Scan(&emitted, &seq)
			return seq, err
		})
}

// newRelay reads the WAL, unless the test chose a capture.
func (d pgWALDB) newRelay(t testing.TB, cfg Config) (*Relay, error) {
	if cfg.Capture == "" {
		cfg.Capture = CaptureWAL
	}
	return d.pgDB.newRelay(t, cfg)
}

// eachStoreAndCapture is eachStore plus a third subtest, postgres-wal, in
// which the events are emitted into the WAL and read from a slot: the
// failure-path cases that do not look at outbox rows run in both capture
// modes.
func eachStoreAndCapture(t *testing.T, test func(t *testing.T, b *testBundle)) {
	t.Helper()
	eachStore(t, test)
	t.Run("postgres-wal", func(t *testing.T) {
		t.Parallel()
		test(t, setupWALStore(t))
	})
}
