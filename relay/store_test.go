package relay

import (
	"context"
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	got := queryPlan(t, conn, "EXPLAIN EXECUTE claim(65535, 1000, '{mem}', 0, 15)")
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

// With no holds at all, a claim must not look up holds for each claimed
// row: the lookups ran once per row (two index probes each) while an ON
// clause meant to skip them was evaluated only after them.
func TestClaimSkipsHoldLookupsWithoutHolds(t *testing.T) {
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
		int64(-1), 1000, []string{"mem"}, 0, 63)
	if !strings.Contains(got, "rows=100 ") {
		t.Fatalf("the claim did not claim the 100 events:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "holds_pkey") && !strings.Contains(line, "never executed") {
			t.Fatalf("the claim looked up holds although there are none:\n%s", got)
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
				held, _, err := s.refreshLanes(ctx, lease)
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
// or retry) would overwrite theirs. Writes are fenced by lane, and a record
// in flight keeps its lanes from being taken over until it commits.
func TestRecordIsFencedByLanes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seqs := b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"}, ev{topic: "t"})
	const lease = time.Second
	old := newStore(b.pool, b.tables, "old-relay")
	if _, _, err := old.refreshLanes(ctx, lease); err != nil {
		t.Fatal(err)
	}
	rows, err := old.claim(ctx, ^uint64(0), 10, nil)
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
	if _, err := tx.Exec(ctx, old.deleteSQL, []int64{seqs[0]}, old.owner); err != nil {
		t.Fatal(err)
	}
	next := newStore(b.pool, b.tables, "new-relay")
	if held, _, err := next.refreshLanes(ctx, lease); err != nil || held != 0 {
		t.Fatalf("took lanes %064b (%v) while the old relay was recording on them", held, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d rows left after the old relay recorded one on its lanes, want 2", n)
	}

	// Once the lanes are taken over, the old relay's records change nothing.
	held, takenOver, err := next.refreshLanes(ctx, lease)
	if err != nil || held != ^uint64(0) || takenOver != ^uint64(0) {
		t.Fatalf("new relay holds %064b, took over %064b: %v", held, takenOver, err)
	}
	if err := old.record(ctx, &outcome{done: seqs[1:]}, false); err != nil {
		t.Fatal(err)
	}
	retry := &outcome{done: seqs[1:2]}
	retry.update(seqs[2], "pending", 1, time.Now().Add(time.Hour), "boom", []byte(`{}`))
	if err := old.record(ctx, retry, false); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "attempts = 0 AND last_error IS NULL AND available_at <= now()"); n != 2 {
		t.Fatalf("%d of 2 rows untouched after records by a relay that lost their lanes", n)
	}
	if err := next.record(ctx, &outcome{done: seqs[1:]}, false); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d rows left after the new owner recorded them", n)
	}
}
