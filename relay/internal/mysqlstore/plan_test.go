package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The claim walks claim_idx in its order (status the key, available_at and
// the lane tested on the index entry: "Using index condition"), without
// sorting the pending rows: only the batch it read is sorted (for the byte
// budget and the final order). Checked on a backlog of 20,000 rows in
// every state of InnoDB's statistics a relay meets: never analyzed,
// analyzed while the table was nearly empty, analyzed mid-drain, and row
// counts far off either way.
func TestClaimWalksTheClaimIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	evs := make([]ev, 2000)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%1000)}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := b.db.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	fill := func() {
		for range 10 {
			b.insert(t, evs...)
		}
	}
	r := b.relay(t, "r1")
	table := strings.Trim(b.tables.Outbox(), "`")
	b.insert(t, evs[:10]...)
	exec("ANALYZE TABLE " + b.tables.Outbox())
	fill()
	checkClaimPlan(t, r, "analyzed while nearly empty")
	exec("ANALYZE TABLE " + b.tables.Outbox())
	checkClaimPlan(t, r, "analyzed")
	exec("DELETE FROM " + b.tables.Outbox() + " WHERE seq % 20 <> 0")
	fill()
	checkClaimPlan(t, r, "analyzed mid-drain")
	for _, n := range []int64{1, 1_000_000_000} {
		res, err := b.db.Exec("UPDATE mysql.innodb_table_stats SET n_rows = ? WHERE database_name = database() AND table_name = ?", n, table)
		if err != nil {
			t.Fatal(err)
		}
		if changed, _ := res.RowsAffected(); changed != 1 {
			t.Fatalf("the outbox's persistent statistics: %d rows changed, want 1", changed)
		}
		exec("FLUSH TABLE " + b.tables.Outbox())
		checkClaimPlan(t, r, fmt.Sprintf("%d rows in the statistics", n))
	}
}

// checkClaimPlan fails unless the claim walks claim_idx without sorting
// the pending rows.
func checkClaimPlan(t *testing.T, r *relayOn, state string) {
	t.Helper()
	args := []any{int64(16 << 20), int64(16 << 20), int64(16 << 20)}
	args = append(args, lanes(0xffff)...)
	start := time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	args = append(args, int64(0), start, start, int64(0), "", "", 1000, int64(64<<20))
	rows, err := r.db.QueryContext(context.Background(), "EXPLAIN "+inList(r.sql.claimFresh, 1), args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
	walked, bad := false, false
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
		plan = append(plan, fmt.Sprint(row))
		if row["table"] == "outbox" && row["key"] == "outbox_claim_idx" {
			walked = true
			bad = bad || strings.Contains(row["Extra"], "filesort")
		}
	}
	if !walked || bad {
		t.Errorf("%s: the claim does not walk claim_idx in its order:\n%s", state, strings.Join(plan, "\n"))
	}
}

// A record locks its batch's rows on the primary key's range: a batch of
// 1,000 seqs is not turned into a join with a sorted temporary table
// (keepsInList), on a table of 2,000 rows with InnoDB's statistics.
func TestLockRowsKeepsThePrimaryKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := make([]ev, 2000)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%100)}
	}
	b.insert(t, evs...)
	if _, err := b.db.Exec("ANALYZE TABLE " + b.tables.Outbox()); err != nil {
		t.Fatal(err)
	}
	r := b.relay(t, "r1")
	var first int64
	if err := r.db.QueryRowContext(ctx, "SELECT min(seq) FROM "+b.tables.Outbox()).Scan(&first); err != nil {
		t.Fatal(err)
	}
	args := make([]any, 0, 1003)
	for i := range int64(1000) {
		args = append(args, first+i)
	}
	args = append(args, lanes(^uint64(0))...)
	stmt := strings.TrimPrefix(inList(r.sql.lockRows, 1000), keepsInList)
	rows, err := r.db.QueryContext(ctx, keepsInList+"EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
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
		plan = append(plan, fmt.Sprint(row))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(plan) != 1 || !strings.Contains(plan[0], "key:PRIMARY") || !strings.Contains(plan[0], "type:range") {
		t.Errorf("lockRows of 1,000 seqs is not one range on the primary key:\n%s", strings.Join(plan, "\n"))
	}
}
