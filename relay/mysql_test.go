package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/migrations/mysqltest"
	"github.com/heraldhq/herald/sinks"
)

// The engine on MySQL/MariaDB (NewMySQL): its core behaviours run against
// the MySQL store here. The rest of the package's tests run on PostgreSQL
// only: they check the database with PostgreSQL's SQL.

// mysqlBundle is a test's own MariaDB database with Herald's tables.
type mysqlBundle struct {
	url    string
	tables mysqlmigrations.Tables
	rec    *recorder
	exec   func(t testing.TB, q string, args ...any)
	count  func(t testing.TB, q string) int
}

func setupMySQL(t testing.TB) *mysqlBundle {
	t.Helper()
	db, url := mysqltest.Database(t)
	m, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	tables, err := mysqlmigrations.NewTables(migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	return &mysqlBundle{url: url, tables: tables, rec: newRecorder(),
		exec: func(t testing.TB, q string, args ...any) {
			t.Helper()
			if _, err := db.Exec(q, args...); err != nil {
				t.Fatal(err)
			}
		},
		count: func(t testing.TB, q string) int {
			t.Helper()
			var n int
			if err := db.QueryRow(q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
}

// insert commits events of keys[i%len(keys)] with plain SQL, in one
// statement, and returns their seqs.
func (b *mysqlBundle) insert(t testing.TB, n int, keys ...string) []int64 {
	t.Helper()
	var q strings.Builder
	q.WriteString("INSERT INTO " + b.tables.Outbox() + " (topic, `key`, payload) VALUES ")
	args := make([]any, 0, 2*n)
	for i := range n {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("('orders', ?, ?)")
		args = append(args, keys[i%len(keys)], fmt.Sprintf(`{"n":%d,"order_id":"00000000","amount":12345,"currency":"EUR","customer":"c-0000000","items":[{"sku":"sku-1","qty":1}],"note":"padding to about two hundred bytes of json payload"}`, i))
	}
	b.exec(t, q.String(), args...)
	last := b.count(t, "SELECT max(seq) FROM "+b.tables.Outbox())
	seqs := make([]int64, n)
	for i := range seqs {
		seqs[i] = int64(last-n+1) + int64(i)
	}
	return seqs
}

// start runs a relay named owner until the test ends, with the package's
// fast-cycling test configuration routing every topic to targets.
func (b *mysqlBundle) start(t testing.TB, owner string, targets ...sinks.Sink) {
	t.Helper()
	tb := &testBundle{tables: migrations.Tables{}}
	cfg := tb.config(t, targets...)
	cfg.Owner = owner
	b.startConfig(t, cfg)
}

// startConfig runs a relay with cfg until the test ends.
func (b *mysqlBundle) startConfig(t testing.TB, cfg Config) {
	t.Helper()
	db, err := OpenMySQL(b.url, cfg.Workers)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewMySQL(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay.Run: %v", err)
			}
			db.Close()
		})
	})
}

// Events of many keys reach the sink once each, in per-key order, and
// leave the outbox.
func TestMySQLDeliversInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	seqs := b.insert(t, 600, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	b.start(t, "relay-1", &testSink{name: "mem", rec: b.rec})
	seqs = append(seqs, b.insert(t, 100, "a", "z")...) // while it runs: found by polling
	waitFor(t, 60*time.Second, "every event delivered", func() bool { return len(b.rec.forSink("mem")) >= len(seqs) })
	got := b.rec.all()
	checkKeyOrder(t, got)
	exactlyOnce(t, got, "mem", seqs)
	waitFor(t, 30*time.Second, "the outbox emptied", func() bool {
		return b.count(t, "SELECT count(*) FROM "+b.tables.Outbox()) == 0
	})
}

// A key failing on one sink waits in that sink's queue, in order, while the
// other sink takes every event at once and other keys flow; once the sink
// recovers, the queue drains in order.
func TestMySQLFailingKeyQueuesAndRecovers(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	var mu sync.Mutex
	failing := true
	flaky := &testSink{name: "flaky", rec: b.rec, fail: func(e sinks.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if failing && e.Key == "bad" {
			return errors.New("bad key refused")
		}
		return nil
	}}
	steady := &testSink{name: "steady", rec: b.rec}
	seqs := b.insert(t, 200, "bad", "good1", "good2", "good3")
	b.start(t, "relay-1", flaky, steady)
	waitFor(t, 60*time.Second, "the steady sink and the good keys served", func() bool {
		return len(b.rec.forSink("steady")) >= 200 && len(b.rec.forSink("flaky")) >= 150
	})
	waitFor(t, 30*time.Second, "the bad key queued on flaky", func() bool {
		return b.count(t, "SELECT count(*) FROM "+b.tables.Deliveries()+" WHERE sink = 'flaky'") == 50
	})
	if n := len(b.rec.forSink("flaky")); n != 150 {
		t.Fatalf("flaky received %d events while the bad key failed, want the 150 good ones", n)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	waitFor(t, 60*time.Second, "the queue drained", func() bool { return len(b.rec.forSink("flaky")) >= 200 })
	got := b.rec.all()
	checkKeyOrder(t, got)
	exactlyOnce(t, got, "steady", seqs)
	exactlyOnce(t, got, "flaky", seqs)
	waitFor(t, 30*time.Second, "the deliveries table emptied", func() bool {
		return b.count(t, "SELECT count(*) FROM "+b.tables.Deliveries()) == 0
	})
}

// Two relays share the lanes and deliver no event twice.
func TestMySQLTwoRelays(t *testing.T) {
	t.Parallel()
	b := setupMySQL(t)
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	b.start(t, "relay-1", &testSink{name: "mem", rec: b.rec})
	b.start(t, "relay-2", &testSink{name: "mem", rec: b.rec})
	var seqs []int64
	for range 5 {
		seqs = append(seqs, b.insert(t, 200, keys...)...)
	}
	waitFor(t, 60*time.Second, "every event delivered", func() bool { return len(b.rec.forSink("mem")) >= len(seqs) })
	got := b.rec.all()
	checkKeyOrder(t, got)
	exactlyOnce(t, got, "mem", seqs)
}

// BenchmarkMySQLDrain is BenchmarkDrain on MariaDB: b.N events committed up
// front (about 200 bytes of JSON each), drained to a discard sink by one or
// more relays.
func BenchmarkMySQLDrain(b *testing.B) {
	for _, c := range []struct{ keys, relays int }{{1000, 1}, {10, 1}, {1000, 2}} {
		b.Run(fmt.Sprintf("keys=%d/relays=%d", c.keys, c.relays), func(b *testing.B) {
			mb := setupMySQL(b)
			keys := make([]string, c.keys)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
			}
			for left := b.N; left > 0; left -= 1000 {
				mb.insert(b, min(left, 1000), keys...)
			}
			b.ResetTimer()
			start := time.Now()
			for i := range c.relays {
				tb := &testBundle{tables: migrations.Tables{}}
				cfg := tb.config(b, sinks.NewDiscard("discard"))
				cfg.BatchSize = 1000
				cfg.Owner = fmt.Sprintf("bench-%d", i)
				mb.startConfig(b, cfg)
			}
			// Poll gently: a count over the backlog is work for the server.
			for mb.count(b, "SELECT count(*) FROM "+mb.tables.Outbox()) > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}
