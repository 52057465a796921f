package relay

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations/pgtest"
)

// The claim must test a relay's lane range on the claim index's entries
// (no heap fetch for other relays' rows) and keep the index's order (no
// sort of the pending set). Both depend on the claim's lane expression
// matching the index's exactly, and on the planner's choice with realistic
// statistics, so this reads the generic plan relay sessions use.
func TestClaimTestsLanesOnTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := make([]ev, 20000)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%1000)}
		if i%10 == 0 {
			evs[i].key = ""
		}
	}
	b.insert(t, evs...)
	if _, err := b.pool.Exec(ctx, "ANALYZE "+b.tables.Outbox()); err != nil {
		t.Fatal(err)
	}

	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	s := newStore(b.pool, b.tables, "plan-test")
	for _, sql := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE claim AS " + s.claimSQL} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	got := queryPlan(t, conn, "EXPLAIN EXECUTE claim(65535, 1000, 0, 15, '{}', 16777216, 67108864, '')")
	if !strings.Contains(got, "claim_lane_idx") {
		t.Fatalf("the claim does not use the claim index:\n%s", got)
	}
	laneOnIndex := false
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "Index Cond:") && strings.Contains(line, "hashtext(COALESCE(key, (id)::text))") {
			laneOnIndex = true
		}
	}
	if !laneOnIndex {
		t.Fatalf("the lane range is not tested on the index entries:\n%s", got)
	}
	// The only sort allowed is the final ORDER BY of the (small) batch.
	if n := strings.Count(got, "Sort  ") + strings.Count(got, "Sort (cost"); n > 1 {
		t.Fatalf("the claim sorts pending rows (%d sorts):\n%s", n, got)
	}
}

// With no queue anywhere (nothing has failed), a claim must not look up
// queues for each claimed row: the lookups are gated by one EXISTS.
func TestClaimSkipsQueueLookupsWithoutQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := make([]ev, 100)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%10)}
	}
	b.insert(t, evs...)
	s := newStore(b.pool, b.tables, "plan-test")
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	got := queryPlan(t, tx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+s.claimSQL,
		int64(-1), 1000, 0, 63, []int64{}, int64(16<<20), int64(64<<20), "")
	if !strings.Contains(got, "rows=100 ") {
		t.Fatalf("the claim did not claim the 100 events:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "head_idx") && strings.Contains(line, "key = c.key") && !strings.Contains(line, "never executed") {
			t.Fatalf("the claim looked up queues although there are none:\n%s", got)
		}
	}
}

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

