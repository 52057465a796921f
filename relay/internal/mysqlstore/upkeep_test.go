package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/store"
)

// The upkeep steps: published counts added up per minute, sink and topic
// (old ones removed), the sinks that have deliveries, deliveries of sinks no
// route names dead-lettered on the relay's own lanes only, the schema
// checked, the tables analyzed when grown.
func TestUpkeep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if err := r.CheckSchema(ctx); err != nil {
		t.Fatalf("CheckSchema on a migrated database: %v", err)
	}
	minute := time.Now().UTC().Truncate(time.Minute)
	for range 2 {
		if err := r.AddPublished(ctx, map[store.StatKey]int64{
			{Minute: minute, Sink: "s", Topic: "t"}: 3, {Minute: minute, Sink: "s", Topic: "u"}: 1,
			{Minute: minute.Add(-48 * time.Hour), Sink: "s", Topic: "t"}: 9}); err != nil {
			t.Fatal(err)
		}
	}
	var published, rows int
	if err := b.db.QueryRow("SELECT sum(published), count(*) FROM "+b.tables.Stats()).Scan(&published, &rows); err != nil || published != 8 || rows != 2 {
		t.Fatalf("stats hold %d published in %d rows (%v), want 8 in 2 (the day-old ones removed)", published, rows, err)
	}

	// Deliveries on sinks s and gone.
	if _, _, err := r.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	seqs := b.insert(t, ev{"t", "k1"}, ev{"t", "k2"})
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k1", "k2"}}
	for _, seq := range seqs {
		o.FromOutbox.Add(seq, "s", store.Ready, false, 1, 0, boom)
		o.FromOutbox.Add(seq, "gone", store.Ready, false, 1, 0, boom)
	}
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	present, err := r.SinksWithDeliveries(ctx)
	if err != nil || !slices.Equal(present, []string{"gone", "s"}) {
		t.Fatalf("sinks with deliveries %q (%v)", present, err)
	}
	if n, err := r.CountWaiting(ctx, "gone"); err != nil || n != 2 {
		t.Fatalf("CountWaiting(gone) = %d (%v), want both, in any lane", n, err)
	}

	// MaintainTables analyzes a grown table and reads the history length.
	if _, err := b.db.Exec("INSERT INTO " + b.tables.Outbox() + " (topic, available_at) SELECT 't', utc_timestamp(6) + INTERVAL 1 HOUR FROM seq_1_to_3000"); err != nil {
		t.Fatal(err)
	}
	done, err := r.MaintainTables(ctx, 0)
	if err != nil || !slices.Contains(done.Analyzed, b.tables.Outbox()) {
		t.Fatalf("MaintainTables did %+v (%v), want the grown outbox analyzed", done, err)
	}
	t.Logf("InnoDB history list length: %d", done.HistoryLength)
	if done, err := r.MaintainTables(ctx, 0); err != nil || len(done.Analyzed) != 0 {
		t.Fatalf("MaintainTables again did %+v (%v), want nothing: the tables have not grown", done, err)
	}

	// CheckSchema on a database behind.
	if _, err := b.db.Exec("DELETE FROM " + b.tables.Versions()); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckSchema(ctx); !errors.Is(err, migrations.ErrNotMigrated) {
		t.Fatalf("CheckSchema without migrations: %v", err)
	}
}

// Every relay transaction runs at READ COMMITTED, whatever the session's
// level (InnoDB's default is REPEATABLE READ): a second read sees a row
// committed elsewhere after the first, which REPEATABLE READ's snapshot
// hides. Both on a pool opened by Open and on one an embedder opened.
func TestTransactionsAreReadCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, db := range []*sql.DB{b.relayDB(t), b.embedderDB(t)} {
		r := &relayOn{Store: New(db, b.tables, Config{}), owner: "r1"}
		count := func(q interface {
			QueryRowContext(context.Context, string, ...any) *sql.Row
		}) (n int) {
			if err := q.QueryRowContext(ctx, "SELECT count(*) FROM "+b.tables.Outbox()).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		var before, after int
		err := r.inTx(ctx, func(tx *sql.Tx) error {
			before = count(tx) // at REPEATABLE READ, the snapshot of every later read
			b.insert(t, ev{"t", "a"})
			after = count(tx)
			return nil
		})
		if err != nil || after != before+1 {
			t.Fatalf("the relay's transaction read %d rows, then %d after a commit elsewhere (%v): not READ COMMITTED (pool opened by Open: %v)",
				before, after, err, r.txOptions == nil)
		}
	}
}

