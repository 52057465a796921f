package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/outbox"
)

// TestKeyOrderWhenTheLaterWriterBeganFirst: transaction B begins; then A
// begins, enqueues an event of key k and commits; then B enqueues its own
// event of k, with the higher seq, and commits (as when both update one
// order and A took its row lock first). With both due and claimed one at a
// time, A's event must still reach the sink first, although B's transaction
// began first: events are due from the time of their INSERT, not of their
// transaction's start.
//
// PostgreSQL only: it orders pgx transactions.
func TestKeyOrderWhenTheLaterWriterBeganFirst(t *testing.T) {
	t.Parallel()
	writer := func(t *testing.T, b *testBundle) func(ctx context.Context, tx pgx.Tx) error {
		w, err := outbox.NewWriter(outbox.Config{Tables: b.tables, DisableNotify: true})
		if err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := w.Enqueue(ctx, tx, outbox.Event{Topic: "orders.paid", Key: "k", Payload: []byte(`{}`)})
			return err
		}
	}
	plainSQL := func(_ *testing.T, b *testBundle) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+b.tables.Outbox()+` (topic, key, payload) VALUES ('orders.paid', 'k', '{}')`)
			return err
		}
	}
	for name, enqueuer := range map[string]func(*testing.T, *testBundle) func(context.Context, pgx.Tx) error{
		"outbox.Writer": writer, "INSERT with the table's defaults": plainSQL,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			enqueue := enqueuer(t, b)
			ctx := context.Background()
			txB, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer txB.Rollback(ctx)
			time.Sleep(20 * time.Millisecond)
			if err := pgx.BeginFunc(ctx, b.pool, func(txA pgx.Tx) error { return enqueue(ctx, txA) }); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			if err := enqueue(ctx, txB); err != nil {
				t.Fatal(err)
			}
			if err := txB.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var first, second int64
			if err := b.pool.QueryRow(ctx, `SELECT min(seq), max(seq) FROM `+b.tables.Outbox()).Scan(&first, &second); err != nil {
				t.Fatal(err)
			}

			sink := &testSink{name: "mem", rec: b.rec}
			cfg := b.config(t, sink)
			cfg.BatchSize = 1
			b.start(t, cfg)
			waitFor(t, time.Minute, "both delivered", func() bool { return len(b.rec.all()) == 2 })
			if got := seqsInOrder(b.rec.all()); got[0] != first || got[1] != second {
				t.Fatalf("delivery order %v, want [%d %d]: the older transaction's later event overtook", got, first, second)
			}
		})
	}
}

// TestKeyOrderUnderContendedWriters: writers begin transactions at random
// moments, lock their key's aggregate row after a random wait, enqueue and
// commit, while two relays claim small batches. Every key's events reach the
// sink in seq order.
//
// PostgreSQL only: its writers are pgx transactions.
func TestKeyOrderUnderContendedWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	aggregates := pgx.Identifier{b.tables.Schema, "aggregates"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+aggregates+` (key text PRIMARY KEY);
INSERT INTO `+aggregates+` SELECT 'k' || i FROM generate_series(0, 4) AS i`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.Config{Tables: b.tables})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
		cfg.Owner = fmt.Sprintf("relay-%d", i)
		cfg.BatchSize = 3
		b.start(t, cfg)
	}

	const writers, perWriter = 8, 40
	errs := make(chan error, writers*perWriter)
	for i := range writers {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for range perWriter {
				key := fmt.Sprintf("k%d", rng.IntN(5))
				errs <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					if _, err := tx.Exec(ctx, `SELECT 1 FROM `+aggregates+` WHERE key = $1 FOR UPDATE`, key); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
					_, err := w.Enqueue(ctx, tx, outbox.Event{Topic: "orders.paid", Key: key, Payload: []byte(`{}`)})
					return err
				})
			}
		}()
	}
	for range writers * perWriter {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Minute, "all events delivered", func() bool { return len(b.rec.all()) >= writers*perWriter })
	checkKeyOrder(t, b.rec.all())
}
