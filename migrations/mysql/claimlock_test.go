package mysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"text/template"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/mysql"
)

// storeSQL reads store.sql: its statements by name, rendered for the
// default tables.
func storeSQL(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("store.sql")
	if err != nil {
		t.Fatal(err)
	}
	tables, err := mysql.NewTables(migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, part := range strings.Split(string(raw), "-- name: ")[1:] {
		name, text, _ := strings.Cut(part, "\n")
		tmpl, err := template.New(name).Option("missingkey=error").Parse(text)
		if err != nil {
			t.Fatalf("store.sql %s: %v", name, err)
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, tables); err != nil {
			t.Fatalf("store.sql %s: %v", name, err)
		}
		out[strings.TrimSpace(name)] = b.String()
	}
	return out
}

// withSeqs puts one placeholder per seq in a statement's /*seqs*/ and
// returns the seqs as arguments.
func withSeqs(stmt string, seqs []int64) (string, []any) {
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	return strings.Replace(stmt, "/*seqs*/", strings.TrimSuffix(strings.Repeat("?, ", len(seqs)), ", "), 1), args
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

const allLanes = ^uint64(0)

// query runs a SELECT in tx and returns how many rows it read. Through
// Query, never Exec: go-sql-driver/mysql v1.10.1 waits forever (until the
// context ends) after Exec of a prepared SELECT whose result is empty, on
// MariaDB 10.11.
func query(t *testing.T, tx *sql.Tx, q string, args ...any) int {
	t.Helper()
	rows, err := tx.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInsertWhileClaiming: an application's INSERT never waits for a
// relay's transaction. Each case opens the relay's transaction, runs
// statements of store.sql at the tail of the pending range, and, while the
// transaction is open, inserts an event on another connection whose lock
// wait timeout is 1 s: at READ COMMITTED the insert returns at once. The
// locking claims at REPEATABLE READ (InnoDB's default) make it wait for a
// gap lock until the timeout (error 1205), which shows what the test
// catches.
func TestInsertWhileClaiming(t *testing.T) {
	t.Parallel()
	stmts := storeSQL(t)
	cases := []struct {
		name string
		// prepare runs before the relay's transaction, on the test's pool.
		prepare func(t *testing.T, db *sql.DB)
		// claim runs in the relay's transaction.
		claim func(t *testing.T, tx *sql.Tx)
		// waitsAtRepeatableRead: the statements lock the gap after the last
		// row at REPEATABLE READ.
		waitsAtRepeatableRead bool
		// purgeDecidesAtRepeatableRead: at REPEATABLE READ the insert waits
		// or not depending on whether InnoDB's purge has removed a deleted
		// row yet (a gap lock up to the supremum once it has), so only
		// READ COMMITTED, the store's level, is held to "never waits".
		purgeDecidesAtRepeatableRead bool
	}{{
		name: "the claim (a plain read) to the end of the range",
		claim: func(t *testing.T, tx *sql.Tx) {
			if n := query(t, tx, stmts["claim"], 0, 63, allLanes, 1000); n != 50 {
				t.Fatalf("the claim read %d rows, want all 50", n)
			}
		},
	}, {
		name: "the record of the last rows, the last already deleted by someone else",
		prepare: func(t *testing.T, db *sql.DB) {
			if _, err := db.Exec("DELETE FROM outbox WHERE seq = 50"); err != nil {
				t.Fatal(err)
			}
		},
		claim: func(t *testing.T, tx *sql.Tx) {
			if held := query(t, tx, stmts["lock_lanes"], 0, 63, "relay-a"); held != 64 {
				t.Fatalf("the record's fence found %d lanes held, want 64", held)
			}
			q, args := withSeqs(stmts["lock_rows"], seqRange(41, 50))
			if n := query(t, tx, q, args...); n != 9 {
				t.Fatalf("the record locked %d rows, want 9", n)
			}
			q, args = withSeqs(stmts["delete_rows"], seqRange(41, 50))
			res, err := tx.Exec(q, append(args, 0, 63, allLanes, 10)...)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 9 {
				t.Fatalf("the record deleted %d rows, want 9", n)
			}
		},
		// Equality on the primary key locks rows, not gaps, while the
		// deleted row 50 is still in the index; once purged, the search
		// for 50 locks the gap after 49 at REPEATABLE READ.
		purgeDecidesAtRepeatableRead: true,
	}, {
		name: "a locking claim (SKIP LOCKED) to the end of the range",
		claim: func(t *testing.T, tx *sql.Tx) {
			if n := query(t, tx, stmts["claim_locking"], 1000); n != 50 {
				t.Fatalf("the locking claim read %d rows, want 50", n)
			}
		},
		waitsAtRepeatableRead: true,
	}, {
		name: "a locking claim (SKIP LOCKED) finding nothing",
		prepare: func(t *testing.T, db *sql.DB) {
			if _, err := db.Exec("DELETE FROM outbox"); err != nil {
				t.Fatal(err)
			}
		},
		claim: func(t *testing.T, tx *sql.Tx) {
			if n := query(t, tx, stmts["claim_locking"], 1000); n != 0 {
				t.Fatalf("the locking claim read %d rows of an empty table", n)
			}
		},
		waitsAtRepeatableRead: true,
	}}
	for _, c := range cases {
		for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead} {
			t.Run(c.name+"/"+level.String(), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db, _, _ := mysqltest.Migrated(t)
				fill(t, db, 50)
				if _, err := db.Exec("UPDATE outbox_lanes SET owner = 'relay-a', lease_until = utc_timestamp(6) + INTERVAL 1 HOUR"); err != nil {
					t.Fatal(err)
				}
				if c.prepare != nil {
					c.prepare(t, db)
				}
				app, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer app.Close()
				if _, err := app.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}

				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				c.claim(t, tx)

				_, insertErr := app.ExecContext(ctx, "INSERT INTO outbox (topic, `key`, payload) VALUES ('orders.created', 'order-new', '{}')")
				// The relay's transaction is still open: it commits now.
				if err := tx.Commit(); err != nil {
					t.Fatalf("committing the relay's transaction after the insert: %v", err)
				}
				var myErr *gomysql.MySQLError
				waited := errors.As(insertErr, &myErr) && myErr.Number == 1205
				switch {
				case level == sql.LevelRepeatableRead && c.waitsAtRepeatableRead:
					if !waited {
						t.Fatalf("at REPEATABLE READ the insert returned %v; want it to wait for the gap lock (1205)", insertErr)
					}
				case level == sql.LevelRepeatableRead && c.purgeDecidesAtRepeatableRead:
					if insertErr != nil && !waited {
						t.Fatalf("at REPEATABLE READ the insert returned %v; want it to succeed or wait for the gap lock (1205)", insertErr)
					}
				case insertErr != nil:
					t.Fatalf("the application's insert, while the relay's transaction was open: %v", insertErr)
				}
			})
		}
	}
}

