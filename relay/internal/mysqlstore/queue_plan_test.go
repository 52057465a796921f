package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// TestQueuePredicatesUseTheirIndexes: the statements that find a queue's
// head, its members or the dead letters (the relay's claims, promotion and
// head checks, the operators' listing, held keys, key queues and Show)
// test them on the virtual columns that stand for PostgreSQL's partial
// indexes (head_key for head_idx, queue_key for queue_idx, head_lane for
// head_lane_idx) or on dead_letter_idx's leading columns: each statement's
// plan reads the indexes it is written for. A condition written on `key`
// and state instead would read the table.
func TestQueuePredicatesUseTheirIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dl := b.tables.Deliveries()
	// 400 keys with a queue of 50 deliveries on sink s (a head, ready or
	// dead and stopping the key, then 49 waiting), and 2,000 dead letters
	// that left their queue on sink x, analyzed; and some outbox rows for
	// the claim.
	const numbers = `(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS i
FROM (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
      UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a,
     (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
      UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b,
     (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
      UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c,
     (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
      UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) e,
     (SELECT 0 d UNION ALL SELECT 1) f) n`
	for _, q := range []string{
		`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, ` + "`key`" + `, payload, created_at, state, stops_key, attempts, next_at, dead_at)
SELECT 's', i, i % 64, uuid(), 't', concat('k', i DIV 50), '{}', utc_timestamp(6),
       CASE WHEN i % 50 <> 0 THEN 'waiting' WHEN i % 100 = 0 THEN 'dead' ELSE 'ready' END,
       i % 100 = 0, CASE WHEN i % 50 = 0 THEN 1 ELSE 0 END,
       CASE WHEN i % 50 = 0 AND i % 100 <> 0 THEN utc_timestamp(6) END, CASE WHEN i % 100 = 0 THEN utc_timestamp(6) END
FROM ` + numbers + ` WHERE i BETWEEN 1 AND 20000`,
		`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, ` + "`key`" + `, payload, created_at, state, attempts, dead_at)
SELECT 'x', i, i % 64, uuid(), 't', concat('k', i DIV 50), '{}', utc_timestamp(6), 'dead', 3, utc_timestamp(6)
FROM ` + numbers + ` WHERE i BETWEEN 1 AND 20000 AND i % 10 = 1`,
		`ANALYZE TABLE ` + dl,
	} {
		if err := drain(b.db.QueryContext(ctx, q)); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	b.insert(t, ev{topic: "t", key: "k1"}, ev{topic: "t", key: "k2"})
	var id string
	if err := b.db.QueryRow(`SELECT id FROM ` + dl + ` WHERE sink = 's' AND seq = 75`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	relay, op := New(b.db, b.tables, Config{}), NewOperator(b.db, b.tables)
	list, listArgs, err := deadLetterFilter(op.sql.list, store.DeadLetterFilter{}, store.DeadLetterPosition{Seq: 0}, false)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	claimArgs := append([]any{int64(16 << 20), int64(16 << 20), int64(16 << 20)}, lanes(^uint64(0))...)
	claimArgs = append(claimArgs, int64(0), start, start, int64(0), "", "", 1000, int64(64<<20))
	pairs := `[{"key": "k1", "sink": "s"}, {"key": "k2", "sink": "s"}]`
	outcomes := `[{"seq": 75, "sink": "s", "state": "ready"}, {"seq": 150, "sink": "s", "state": "ready"}]`
	for _, st := range []struct {
		name string
		sql  string
		args []any
		uses []string
		// considered: the index need only be among the plan's possible
		// keys (its predicate matches), the optimizer choosing by cost.
		considered bool
	}{
		{"claim", inList(relay.sql.claimFresh, 1), claimArgs, []string{"head_lane_idx", "head_idx"}, false},
		// MariaDB reads the few ready rows on dead_letter_idx (state
		// leads it) and sorts them, rather than walk due_idx.
		{"queue claim's heads", relay.sql.claimHead, append(append([]any{1, "s"}, lanes(^uint64(0))...), "", "", 100), []string{"due_idx"}, true},
		{"queue claim's followers", relay.sql.claimFollow, []any{1, 1, 100, "s", 50, 1, 1, 100, "k1", "s", 50, 100}, []string{"queue_idx"}, false},
		{"record's head check", relay.sql.taken, []any{outcomes}, []string{"head_idx"}, false},
		{"promotion", relay.sql.promoteFind, []any{pairs}, []string{"head_idx", "queue_idx"}, false},
		{"dead letters", list, append(listArgs, 100), []string{"dead_letter_idx"}, false},
		{"held keys", op.sql.heldKeys, []any{100}, []string{"head_idx", "queue_idx"}, false},
		{"key heads", op.sql.keyHeads, []any{"k1"}, []string{"head_idx"}, false},
		{"key queue", op.sql.keyQueue, []any{"k1", "s", 100}, []string{"queue_idx"}, false},
		{"show", op.sql.showDeliveries, []any{id}, []string{"delivery_id_idx", "head_idx"}, false},
	} {
		keys, possible, plan := explainKeys(t, b.db, st.sql, st.args...)
		if st.considered {
			keys = possible
		}
		for _, index := range st.uses {
			if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, "_"+index) }) {
				t.Errorf("%s does not read %s:\n%s", st.name, index, plan)
			}
		}
	}
}

// explainKeys runs EXPLAIN stmt and returns the indexes its plan reads
// (the key column), those it could read (possible_keys) and the plan's
// rows.
func explainKeys(t *testing.T, db *sql.DB, stmt string, args ...any) (keys, possible []string, plan string) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", stmt, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var lines []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		// A merge of indexes lists them comma separated.
		keys = append(keys, strings.Split(row["key"], ",")...)
		possible = append(possible, strings.Split(row["possible_keys"], ",")...)
		lines = append(lines, fmt.Sprint(row))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return keys, possible, strings.Join(lines, "\n")
}
