package pgstore

import (
	"context"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestQueuePredicatesUseTheirIndexes: the statements that find a queue's
// head, its members or the dead letters (the relay's claims and promotion,
// the operators' listing, replay, held keys, key queues and Show) write
// their predicates so that the planner matches the partial indexes of
// migration 005 (head_idx and head_lane_idx, queue_idx, dead_letter_idx):
// each statement's plan, as the store runs it, reads the indexes it is
// written for. A predicate written differently (a condition reordered, a
// column of another alias) would not match a partial index, and the
// statement would read the deliveries table instead.
func TestQueuePredicatesUseTheirIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dl := b.tables.Deliveries()
	// 400 keys with a queue of 50 deliveries on sink s (a head, ready or
	// dead and stopping the key, then 49 waiting), and 2,000 dead letters
	// that left their queue on sink x, analyzed.
	for _, q := range []string{
		`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, key, payload, created_at, state, stops_key, attempts, next_at, dead_at)
SELECT 's', i, i % 64, gen_random_uuid(), 't', 'k' || (i / 50), '{}', now(),
       CASE WHEN i % 50 <> 0 THEN 'waiting' WHEN i % 100 = 0 THEN 'dead' ELSE 'ready' END,
       i % 100 = 0, CASE WHEN i % 50 = 0 THEN 1 ELSE 0 END,
       CASE WHEN i % 50 = 0 AND i % 100 <> 0 THEN now() END, CASE WHEN i % 100 = 0 THEN now() END
FROM generate_series(1, 20000) i`,
		`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, key, payload, created_at, state, attempts, dead_at)
SELECT 'x', i, i % 64, gen_random_uuid(), 't', 'k' || (i / 50), '{}', now(), 'dead', 3, now()
FROM generate_series(1, 20000, 10) i`,
		`ANALYZE ` + dl,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var id string
	if err := b.pool.QueryRow(ctx, `SELECT id::text FROM `+dl+` WHERE sink = 's' AND seq = 75`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	relay, op := New(b.pool, b.tables), NewOperator(b.pool, b.tables)
	filter := []any{int64(0), "", nil, pgtype.Text{}, pgtype.Text{}, pgtype.Text{}, pgtype.Text{},
		pgtype.Timestamptz{}, pgtype.Timestamptz{}, nil, 100}
	for _, st := range []struct {
		name  string
		setup string // the plan settings the store runs the statement under
		sql   string
		args  []any
		uses  []string // an index each, alternatives separated by |
	}{
		{"claim", relay.sql.planSQL, relay.sql.claimSQL,
			[]any{int64(-1), 1000, 0, 63, []int64{}, int64(16 << 20), int64(64 << 20), "", noPosition, int64(0)},
			[]string{"head_lane_idx", "head_idx"}},
		{"queue claim", relay.sql.planSQL, relay.sql.claimQueueSQL,
			[]any{[]string{"s"}, int64(-1), 0, 63, []int32{100}, int64(16 << 20), int64(64 << 20), "", []int32{1000}, []int32{1000}},
			[]string{"due_idx", "queue_idx"}},
		{"record's promotion", relay.sql.planSQL, relay.sql.promoteSQL,
			[]any{[]string{"k1", "k2"}, []string{"s", "s"}, "r", epochs(&allLanes)},
			[]string{"head_idx", "queue_idx"}},
		{"operator's promotion", op.sql.pagePlanSQL, op.sql.promoteSQL,
			[]any{[]string{"k1", "k2"}, []string{"s", "s"}},
			[]string{"head_idx", "queue_idx"}},
		{"dead letters", op.sql.pagePlanSQL, op.sql.listSQL, filter, []string{"dead_letter_idx"}},
		{"replay", op.sql.pagePlanSQL, op.sql.replaySQL, append(filter, false), []string{"dead_letter_idx"}},
		{"held keys", op.sql.pagePlanSQL, op.sql.heldKeysSQL, []any{100}, []string{"head_idx|head_lane_idx", "queue_idx"}},
		{"key queues", op.sql.pagePlanSQL, op.sql.keyQueuesSQL, []any{"k1", 100}, []string{"head_idx", "queue_idx"}},
		{"show", "SELECT 1", op.sql.showDeliveriesSQL, []any{id}, []string{"delivery_id_idx", "head_idx"}},
	} {
		// No sequential scan, as the claims run: what is left is the
		// indexes the predicates match, and an index whose predicate a
		// statement does not imply is never a candidate.
		plan := explainAfter(t, b, []string{st.setup, "SET LOCAL enable_seqscan = off"}, st.sql, st.args)
		for _, index := range st.uses {
			if !regexp.MustCompile(`using \S*(` + index + `) on `).MatchString(plan) {
				t.Errorf("%s does not read %s:\n%s", st.name, index, plan)
			}
		}
	}
}
