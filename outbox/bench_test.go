package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/outbox"
)

// BenchmarkEnqueue measures Enqueue through pgx, one transaction per
// iteration, with one event or a batch of 100.
func BenchmarkEnqueue(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run(map[int]string{1: "1-per-tx", 100: "100-per-tx"}[size], func(b *testing.B) {
			bb := setup(b, outbox.Config{})
			ctx := context.Background()
			events := make([]outbox.Event, size)
			for i := range events {
				events[i] = outbox.Event{Topic: "orders.created", Key: "order-42", Payload: []byte(`{"order":42,"total":"19.90"}`),
					Headers: map[string]string{"tenant": "acme"}}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tx, err := bb.pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bb.writer.Enqueue(ctx, tx, events...); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkCommitRate measures how many single-event transactions 8
// concurrent producers commit per second when every transaction notifies,
// when notifications are debounced (the default 20ms), and without NOTIFY.
// Each iteration is 8 producers × 200 commits.
func BenchmarkCommitRate(b *testing.B) {
	const producers, commits = 8, 200
	for _, mode := range []struct {
		name string
		cfg  outbox.Config
	}{
		{"notify-every-tx", outbox.Config{NotifyInterval: outbox.NotifyEveryCall}},
		{"debounced-20ms", outbox.Config{NotifyInterval: 20 * time.Millisecond}},
		{"no-notify", outbox.Config{DisableNotify: true}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			bb := setup(b, mode.cfg)
			ctx := context.Background()
			event := outbox.Event{Topic: "orders.created", Key: "order-42", Payload: []byte(`{"order":42}`)}
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, producers)
				for range producers {
					wg.Go(func() {
						for range commits {
							tx, err := bb.pool.Begin(ctx)
							if err == nil {
								_, err = bb.writer.Enqueue(ctx, tx, event)
								if err == nil {
									err = tx.Commit(ctx)
								} else {
									tx.Rollback(ctx)
								}
							}
							if err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				total += time.Since(start)
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*producers*commits)/total.Seconds(), "events/s")
		})
	}
}

// BenchmarkEnqueueMySQL measures EnqueueSQL on MariaDB, one transaction per
// iteration, with one event or a batch of 100, with the driver's default
// (prepare, execute) and with interpolateParams=true (one round trip).
func BenchmarkEnqueueMySQL(b *testing.B) {
	for _, interpolate := range []bool{false, true} {
		for _, size := range []int{1, 100} {
			name := map[int]string{1: "1-per-tx", 100: "100-per-tx"}[size]
			if interpolate {
				name += "/interpolateParams"
			}
			b.Run(name, func(b *testing.B) {
				_, dbURL := mysqltest.Database(b)
				if interpolate {
					dbURL += "?interpolateParams=true"
				}
				db, err := mysqlurl.Open(dbURL)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				m, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if _, err := m.Up(ctx, 0); err != nil {
					b.Fatal(err)
				}
				w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL})
				if err != nil {
					b.Fatal(err)
				}
				events := make([]outbox.Event, size)
				for i := range events {
					events[i] = outbox.Event{Topic: "orders.created", Key: "order-42", Payload: []byte(`{"order":42,"total":"19.90"}`),
						Headers: map[string]string{"tenant": "acme"}}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := w.EnqueueSQL(ctx, tx, events...); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}