// fill inserts n events of n keys, seq 1 to n, in one statement.
func fill(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("INSERT INTO outbox (topic, `key`) VALUES ")
	for i := 1; i <= n; i++ {
		if i > 1 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "('orders.created', 'order-%d')", i)
	}
	if _, err := db.Exec(b.String()); err != nil {
		t.Fatal(err)
	}
}

// explain returns each row of EXPLAIN stmt as a map of its columns.
func explain(t *testing.T, db *sql.DB, stmt string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
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
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDeletePlanKeepsThePrimaryKey: the record's DELETE of 1,000 rows from
// a table of 3,000 reads them through the primary key (a range), not the
// whole table; the same DELETE without ORDER BY seq LIMIT n is logged for
// comparison (MariaDB 10.11 scans the table). The claim walks claim_idx in
// its order, without a filesort.
func TestDeletePlanKeepsThePrimaryKey(t *testing.T) {
	t.Parallel()
	stmts := storeSQL(t)
	db, _, _ := mysqltest.Migrated(t)
	fill(t, db, 3000)
	if _, err := db.Exec("ANALYZE TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	seqs := seqRange(1001, 2000)
	q, args := withSeqs(stmts["delete_rows"], seqs)
	plan := explain(t, db, q, append(args, 0, 63, allLanes, len(seqs))...)
	if len(plan) != 1 || plan[0]["key"] != "PRIMARY" || plan[0]["type"] != "range" {
		t.Errorf("the record's DELETE: plan %v; want a range on PRIMARY", plan)
	}
	bare, args := withSeqs("DELETE FROM outbox WHERE seq IN (/*seqs*/)", seqs)
	t.Logf("without ORDER BY seq LIMIT n: %v", explain(t, db, bare, args...))

	plan = explain(t, db, stmts["claim"], 0, 31, allLanes, 1000)
	if len(plan) != 1 || plan[0]["key"] != "outbox_claim_idx" || strings.Contains(plan[0]["Extra"], "filesort") {
		t.Errorf("the claim: plan %v; want outbox_claim_idx in its order, no filesort", plan)
	}
}