// Relays that join one after another end up with a block of neighbouring
// lanes each, so that each claim's lane range covers few lanes of others.
func TestLanesStayInBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const lease = 30 * time.Second
	var stores []*store
	masks := map[string]uint64{}
	for i := range 4 {
		stores = append(stores, newStore(b.pool, b.tables, fmt.Sprintf("relay-%d", i)))
		if err := stores[i].heartbeat(ctx, lease); err != nil {
			t.Fatal(err)
		}
		// A few rounds: those over their share release, then the others
		// take what was released.
		for range 3 {
			for _, s := range stores {
				held, _, _, err := s.refreshLanes(ctx, lease, nil)
				if err != nil {
					t.Fatal(err)
				}
				masks[s.owner] = held
			}
		}
	}
	var union uint64
	for owner, m := range masks {
		if n := bits.OnesCount64(m); n != 16 {
			t.Errorf("%s holds %d lanes, want 16 (%064b)", owner, n, m)
		}
		lowest, highest := bits.TrailingZeros64(m), 63-bits.LeadingZeros64(m)
		if span := highest - lowest + 1; span != 16 {
			t.Errorf("%s holds lanes %d..%d with gaps (%064b)", owner, lowest, highest, m)
		}
		if union&m != 0 {
			t.Errorf("%s shares lanes with another relay", owner)
		}
		union |= m
	}
	if union != ^uint64(0) {
		t.Errorf("lanes not held: %064b", ^union)
	}
}

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
	old := newStore(b.pool, b.tables, "old-relay")
	if _, _, _, err := old.refreshLanes(ctx, lease, nil); err != nil {
		t.Fatal(err)
	}
	rows, _, err := old.claim(ctx, ^uint64(0), rowLimit(10), []string{""}, []int32{10}, 10, nil)
	if err != nil || len(rows) != 3 {
		t.Fatalf("claimed %d rows: %v", len(rows), err)
	}

	// While a record holds the old relay's lanes, they cannot be taken.
	time.Sleep(lease + 100*time.Millisecond)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, old.removals[0][0].happy, old.owner, []int64{seqs[0]}); err != nil {
		t.Fatal(err)
	}
	next := newStore(b.pool, b.tables, "new-relay")
	if held, _, _, err := next.refreshLanes(ctx, lease, nil); err != nil || held != 0 {
		t.Fatalf("took lanes %064b (%v) while the old relay was recording on them", held, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d rows left after the old relay recorded one on its lanes, want 2", n)
	}

	// Once the lanes are taken over, the old relay's records change nothing.
	held, takenOver, _, err := next.refreshLanes(ctx, lease, nil)
	if err != nil || held != ^uint64(0) || takenOver != ^uint64(0) {
		t.Fatalf("new relay holds %064b, took over %064b: %v", held, takenOver, err)
	}
	if _, err := old.record(ctx, &outcome{outboxSeqs: seqs[1:]}, false); err != nil {
		t.Fatal(err)
	}
	retry := &outcome{outboxSeqs: seqs[1:]}
	retry.fromOutbox.add(seqs[2], "mem", "ready", false, 1, time.Now().Add(time.Hour), errBoom)
	if _, err := old.record(ctx, retry, false); err != nil {
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
	failed := &outcome{outboxSeqs: seqs[1:]}
	failed.fromOutbox.add(seqs[1], "mem", "ready", false, 1, time.Now().Add(time.Hour), errBoom)
	if _, err := next.record(ctx, failed, false); err != nil {
		t.Fatal(err)
	}
	if n := b.countDeliveries(t, "state = 'ready' AND attempts = 1"); n != 1 {
		t.Fatalf("%d deliveries after the new owner recorded one, want 1", n)
	}
	stale := &outcome{}
	stale.delete("mem", seqs[1])
	stale.demote.add(seqs[1], "mem", "dead", false, 2, time.Time{}, errBoom)
	stale.heads.add(seqs[1], "mem", "ready", false, 3, time.Now(), errBoom)
	stale.promoteKeys, stale.promoteSinks = []string{"b"}, []string{"mem"}
	if _, err := old.record(ctx, stale, false); err != nil {
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
	s := newStore(pool, b.tables, "grow")
	if _, _, _, err := s.refreshLanes(ctx, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	defer s.releaseAll(ctx)

	// round runs every claim and record statement: events of key k fail
	// on sink a and queue there, then their queue is worked (delivered,
	// retried, dead, the next made head), an event of the routing step is
	// routed, and an event goes out at once.
	round := func(key string) {
		t.Helper()
		seqs := b.insert(t, ev{topic: "t", key: key}, ev{topic: "t", key: key}, ev{topic: "t", key: key}, ev{topic: "t"})
		claim := func() ([]item, []item) {
			t.Helper()
			fresh, queued, err := s.claim(ctx, ^uint64(0), rowLimit(1000), []string{"", "a"}, []int32{1000, 1000}, 1000, nil)
			if err != nil {
				t.Fatal(err)
			}
			return fresh, queued
		}
		record := func(o *outcome) {
			t.Helper()
			if _, err := s.record(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
		claim()
		o := &outcome{outboxSeqs: seqs[:3]}
		o.fromOutbox.add(seqs[0], "a", "ready", false, 1, time.Time{}, errBoom)
		o.fromOutbox.add(seqs[1], "a", "waiting", false, 0, time.Time{}, nil)
		o.fromOutbox.add(seqs[2], "", "waiting", false, 0, time.Time{}, nil)
		record(o) // fan out
		claim()
		o = &outcome{}
		o.delete("a", seqs[0])
		o.heads.add(seqs[1], "a", "ready", false, 1, time.Time{}, errBoom)
		o.promoteKeys, o.promoteSinks = []string{key}, []string{"a"}
		record(o) // the head delivered, its follower failed
		claim()
		o = &outcome{}
		o.demote.add(seqs[1], "a", "dead", false, 2, time.Time{}, errBoom)
		o.fromRouting.add(seqs[2], "a", "ready", false, 0, time.Time{}, nil)
		o.delete("", seqs[2])
		o.promoteKeys, o.promoteSinks = []string{key, key}, []string{"a", ""}
		record(o) // dead; the routing step's delivery routed
		claim()
		record(&outcome{outboxSeqs: seqs[3:]}) // delivered at once
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
	done, err := s.maintainTables(ctx, vacuumAfterDeadTuples)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(done.analyzed, b.tables.Deliveries()) {
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

// rowLimit is a claim's limits at the defaults, with n rows.
func rowLimit(n int) claimLimits {
	cfg := Config{}.WithDefaults()
	return claimLimits{rows: n, bytes: cfg.MaxBatchBytes, eventBytes: cfg.MaxEventBytes}
}
