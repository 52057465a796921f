package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
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
	s := New(b.pool, b.tables)
	for _, sql := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE claim AS " + s.sql.claimSQL} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	got := queryPlan(t, conn, "EXPLAIN EXECUTE claim(65535, 1000, 0, 15, '{}', 16777216, 67108864, '', '-infinity', 0)")
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
	s := New(b.pool, b.tables)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	got := queryPlan(t, tx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+s.sql.claimSQL,
		int64(-1), 1000, 0, 63, []int64{}, int64(16<<20), int64(64<<20), "", noPosition, int64(0))
	if !strings.Contains(got, "rows=100 ") {
		t.Fatalf("the claim did not claim the 100 events:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, "head_idx") && strings.Contains(line, "key = c.key") && !strings.Contains(line, "never executed") {
			t.Fatalf("the claim looked up queues although there are none:\n%s", got)
		}
	}
}

// TestHotKeyClaimIsLinear: a key with a thousand events, all behind a
// failing head on three sinks, costs the claim one probe of the head index
// per event, not a scan of the key's queue per event (the earlier hold
// lookup was quadratic: 1.46 s per claim); the events of other keys are
// looked up only when they share its lane. A dead letter that does not
// stop its key leaves the claim's lookups off.
func TestHotKeyClaimIsLinear(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	s := New(b.pool, b.tables)
	explain := func() string {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		return queryPlan(t, tx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+s.sql.claimSQL, int64(-1), 1000, 0, 63, []int64{}, int64(16<<20), int64(64<<20), "", noPosition, int64(0))
	}
	// inQueue moves the outbox rows of key into deliveries on sinks, in
	// state (ready or dead).
	inQueue := func(key, state string, sinkNames ...string) {
		for _, sink := range sinkNames {
			if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, created_at, state, next_at, dead_at)
SELECT $1, seq, hashtext(key) & 63, id, topic, key, created_at, $3,
       CASE WHEN $3 = 'ready' THEN now() + interval '1 hour' END, CASE WHEN $3 = 'dead' THEN now() END
FROM `+b.tables.Outbox()+` WHERE key = $2`, sink, key, state); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.tables.Outbox()); err != nil {
			t.Fatal(err)
		}
	}
	evs := make([]ev, 1000)

	// A dead letter that does not stop its key is no queue.
	b.insert(t, ev{topic: "t", key: "cold"})
	inQueue("cold", "dead", "a")
	for i := range evs {
		evs[i] = ev{topic: "t", key: "cold"}
	}
	b.insert(t, evs...)
	if plan := explain(); strings.Contains(plan, "key = c.key") && !strings.Contains(plan, "never executed") {
		t.Fatalf("a dead letter that does not stop its key turned the queue lookups on:\n%s", plan)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.tables.Outbox()); err != nil {
		t.Fatal(err)
	}

	// A head on each of three sinks for key "hot".
	b.insert(t, ev{topic: "t", key: "hot"})
	inQueue("hot", "ready", "a", "b", "c")
	for i := range evs {
		evs[i] = ev{topic: "t", key: "hot"}
	}
	b.insert(t, evs...)
	// lookups returns the loops of the claim's head lookup and the index
	// entries it read over all of them.
	lookups := func(plan string) (loops, read int) {
		for _, line := range strings.Split(plan, "\n") {
			if strings.Contains(line, "using outbox_head_idx") && strings.Contains(line, "actual rows=") {
				var rows, n int
				if _, err := fmt.Sscanf(line[strings.Index(line, "actual rows="):], "actual rows=%d loops=%d", &rows, &n); err == nil {
					loops, read = loops+n, read+rows*n
				}
			}
		}
		return loops, read
	}
	plan := explain()
	if _, read := lookups(plan); read == 0 || read > 3*1000 {
		t.Fatalf("the claim read %d head index entries for 1,000 events of one key queued on 3 sinks, want about 3,000:\n%s", read, plan)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM `+b.tables.Outbox()); err != nil {
		t.Fatal(err)
	}

	// Events of a thousand other keys look the head index up only in the
	// hot key's lane.
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("c%d", i)}
	}
	b.insert(t, evs...)
	var sameLane int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.tables.Outbox()+`
WHERE hashtext(key) & 63 = hashtext('hot') & 63`).Scan(&sameLane); err != nil {
		t.Fatal(err)
	}
	plan = explain()
	if loops, _ := lookups(plan); loops != sameLane {
		t.Fatalf("the claim looked %d events up in the head index, want the %d in the hot key's lane:\n%s", loops, sameLane, plan)
	}
}
