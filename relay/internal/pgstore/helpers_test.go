package pgstore

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/store"
)

// bundle is a test's own schema.
type bundle struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool := pgtest.Pool(t)
	return &bundle{pool: pool, tables: pgtest.Schema(t, pool)}
}

// ev is an event to insert.
type ev struct{ topic, key string }

// insert inserts events in one statement and returns their seqs in order.
func (b *bundle) insert(t testing.TB, evs ...ev) []int64 {
	t.Helper()
	topics := make([]string, len(evs))
	keys := make([]pgtype.Text, len(evs))
	for i, e := range evs {
		topics[i] = e.topic
		keys[i] = pgtype.Text{String: e.key, Valid: e.key != ""}
	}
	rows, err := b.pool.Query(context.Background(), `INSERT INTO `+b.tables.Outbox()+` (topic, key, payload)
SELECT u.topic, u.key, json_build_object('n', u.n) FROM unnest($1::text[], $2::text[])
  WITH ORDINALITY AS u(topic, key, n) ORDER BY u.n RETURNING seq`, topics, keys)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	return seqs
}

func (b *bundle) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Outbox()+" WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return n
}

func (b *bundle) countDeliveries(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.tables.Deliveries()+" WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("counting deliveries: %v", err)
	}
	return n
}

// relayOn is one relay (owner name) on a store, as these tests drive it:
// without the engine, which decides what to claim and record.
type relayOn struct {
	*Store
	owner string
	// leases are the lanes takeLanes found held: records are fenced by
	// them unless they say otherwise.
	leases store.Leases
}

func newRelayOn(pool *pgxpool.Pool, t migrations.Tables, owner string) *relayOn {
	return &relayOn{Store: New(pool, t), owner: owner}
}

// takeLanes heartbeats and takes every lane no live relay holds, as the only
// live relay does; it returns the lanes held and those taken over.
func (r *relayOn) takeLanes(ctx context.Context, lease time.Duration) (held, takenOver uint64, err error) {
	v, err := r.Renew(ctx, r.owner, "", lease, nil)
	if err != nil {
		return 0, 0, err
	}
	acquired, takenOver, err := r.AcquireLanes(ctx, r.owner, lease, 0, store.Lanes-1)
	r.leases = v.Held
	for lane := range store.Lanes {
		if acquired.Mask&(1<<uint(lane)) != 0 {
			r.leases.Add(lane, acquired.Epochs[lane])
		}
	}
	return r.leases.Mask, takenOver, err
}

// claim claims from every lane, at most rows outbox rows and rows
// deliveries of each queue in sinks, with the relay's default byte limits.
func (r *relayOn) claim(ctx context.Context, rows int, sinks ...string) (fresh, queued []store.Claimed, err error) {
	heads := make([]int32, len(sinks))
	for i := range heads {
		heads[i] = int32(rows)
	}
	return r.Claim(ctx, store.ClaimParams{Lanes: ^uint64(0), Rows: rows, Bytes: 32 << 20, EventBytes: 16 << 20,
		QueueSinks: sinks, QueueHeads: heads, QueueRows: heads, QueueChain: heads})
}

// record records o, fenced by the leases takeLanes found unless o has a
// fence, and returns the rows it left.
func (r *relayOn) record(ctx context.Context, o *store.Outcome) ([]int64, error) {
	rec, err := r.recordAll(ctx, o)
	return rec.Left, err
}

// recordAll is record returning all the store says.
func (r *relayOn) recordAll(ctx context.Context, o *store.Outcome) (store.Recorded, error) {
	if o.Fence.Mask == 0 {
		o.Fence = r.leases
	}
	return r.Record(ctx, r.owner, o, false)
}

// boom is a stored error text.
var boom = sql.NullString{String: "boom", Valid: true}

// queryPlan runs an EXPLAIN and returns its lines.
func queryPlan(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n") + "\n"
}

// expireLeases ends every held lane's lease a second ago on the database's
// clock, as if their owners had stopped renewing them a lease ago: a
// takeover without waiting for a lease.
func (b *bundle) expireLeases(t testing.TB) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), "UPDATE "+b.tables.Lanes()+" SET lease_until = now() - interval '1 second' WHERE owner IS NOT NULL"); err != nil {
		t.Fatalf("expiring the lanes' leases: %v", err)
	}
}
