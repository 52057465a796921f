package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/internal/store"
)

// A relay whose lanes were taken over must not record its batch: the new
// owner delivers those events again, and the old relay's outcome (delivered,
// or retry) would overwrite theirs. Every write is fenced by lane, deliveries
// included, and a record in flight keeps its lanes from being taken over
// until it commits.
func TestRecordIsFencedByLanes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seqs := b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"}, ev{topic: "t"})
	const lease = time.Second
	old := newRelayOn(b.pool, b.tables, "old-relay")
	if _, _, err := old.takeLanes(ctx, lease); err != nil {
		t.Fatal(err)
	}
	rows, _, err := old.claim(ctx, 10, "")
	if err != nil || len(rows) != 3 {
		t.Fatalf("claimed %d rows: %v", len(rows), err)
	}

	// While a record holds the old relay's lanes, they cannot be taken,
	// even once their lease ran out.
	b.expireLeases(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, old.sql.removals[0][0].happy, old.owner, []int64{seqs[0]}, epochs(&old.leases)); err != nil {
		t.Fatal(err)
	}
	next := newRelayOn(b.pool, b.tables, "new-relay")
	if held, _, err := next.takeLanes(ctx, lease); err != nil || held != 0 {
		t.Fatalf("took lanes %064b (%v) while the old relay was recording on them", held, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d rows left after the old relay recorded one on its lanes, want 2", n)
	}

	// Once the lanes are taken over, the old relay's records change nothing.
	held, takenOver, err := next.takeLanes(ctx, lease)
	if err != nil || held != ^uint64(0) || takenOver != ^uint64(0) {
		t.Fatalf("new relay holds %064b, took over %064b: %v", held, takenOver, err)
	}
	if rec, err := old.recordAll(ctx, &store.Outcome{OutboxSeqs: seqs[1:]}); !errors.Is(err, store.ErrFenced) || rec.Left != nil || rec.Fenced != old.leases.Mask {
		t.Fatalf("the old relay's record left %v, fenced %064b (%v), want nothing left and every lane fenced", rec.Left, rec.Fenced, err)
	}
	retry := &store.Outcome{OutboxSeqs: seqs[1:]}
	retry.FromOutbox.Add(seqs[2], "mem", "ready", false, 1, time.Hour, boom)
	if _, err := old.record(ctx, retry); !errors.Is(err, store.ErrFenced) {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d of 2 rows left after records by a relay that lost their lanes", n)
	}
	if n := b.countDeliveries(t, "true"); n != 0 {
		t.Fatalf("%d deliveries written by a relay that lost their lanes", n)
	}

	// The new owner's deliveries are its own too: key b's event waits on
	// sink mem, and the old relay can neither remove nor rewrite it.
	failed := &store.Outcome{OutboxSeqs: seqs[1:]}
	failed.FromOutbox.Add(seqs[1], "mem", "ready", false, 1, time.Hour, boom)
	if _, err := next.record(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if n := b.countDeliveries(t, "state = 'ready' AND attempts = 1"); n != 1 {
		t.Fatalf("%d deliveries after the new owner recorded one, want 1", n)
	}
	stale := &store.Outcome{}
	stale.Delete("mem", seqs[1])
	stale.Demote.Add(seqs[1], "mem", "dead", false, 2, 0, boom)
	stale.Heads.Add(seqs[1], "mem", "ready", false, 3, 0, boom)
	stale.PromoteKeys, stale.PromoteSinks = []string{"b"}, []string{"mem"}
	if _, err := old.record(ctx, stale); !errors.Is(err, store.ErrFenced) {
		t.Fatal(err)
	}
	if n := b.countDeliveries(t, "state = 'ready' AND attempts = 1"); n != 1 {
		t.Fatalf("the old relay changed the new owner's delivery")
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d rows left after the new owner recorded them", n)
	}
}

// A relay prepares its statements once per connection, and PostgreSQL
// keeps a statement's generic plan, made for the tables' sizes when it was
// first run, until a table is analyzed. The deliveries table is empty while
// nothing fails and grows by a row per event while a sink is down; the
// outbox may be nearly empty for days and then take a burst. Plans made
// for small tables would read the whole table (a sequential scan, or a hash
// of it) on every claim and record once they grew: a record that took
// milliseconds took 1.5 s on a 200,000-row outbox. Every claim and record
// statement, planned on small tables, must still reach the grown tables
// only through their indexes. The statistics counters say so exactly.
func TestStatementsKeepToTheIndexesAsTablesGrow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, tbl := range []string{b.tables.Outbox(), b.tables.Deliveries()} {
		// Nothing may replan the statements but the test.
		if _, err := b.pool.Exec(ctx, "ALTER TABLE "+tbl+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one session: its plans, its statistics
	ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := newRelayOn(pool, b.tables, "grow")
	if _, _, err := s.takeLanes(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseAll(ctx, s.owner)

	// round runs every claim and record statement: events of key k fail
	// on sink a and queue there, then their queue is worked (delivered,
	// retried, dead, the next made head), an event of the routing step is
	// routed, and an event goes out at once.
	round := func(key string) {
		t.Helper()
		seqs := b.insert(t, ev{topic: "t", key: key}, ev{topic: "t", key: key}, ev{topic: "t", key: key}, ev{topic: "t"})
		claim := func() ([]store.Claimed, []store.Claimed) {
			t.Helper()
			fresh, queued, err := s.claim(ctx, 1000, "", "a")
			if err != nil {
				t.Fatal(err)
			}
			return fresh, queued
		}
		record := func(o *store.Outcome) {
			t.Helper()
			if _, err := s.record(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		claim()
		o := &store.Outcome{OutboxSeqs: seqs[:3]}
		o.FromOutbox.Add(seqs[0], "a", "ready", false, 1, 0, boom)
		o.FromOutbox.Add(seqs[1], "a", "waiting", false, 0, 0, sql.NullString{})
		o.FromOutbox.Add(seqs[2], "", "waiting", false, 0, 0, sql.NullString{})
		record(o) // fan out
		claim()
		o = &store.Outcome{}
		o.Delete("a", seqs[0])
		o.Heads.Add(seqs[1], "a", "ready", false, 1, 0, boom)
		o.PromoteKeys, o.PromoteSinks = []string{key}, []string{"a"}
		record(o) // the head delivered, its follower failed
		claim()
		o = &store.Outcome{}
		o.Demote.Add(seqs[1], "a", "dead", false, 2, 0, boom)
		o.FromRouting.Add(seqs[2], "a", "ready", false, 0, 0, sql.NullString{})
		o.Delete("", seqs[2])
		o.PromoteKeys, o.PromoteSinks = []string{key, key}, []string{"a", ""}
		record(o) // dead; the routing step's delivery routed
		claim()
		record(&store.Outcome{OutboxSeqs: seqs[3:]}) // delivered at once
	}
	counters := func() (seqScans, idxScans, idxRead int64) {
		t.Helper()
		// This session's counters reach the statistics views once flushed.
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if err := b.pool.QueryRow(ctx, `SELECT sum(seq_scan), sum(coalesce(idx_scan, 0)),
       (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relid IN (to_regclass($1), to_regclass($2)))
FROM pg_stat_user_tables
WHERE relid IN (to_regclass($1), to_regclass($2))`, b.tables.Outbox(), b.tables.Deliveries()).Scan(&seqScans, &idxScans, &idxRead); err != nil {
			t.Fatal(err)
		}
		return seqScans, idxScans, idxRead
	}

	// The relay's upkeep vacuums and analyzes the tables while they are
	// empty: the planner then costs reading them whole at nothing.
	for _, tbl := range []string{b.tables.Outbox(), b.tables.Deliveries()} {
		if _, err := b.pool.Exec(ctx, "VACUUM (ANALYZE) "+tbl); err != nil {
			t.Fatal(err)
		}
	}
	round("small") // plans made for the small tables

	// The tables grow: a backlog in the outbox, a queue behind 1,000 heads.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.tables.Outbox()+` (topic, key, available_at)
SELECT 't', 'k' || (g % 1000), now() + interval '1 hour' FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, created_at, state, next_at)
SELECT 'a', -g, hashtext('q' || (g % 1000)) & 63, gen_random_uuid(), 't', 'q' || (g % 1000), now(),
       CASE WHEN g <= 1000 THEN 'ready' ELSE 'waiting' END, CASE WHEN g <= 1000 THEN now() + interval '1 hour' END
FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	// The relay's upkeep sees the growth and has the statements planned
	// again for the new sizes.
	done, err := s.MaintainTables(ctx, 20000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(done.Analyzed, b.tables.Deliveries()) {
		t.Fatalf("maintainTables did %+v, want the grown deliveries table analyzed", done)
	}
	seqBefore, idxBefore, readBefore := counters()
	round("large")
	seqAfter, idxAfter, readAfter := counters()
	if seqAfter != seqBefore {
		t.Fatalf("%d sequential scans of the grown outbox and deliveries tables by the claim and record statements, want none", seqAfter-seqBefore)
	}
	if idxAfter == idxBefore {
		t.Fatal("no index scans counted: the round did not reach the tables")
	}
	// The round's statements touch a handful of rows; a plan that walks
	// the 1,000 heads (or the 50,000-row backlog) for each of them reads
	// thousands of index entries.
	if read := readAfter - readBefore; read > 500 {
		t.Fatalf("the round read %d index entries, want a few: a statement walks an index instead of probing it", read)
	}
}
