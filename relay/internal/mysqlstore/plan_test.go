package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
)

// The claim walks claim_idx in its order (status the key, available_at and
// the lane tested on the index entry: "Using index condition"), without
// sorting the pending rows: only the batch it read is sorted (for the byte
// budget and the final order). Checked on a backlog of 20,000 rows with
// InnoDB's statistics.
func TestClaimWalksTheClaimIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := make([]ev, 2000)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%1000)}
	}
	for range 10 {
		b.insert(t, evs...)
	}
	if _, err := b.db.Exec("ANALYZE TABLE " + b.tables.Outbox()); err != nil {
		t.Fatal(err)
	}
	r := b.relay(t, "r1")
	args := []any{int64(16 << 20), int64(16 << 20), int64(16 << 20)}
	args = append(args, lanes(0xffff)...)
	args = append(args, int64(0), "", "", 1000, int64(64<<20))
	rows, err := r.db.QueryContext(ctx, "EXPLAIN "+inList(r.sql.claimFresh, 1), args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
	walked := false
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
			if strings.Contains(row["Extra"], "filesort") {
				t.Errorf("the claim sorts the pending rows: %v", row)
			}
		}
	}
	if !walked {
		t.Errorf("the claim does not walk claim_idx")
	}
	if t.Failed() {
		t.Logf("plan:\n%s", strings.Join(plan, "\n"))
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
