package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestPlansIgnoreStatistics: the claim (of every lane and of half of
// them), the queue claim and the happy record keep their index plans,
// reading rows in the index's order, whatever the statistics say: never
// analyzed, analyzed while the table was nearly empty, analyzed mid-drain,
// row counts far off, index walks made to look expensive. A claim planned
// from statistics taken mid-drain once read every pending row of its lanes
// through a bitmap and sorted them for the first thousand.
func TestPlansIgnoreStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	s := New(b.pool, b.tables)
	o, dl := b.tables.Outbox(), b.tables.Deliveries()
	exec := func(q string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	fill := func(n int) {
		exec(fmt.Sprintf("INSERT INTO %s (topic, key, payload) SELECT 't', 'k' || (i %% 500), '{}' FROM generate_series(1, %d) i", o, n))
		exec(fmt.Sprintf(`INSERT INTO %s (sink, seq, lane, id, topic, key, payload, created_at, state, next_at)
SELECT 's', seq, lane, gen_random_uuid(), 't', 'q' || (seq / 10), '{}', now(),
       CASE WHEN seq %% 10 = 0 THEN 'ready' ELSE 'waiting' END, CASE WHEN seq %% 10 = 0 THEN now() END
FROM (SELECT nextval(pg_get_serial_sequence('%s', 'seq')) AS seq, i %% 64 AS lane FROM generate_series(1, %d / 10) i) x`, dl, o, n))
	}
	exec("ALTER TABLE " + o + " SET (autovacuum_enabled = false)")
	exec("ALTER TABLE " + dl + " SET (autovacuum_enabled = false)")
	check := func(state string, tune ...string) {
		t.Helper()
		for _, st := range []struct {
			name string
			sql  string
			args []any
		}{
			{"claim of every lane", s.sql.claimSQL, []any{int64(-1), 1000, 0, 63, []int64{}, int64(16 << 20), int64(64 << 20), "", noPosition, int64(0)}},
			{"claim of half the lanes", s.sql.claimSQL, []any{int64(1<<32 - 1), 1000, 0, 31, []int64{}, int64(16 << 20), int64(64 << 20), "", noPosition, int64(0)}},
			{"queue claim", s.sql.claimQueueSQL, []any{[]string{"s", ""}, int64(-1), 0, 63, []int32{1000, 1000}, int64(16 << 20), int64(64 << 20), "", []int32{1000, 1000}, []int32{1000, 1000}}},
			{"happy record", s.sql.removals[0][0].happy, []any{"r", []int64{1, 2, 3, 1000, 20000}, epochs(&allLanes)}},
		} {
			plan := explain(t, b, s, st.sql, st.args, tune)
			if why := badPlan(plan); why != "" {
				t.Errorf("%s, %s: %s:\n%s", state, st.name, why, plan)
			}
		}
	}
	fill(30000)
	check("never analyzed")
	check("index walks look expensive", "SET LOCAL random_page_cost = 1000")
	check("row counts far off, small", "UPDATE pg_class SET reltuples = 1 WHERE oid IN ('"+o+"'::regclass, '"+dl+"'::regclass)")
	check("row counts far off, large", "UPDATE pg_class SET reltuples = 1e9 WHERE oid IN ('"+o+"'::regclass, '"+dl+"'::regclass)")
	exec("DELETE FROM " + o)
	exec("DELETE FROM " + dl)
	fill(10)
	exec("VACUUM ANALYZE " + o)
	exec("VACUUM ANALYZE " + dl)
	fill(30000)
	check("analyzed while nearly empty")
	exec("ANALYZE " + o)
	exec("ANALYZE " + dl)
	exec("DELETE FROM " + o + " WHERE seq % 30 <> 0")
	fill(30000)
	check("analyzed mid-drain")
}

// allLanes is every lane under epoch 0, a fresh schema's.
var allLanes = func() (l store.Leases) {
	for lane := range 64 {
		l.Add(lane, 0)
	}
	return l
}()

// explain returns the plan of stmt as a relay runs it: after planSQL, in
// one transaction, with tune's statements first.
func explain(t *testing.T, b *bundle, s *Store, stmt string, args []any, tune []string) string {
	t.Helper()
	return explainAfter(t, b, append(tune, s.sql.planSQL), stmt, args)
}

// explainAfter returns the plan of stmt run after the statements setup, in
// one transaction.
func explainAfter(t *testing.T, b *bundle, setup []string, stmt string, args []any) string {
	t.Helper()
	ctx := context.Background()
	var lines []string
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, q := range setup {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+stmt, args...)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		return tx.Rollback(ctx) // the tuning goes
	})
	if err != nil && !strings.Contains(err.Error(), "tx is closed") {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// badPlan says what is wrong with a plan: a sequential or bitmap scan, or
// a sort whose input is a table's scan (rows read out of order, all of
// them, to be sorted for a LIMIT); "" when nothing is.
func badPlan(plan string) string {
	lines := strings.Split(plan, "\n")
	for i, l := range lines {
		switch {
		case strings.Contains(l, "Seq Scan"):
			return "a sequential scan"
		case strings.Contains(l, "Bitmap"):
			return "a bitmap scan"
		case strings.Contains(l, "Sort  (") || strings.Contains(l, "Sort (") || strings.HasSuffix(strings.TrimSpace(l), "Sort"):
			indent := len(l) - len(strings.TrimLeft(l, " ->"))
			for _, child := range lines[i+1:] {
				if !strings.Contains(child, "->") {
					continue
				}
				if len(child)-len(strings.TrimLeft(child, " ->")) <= indent {
					break
				}
				if strings.Contains(child, " Scan ") && (strings.Contains(child, " on outbox ") || strings.Contains(child, " on outbox_deliveries ")) {
					return "a sort of a table's scan: " + strings.TrimSpace(child)
				}
				break // the first child is the sort's input
			}
		}
	}
	return ""
}

// noPosition is a claim's start at the beginning of the index.
var noPosition = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
