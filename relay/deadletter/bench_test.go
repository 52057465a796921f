package deadletter_test

import (
	"context"
	"testing"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/deadletter"
)

// BenchmarkDeadLetterFirstPage measures what the console's dead-letter,
// held-key and event pages ask of the store, against 100,000 dead letters
// and 100,000 queued deliveries (1,000 keys with a queue of 100 on one
// sink, half of them held by a failing head): the first page of 50, oldest
// or newest first, with no filter or one filter, and the count of the same
// filter, exact and capped at 10,000.
func BenchmarkDeadLetterFirstPage(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	tables := pgtest.Schema(b, pool)
	dl := tables.Deliveries()
	// Ten topics, three sinks, 10,000 keys; 1 % of errors say "410 Gone";
	// died one a second, the newest now.
	for _, sql := range []string{`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, key, payload, headers, created_at,
    state, attempts, last_error, dead_at)
SELECT (ARRAY['hook', 'kafka', 'mail'])[i % 3 + 1], i, i & 63, gen_random_uuid(), 'orders.t' || (i % 10), 'k' || (i % 10000),
       '{"order_id": 1, "amount": 12345, "note": "a payload of about a hundred bytes of JSON text........"}', '{}',
       now() - (100000 - i) * interval '1 second',
       'dead', 5, CASE WHEN i % 100 = 0 THEN 'HTTP 410 Gone: the endpoint was removed' ELSE 'HTTP 503 Service Unavailable: upstream timed out after 30s' END,
       now() - (100000 - i) * interval '1 second'
FROM generate_series(1, 100000) AS i`,
		`INSERT INTO ` + dl + ` (sink, seq, lane, id, topic, key, payload, headers, created_at,
    state, attempts, next_at, last_error)
SELECT 'hook', 200000 + k * 100 + r, hashtext('q' || k) & 63, gen_random_uuid(), 'orders.q', 'q' || k, '{}', '{}', now(),
       CASE WHEN r = 0 THEN 'ready' ELSE 'waiting' END,
       CASE WHEN r = 0 AND k % 2 = 0 THEN 3 ELSE 0 END,
       CASE WHEN r = 0 THEN now() + interval '1 minute' END,
       CASE WHEN r = 0 AND k % 2 = 0 THEN 'HTTP 500' END
FROM generate_series(0, 999) AS k, generate_series(0, 99) AS r`,
		// As autovacuum does after inserts (and the relay's vacuum loop
		// after deletes): statistics, and the visibility map that lets a
		// count read an index alone.
		`VACUUM (ANALYZE) ` + dl,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	store, err := deadletter.New(pool, tables)
	if err != nil {
		b.Fatal(err)
	}
	filters := []struct {
		name string
		f    deadletter.Filter
		n    int64
	}{
		{"none", deadletter.Filter{}, 100000},
		{"topic", deadletter.Filter{Topic: "orders.t3"}, 10000},
		{"topic_wildcard", deadletter.Filter{Topic: "orders.*"}, 100000},
		{"key", deadletter.Filter{Key: "k42"}, 10},
		{"sink", deadletter.Filter{Sink: "mail"}, 33333},
		{"error", deadletter.Filter{Error: "410 gone"}, 1000},
		{"error_none_match", deadletter.Filter{Error: "no such text"}, 0},
	}
	for _, c := range filters {
		for _, newest := range []bool{false, true} {
			name := "page/" + c.name
			if newest {
				name += "/newest"
			}
			b.Run(name, func(b *testing.B) {
				want := min(c.n, 50)
				for b.Loop() {
					n := int64(0)
					if err := store.List(ctx, c.f, deadletter.ListOpts{Limit: 50, Newest: newest}, func(deadletter.DeadLetter) error {
						n++
						return nil
					}); err != nil {
						b.Fatal(err)
					}
					if n != want {
						b.Fatalf("%d dead letters on the page, want %d", n, want)
					}
				}
			})
		}
		b.Run("count/"+c.name, func(b *testing.B) {
			for b.Loop() {
				n, err := store.Count(ctx, c.f)
				if err != nil {
					b.Fatal(err)
				}
				if n != c.n {
					b.Fatalf("count %d, want %d", n, c.n)
				}
			}
		})
	}
	for _, c := range filters {
		b.Run("count_at_most_10000/"+c.name, func(b *testing.B) {
			for b.Loop() {
				n, more, err := store.CountAtMost(ctx, c.f, 10000)
				if err != nil {
					b.Fatal(err)
				}
				if n != min(c.n, 10000) || more != (c.n > 10000) {
					b.Fatalf("count %d (more: %v), want %d", n, more, c.n)
				}
			}
		})
	}
	b.Run("held_keys", func(b *testing.B) {
		for b.Loop() {
			hs, err := store.HeldKeys(ctx, 50)
			if err != nil {
				b.Fatal(err)
			}
			if len(hs) != 50 || hs[0].Behind != 99 {
				b.Fatalf("%d held keys, the first with %d behind; want 50 and 99", len(hs), hs[0].Behind)
			}
		}
	})
	b.Run("key_queues", func(b *testing.B) {
		for b.Loop() {
			qs, err := store.KeyQueues(ctx, "q42", 50)
			if err != nil {
				b.Fatal(err)
			}
			if len(qs["hook"]) != 50 {
				b.Fatalf("%d deliveries of q42 on hook, want 50", len(qs["hook"]))
			}
		}
	})
}
