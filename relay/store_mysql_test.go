package relay

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/mysqlstore"
	"github.com/heraldhq/herald/sinks"
)

// The test harness's SQL on MySQL and MariaDB: a database per test
// (mysqltest), events inserted with plain SQL, a connection pool of its own
// per relay (OpenMySQL), as `relay run` opens one.

// mysqlDB is a test's own database on the MySQL server.
type mysqlDB struct {
	url    string
	db     *sql.DB // with the relay's session settings: times in UTC
	tables mysqlmigrations.Tables
}

// setupMySQL returns a bundle on a database of the test's own on MySQL,
// with Herald's tables under their default names.
func setupMySQL(t testing.TB) *testBundle {
	t.Helper()
	_, url, tables := mysqltest.Migrated(t)
	db, err := OpenMySQL(url, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &testBundle{db: mysqlDB{url: url, db: db, tables: tables}, rec: newRecorder()}
}

func (d mysqlDB) names() tableNames { return d.tables }

func (mysqlDB) now() string { return "utc_timestamp(6)" }

// insert gives each event its id, so that it can read their seqs back in
// the same transaction: MySQL has no INSERT … RETURNING, and
// LAST_INSERT_ID() promises consecutive values only in some lock modes.
func (d mysqlDB) insert(t testing.TB, evs []ev, commit bool) []int64 {
	t.Helper()
	if len(evs) == 0 {
		return nil
	}
	ctx := context.Background()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	defer tx.Rollback()
	var ins, sel strings.Builder
	ins.WriteString("INSERT INTO " + d.tables.Outbox() + " (id, topic, `key`, payload, available_at, max_attempts) VALUES ")
	sel.WriteString("SELECT id, seq FROM " + d.tables.Outbox() + " WHERE id IN (")
	args := make([]any, 0, 6*len(evs))
	ids := make([]any, len(evs))
	for i, e := range evs {
		if i > 0 {
			ins.WriteString(", ")
			sel.WriteString(", ")
		}
		ins.WriteString("(?, ?, ?, ?, utc_timestamp(6) + INTERVAL ? MICROSECOND, ?)")
		sel.WriteString("?")
		ids[i] = uuid.NewString()
		var key, maxAtt any
		if e.key != "" {
			key = e.key
		}
		if e.maxAtt > 0 {
			maxAtt = e.maxAtt
		}
		args = append(args, ids[i], e.topic, key, e.payloadOr(i), e.delay.Microseconds(), maxAtt)
	}
	sel.WriteString(")")
	if _, err := tx.ExecContext(ctx, ins.String(), args...); err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	rows, err := tx.QueryContext(ctx, sel.String(), ids...)
	if err != nil {
		t.Fatalf("reading the events' seqs: %v", err)
	}
	defer rows.Close()
	seqOf := make(map[string]int64, len(evs))
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		seqOf[id] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading the events' seqs: %v", err)
	}
	seqs := make([]int64, len(evs))
	for i, id := range ids {
		seqs[i] = seqOf[id.(string)]
	}
	if commit {
		if err := tx.Commit(); err != nil {
			t.Fatalf("committing events: %v", err)
		}
	}
	return seqs
}

func (d mysqlDB) exec(t testing.TB, q string) {
	t.Helper()
	if _, err := d.db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (d mysqlDB) queryRow(t testing.TB, q string, dest ...any) {
	t.Helper()
	if err := d.db.QueryRow(q).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (d mysqlDB) lockRow(t testing.TB, seq int64) (unlock func()) {
	t.Helper()
	tx, err := d.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	unlock = func() { _ = tx.Rollback() }
	t.Cleanup(unlock)
	rows, err := tx.Query("SELECT 1 FROM "+d.tables.Outbox()+" WHERE seq = ? FOR UPDATE", seq)
	if err != nil {
		t.Fatalf("locking row %d: %v", seq, err)
	}
	rows.Close()
	return unlock
}

// newRelay opens the relay's own pool, closed when the test ends (after the
// relay has stopped: cleanups run last first).
func (d mysqlDB) newRelay(t testing.TB, cfg Config) (*Relay, error) {
	db, err := OpenMySQL(d.url, cfg.WithDefaults().Workers)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { db.Close() })
	return NewMySQL(db, cfg)
}

func (d mysqlDB) session(t testing.TB, owner string) *session {
	return &session{store: mysqlstore.New(d.db, d.tables, mysqlstore.Config{Logger: testLogger(t)}), owner: owner}
}

// deadLetters shares the test's pool, opened as a relay's (OpenMySQL), which
// is what the store's statements need.
func (d mysqlDB) deadLetters(t testing.TB) *deadletter.Store {
	t.Helper()
	store, err := deadletter.NewMySQL(d.db, migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// BenchmarkMySQLDrain is BenchmarkDrain on MariaDB: b.N events committed up
// front (about 200 bytes of JSON each), drained to a discard sink by one or
// more relays.
func BenchmarkMySQLDrain(b *testing.B) {
	for _, c := range []struct{ keys, relays int }{{1000, 1}, {10, 1}, {1000, 2}} {
		b.Run(fmt.Sprintf("keys=%d/relays=%d", c.keys, c.relays), func(b *testing.B) {
			mb := setupMySQL(b)
			for left := b.N; left > 0; left -= 1000 {
				evs := make([]ev, min(left, 1000))
				for i := range evs {
					evs[i] = ev{topic: "orders", key: fmt.Sprintf("k%d", i%c.keys), payload: fmt.Sprintf(`{"n":%d,"order_id":"00000000","amount":12345,"currency":"EUR","customer":"c-0000000","items":[{"sku":"sku-1","qty":1}],"note":"padding to about two hundred bytes of json payload"}`, i)}
				}
				mb.insert(b, evs...)
			}
			b.ResetTimer()
			start := time.Now()
			for i := range c.relays {
				cfg := mb.config(b, sinks.NewDiscard("discard"))
				cfg.BatchSize = 1000
				cfg.Owner = fmt.Sprintf("bench-%d", i)
				mb.start(b, cfg)
			}
			// Poll gently: a count over the backlog is work for the server.
			for mb.count(b, "true") > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}
