package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/mysqlurl"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/store"
)

// bundle is a test's own database: db is the test's pool, relays get a
// pool configured as a relay's (Configure).
type bundle struct {
	db     *sql.DB
	url    string
	tables mysqlmigrations.Tables
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db, url, tables := mysqltest.Migrated(t)
	return &bundle{db: db, url: url, tables: tables}
}

// relayDB opens a pool as a relay opens it.
func (b *bundle) relayDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := Open(b.url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

// embedderDB opens a pool as an embedder might: Configure's settings, the
// server's isolation level (REPEATABLE READ by default).
func (b *bundle) embedderDB(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := mysqlurl.Config(b.url)
	if err != nil {
		t.Fatal(err)
	}
	Configure(cfg)
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

// ev is an event to insert.
type ev struct{ topic, key string }

// insert inserts events in one statement and returns their seqs in order.
func (b *bundle) insert(t testing.TB, evs ...ev) []int64 {
	t.Helper()
	var q strings.Builder
	q.WriteString("INSERT INTO " + b.tables.Outbox() + " (topic, `key`, payload) VALUES ")
	args := make([]any, 0, 3*len(evs))
	for i, e := range evs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?)")
		var key any
		if e.key != "" {
			key = e.key
		}
		args = append(args, e.topic, key, fmt.Sprintf(`{"n": %d}`, i))
	}
	res, err := b.db.Exec(q.String(), args...)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	// One multi-row INSERT draws consecutive seqs (innodb_autoinc_lock_mode
	// 1 or 2 on a lone statement): the first is LAST_INSERT_ID.
	first, err := res.LastInsertId()
	if err != nil {
		t.Fatal(err)
	}
	seqs := make([]int64, len(evs))
	for i := range seqs {
		seqs[i] = first + int64(i)
	}
	return seqs
}

func (b *bundle) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.tables.Outbox() + " WHERE " + where).Scan(&n); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return n
}

func (b *bundle) countDeliveries(t testing.TB, where string) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.tables.Deliveries() + " WHERE " + where).Scan(&n); err != nil {
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

func (b *bundle) relay(t testing.TB, owner string) *relayOn {
	return &relayOn{Store: New(b.relayDB(t), b.tables, Config{PollInterval: 50 * time.Millisecond}), owner: owner}
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

// seqsOf lists the seqs of claimed rows, with the sink for deliveries.
func seqsOf(cs []store.Claimed) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprint(c.Seq)
		if c.Delivery {
			parts[i] = c.Sink + ":" + parts[i]
			if c.Head {
				parts[i] += "*"
			}
		}
	}
	return strings.Join(parts, " ")
}