// A deadlock or a lock wait timeout runs the whole transaction again, a
// bounded number of times; other errors return at once.
func TestTransactionsRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	var runs atomic.Int32
	err := r.inTx(ctx, func(tx *sql.Tx) error {
		if runs.Add(1) == 1 {
			return &gomysql.MySQLError{Number: errDeadlock, Message: "Deadlock found"}
		}
		_, err := tx.ExecContext(ctx, "UPDATE "+b.tables.Lanes()+" SET owner = 'r1' WHERE lane = 0")
		return err
	})
	if err != nil || runs.Load() != 2 {
		t.Fatalf("ran %d times (%v), want 2: once deadlocked, once through", runs.Load(), err)
	}
	runs.Store(0)
	err = r.inTx(ctx, func(tx *sql.Tx) error {
		runs.Add(1)
		return &gomysql.MySQLError{Number: errLockWaitTimeout}
	})
	if !retryable(err) || runs.Load() != retries {
		t.Fatalf("ran %d times (%v), want %d then the error", runs.Load(), err, retries)
	}
	runs.Store(0)
	err = r.inTx(ctx, func(tx *sql.Tx) error {
		runs.Add(1)
		return &gomysql.MySQLError{Number: 1406}
	})
	if runs.Load() != 1 || err == nil {
		t.Fatalf("a data error ran %d times (%v), want once", runs.Load(), err)
	}
}

// An application's INSERT never waits on the relay: with a 1 s lock wait
// timeout, it is made while a record of the outbox's last rows (the tail,
// the gap after them) is open, after a claim to the end of the range. The
// store runs on a pool opened by Open (its sessions at READ COMMITTED) and
// on one an embedder opened (the server's REPEATABLE READ: the store sets
// READ COMMITTED for each transaction).
func TestInsertNeverWaitsOnTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	opened := b.relay(t, "r1")
	if _, _, err := opened.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	embedded := &relayOn{Store: New(b.embedderDB(t), b.tables, Config{}), owner: "r1", leases: opened.leases}
	app, err := b.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	insert := func() error {
		_, err := app.ExecContext(ctx, "INSERT INTO "+b.tables.Outbox()+" (topic, `key`, payload) VALUES ('orders', 'a', '{}')")
		return err
	}
	for _, r := range []*relayOn{opened, embedded} {
		if _, err := b.db.ExecContext(ctx, "DELETE FROM "+b.tables.Outbox()); err != nil {
			t.Fatal(err)
		}
		seqs := b.insert(t, ev{"t", "a"}, ev{"t", "b"}, ev{"t", "c"}, ev{"t", "a"})
		if fresh, _, err := r.claim(ctx, 100); err != nil || len(fresh) != 4 {
			t.Fatalf("claimed %d (%v)", len(fresh), err)
		}
		for _, o := range []*store.Outcome{
			{OutboxSeqs: seqs[2:]},                                 // the happy path's delete at the tail
			{OutboxSeqs: seqs[:2], OutboxKeys: []string{"a", "b"}}, // a fan-out
		} {
			if o.OutboxKeys != nil {
				o.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, 0, boom)
			}
			var insertErr error
			o.Fence = r.leases
			err := r.inTx(ctx, func(tx *sql.Tx) error {
				if _, _, err := r.Store.record(ctx, tx, r.owner, o, false, !o.Happy()); err != nil {
					return err
				}
				insertErr = insert() // the record's transaction is open
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if insertErr != nil {
				t.Fatalf("the application's INSERT while a record was open (pool opened by Open: %v): %v", r == opened, insertErr)
			}
		}
		if n := b.count(t, "true"); n != 2 {
			t.Fatalf("%d rows after the records, want the 2 inserts", n)
		}
	}
}

// Listen wakes at once when it starts, then whenever an outbox row is due,
// found by polling.
func TestListenPolls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := b.relay(t, "r1")
	wakes := make(chan bool, 100)
	done := make(chan error, 1)
	go func() { done <- r.Listen(ctx, func(queues bool) { wakes <- queues }) }()
	if q := <-wakes; !q {
		t.Fatal("the first wake-up does not ask for the queues")
	}
	// A due event wakes the workers for the outbox.
	b.insert(t, ev{"t", "a"})
	select {
	case q := <-wakes:
		if q {
			t.Fatal("a due outbox row woke the queues")
		}
	case err := <-done:
		t.Fatalf("Listen ended: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen ended with %v, want the context's end", err)
	}
}
