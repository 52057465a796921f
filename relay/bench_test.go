package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/sinks"
)

// BenchmarkDrain measures claim + publish (discard) + record: b.N events
// committed up front, drained by one or more relays.
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct {
		keys, relays int
		syncOff      bool
		where        string // a route filter every event passes; "" for none
	}{{1000, 1, false, ""}, {1000, 1, true, ""}, {1000, 2, true, ""}, {10, 1, true, ""}, {0, 1, true, ""},
		{1000, 1, true, `payload.amount > 100 && payload.currency == "EUR"`}} {
		name := fmt.Sprintf("keys=%d/relays=%d/relay_pool=%v", c.keys, c.relays, c.syncOff)
		if c.where != "" {
			name += "/where=payload"
		}
		b.Run(name, func(b *testing.B) {
			tb := setup(b)
			evs := make([]ev, 0, 10000)
			for i := 0; i < b.N; i++ {
				key := fmt.Sprintf("k%d", i)
				if c.keys > 0 {
					key = fmt.Sprintf("k%d", i%c.keys)
				}
				evs = append(evs, ev{topic: "bench", key: key,
					payload: `{"order_id":"00000000","amount":12345,"currency":"EUR","customer":"c-0000000","items":[{"sku":"sku-1","qty":1}],"note":"padding to about two hundred bytes of json payload......."}`})
				if len(evs) == cap(evs) || i == b.N-1 {
					tb.insert(b, evs...)
					evs = evs[:0]
				}
			}
			pcfg, err := pgxpool.ParseConfig(pgtest.URL(b))
			if err != nil {
				b.Fatal(err)
			}
			if c.syncOff {
				ConfigurePool(pcfg) // as relay run does
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range c.relays {
				pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				rb := pgBundle(pool, tb.tables)
				cfg := rb.config(b, sinks.NewDiscard("discard"))
				cfg.BatchSize = 1000
				cfg.Owner = fmt.Sprintf("bench-%d", i)
				if c.where != "" {
					cfg.Routes[0].Where = whereFilter(b, c.where)
				}
				defer rb.start(b, cfg)()
			}
			// Poll gently: a count over the backlog is itself work for the
			// database the relays are using.
			for tb.count(b, "true") > 0 {
				time.Sleep(100 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}

// BenchmarkOneRowPerTransaction is the loop most outbox articles show, for
// comparison: one transaction per event that locks the oldest row, publishes
// it (to nothing here) while holding the lock, deletes it and commits.
func BenchmarkOneRowPerTransaction(b *testing.B) {
	tb := setup(b)
	evs := make([]ev, 0, 10000)
	for i := 0; i < b.N; i++ {
		evs = append(evs, ev{topic: "bench", key: fmt.Sprintf("k%d", i%1000)})
		if len(evs) == cap(evs) || i == b.N-1 {
			tb.insert(b, evs...)
			evs = evs[:0]
		}
	}
	ctx := context.Background()
	sink := sinks.NewDiscard("discard")
	lock := `SELECT seq, id, topic, key, payload FROM ` + tb.tables.Outbox() + ` ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED`
	del := `DELETE FROM ` + tb.tables.Outbox() + ` WHERE seq = $1`
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		tx, err := tb.pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var e sinks.Event
		var key *string
		if err := tx.QueryRow(ctx, lock).Scan(&e.Seq, &e.ID, &e.Topic, &key, &e.Payload); err != nil {
			b.Fatal(err)
		}
		sink.Publish(ctx, []sinks.Event{e})
		if _, err := tx.Exec(ctx, del, e.Seq); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}
