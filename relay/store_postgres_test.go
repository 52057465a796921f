package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/pgstore"
)

// The test harness's SQL on PostgreSQL: a schema per test (pgtest), events
// inserted with plain SQL, the test's pool shared by its relays.

// pgDB is a test's schema on the PostgreSQL server.
type pgDB struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
}

// setup returns a bundle on a schema of the test's own on PostgreSQL.
func setup(t testing.TB) *testBundle {
	t.Helper()
	pool := pgtest.Pool(t)
	return pgBundle(pool, pgtest.Schema(t, pool))
}

// pgBundle returns a bundle on tables in pool's database.
func pgBundle(pool *pgxpool.Pool, tables migrations.Tables) *testBundle {
	return &testBundle{db: pgDB{pool: pool, tables: tables}, tables: tables, rec: newRecorder(), pool: pool}
}

func (d pgDB) names() tableNames { return d.tables }

func (pgDB) now() string { return "now()" }

// evArrays are evs as the array parameters of an unnest: topics, keys,
// payloads, delays and max attempts.
func evArrays(evs []ev) []any {
	topics := make([]string, len(evs))
	keys := make([]pgtype.Text, len(evs))
	payloads := make([]string, len(evs))
	delays := make([]time.Duration, len(evs))
	maxAtt := make([]pgtype.Int4, len(evs))
	for i, e := range evs {
		topics[i] = e.topic
		keys[i] = pgtype.Text{String: e.key, Valid: e.key != ""}
		payloads[i] = e.payloadOr(i)
		delays[i] = e.delay
		maxAtt[i] = pgtype.Int4{Int32: int32(e.maxAtt), Valid: e.maxAtt > 0}
	}
	return []any{topics, keys, payloads, delays, maxAtt}
}

func (d pgDB) insert(t testing.TB, evs []ev, commit bool) []int64 {
	t.Helper()
	return d.insertWith(t, `INSERT INTO `+d.tables.Outbox()+` (topic, key, payload, available_at, max_attempts)
SELECT u.topic, u.key, u.payload::json, now() + u.delay, u.max FROM unnest($1::text[], $2::text[], $3::text[], $4::interval[], $5::int[])
  WITH ORDINALITY AS u(topic, key, payload, delay, max, n) ORDER BY u.n RETURNING seq`, evArrays(evs), commit,
		func(rows pgx.Rows) (seq int64, err error) { err = rows.Scan(&seq); return seq, err })
}

// insertWith runs q with args in one transaction, reads a seq from each
// row it returns with scan, and commits it (or rolls it back).
func (d pgDB) insertWith(t testing.TB, q string, args []any, commit bool, scan func(pgx.Rows) (int64, error)) []int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	var seqs []int64
	for rows.Next() {
		s, err := scan(rows)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("committing events: %v", err)
		}
	}
	return seqs
}

func (d pgDB) exec(t testing.TB, q string) {
	t.Helper()
	if _, err := d.pool.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (d pgDB) queryRow(t testing.TB, q string, dest ...any) {
	t.Helper()
	if err := d.pool.QueryRow(context.Background(), q).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (d pgDB) lockRow(t testing.TB, seq int64) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unlock = func() { _ = tx.Rollback(ctx) }
	t.Cleanup(unlock)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+d.tables.Outbox()+" WHERE seq = $1 FOR UPDATE", seq); err != nil {
		t.Fatalf("locking row %d: %v", seq, err)
	}
	return unlock
}

// newRelay shares the test's pool: PostgreSQL's relays need no settings of
// their own to be tested.
func (d pgDB) newRelay(_ testing.TB, cfg Config) (*Relay, error) { return NewPostgres(d.pool, cfg) }

func (d pgDB) session(_ testing.TB, owner string) *session {
	return &session{store: pgstore.New(d.pool, d.tables), owner: owner}
}

func (d pgDB) deadLetters(t testing.TB) *deadletter.Store {
	t.Helper()
	store, err := deadletter.New(d.pool, d.tables)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// autovacuumOff turns autovacuum off on the test's tables: only the relay
// vacuums them then, and their dead tuples stay until it does.
func (b *testBundle) autovacuumOff(t testing.TB) {
	t.Helper()
	for _, table := range []string{b.tables.Outbox(), b.tables.Deliveries()} {
		if _, err := b.pool.Exec(context.Background(), "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatalf("turning autovacuum off on %s: %v", table, err)
		}
	}
}

// outboxVacuums returns how many times the outbox was vacuumed by a VACUUM
// command (on a test's own table, only the relay runs one; autovacuum's are
// counted apart) and its dead tuples now.
func (b *testBundle) outboxVacuums(t testing.TB) (vacuums, dead int64) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT vacuum_count, n_dead_tup
FROM pg_stat_user_tables WHERE relid = to_regclass($1)`, b.tables.Outbox()).Scan(&vacuums, &dead); err != nil {
		t.Fatalf("reading the outbox's vacuum statistics: %v", err)
	}
	return vacuums, dead
}
