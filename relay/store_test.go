package relay

import (
	"context"
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"
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
	var plan strings.Builder
	rows, err := conn.Query(ctx, "EXPLAIN EXECUTE claim(65535, 1000, 'plan-test', '30 seconds', '{mem}', 0, 15)")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := plan.String()
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
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+s.claimSQL,
		int64(-1), 1000, "plan-test", "30 seconds", []string{"mem"}, 0, 63)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := plan.String()
	if !strings.Contains(got, "rows=100 ") {
		t.Fatalf("the claim did not claim the 100 events:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "holds_pkey") && !strings.Contains(line, "never executed") {
			t.Fatalf("the claim looked up holds although there are none:\n%s", got)
		}
	}
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
