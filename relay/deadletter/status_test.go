package deadletter_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		st, err := tb.store.Status(ctx, nil)
		if err != nil || st.Total != (deadletter.Backlog{}) || len(st.Topics) != 0 || len(st.Sinks) != 0 || st.At.IsZero() {
			t.Fatalf("empty: Status = %+v, %v", st, err)
		}
		if totals, err := tb.store.Totals(ctx); err != nil || totals != (deadletter.Totals{}) {
			t.Fatalf("empty: Totals = %+v, %v", totals, err)
		}
		// The outbox: orders has 2 pending (one 10 minutes old), users 1; a
		// done row (retention) counts for nothing.
		tb.outbox(t, outboxRow{topic: "orders", createdAgo: 10 * time.Minute})
		tb.outbox(t, outboxRow{topic: "orders", createdAgo: time.Minute})
		tb.outbox(t, outboxRow{topic: "users", createdAgo: 5 * time.Minute})
		tb.outbox(t, outboxRow{topic: "orders", done: true})
		// A users event written two hours ago for delivery in an hour is
		// pending but not due: it is not the oldest.
		tb.outbox(t, outboxRow{topic: "users", createdAgo: 2 * time.Hour, availableIn: time.Hour})
		// The queues: two orders wait on hook (the head 20 minutes old), a
		// users event is dead on kafka, an orders event died at the routing
		// step.
		head := tb.newEvent(t, "orders", "o-1")
		head.createdAgo = 20 * time.Minute
		tb.put(t, head, delivery{sink: "hook", state: "ready", attempts: 2})
		tb.put(t, tb.newEvent(t, "orders", "o-1"), delivery{sink: "hook", state: "waiting"})
		tb.dead(t, "users", "", "kafka")
		tb.dead(t, "orders", "", "")
		// Published this minute count whole; two minutes ago not at all.
		tb.published(t, 0, "kafka", "orders", 7)
		tb.published(t, 0, "hook", "users", 2)
		tb.published(t, 2, "kafka", "orders", 1000)

		st, err = tb.store.Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tot := st.Total; tot.Pending != 4 || tot.Queued != 2 || tot.Dead != 2 || tot.PublishedLastMinute != 9 {
			t.Fatalf("total = %+v", tot)
		}
		if a := st.Total.OldestPendingAgeSeconds; a < 599 || a > 660 {
			t.Fatalf("oldest pending age %.0fs, want about 600", a)
		}
		if a := st.Total.OldestQueuedAgeSeconds; a < 1199 || a > 1260 {
			t.Fatalf("oldest queued age %.0fs, want about 1200", a)
		}
		if len(st.Topics) != 2 || st.Topics[0].Topic != "orders" || st.Topics[1].Topic != "users" {
			t.Fatalf("topics = %+v", st.Topics)
		}
		if ord := st.Topics[0]; ord.Pending != 2 || ord.Queued != 2 || ord.Dead != 1 || ord.PublishedLastMinute != 7 ||
			ord.OldestPendingAgeSeconds < 599 || ord.OldestQueuedAgeSeconds < 1199 {
			t.Fatalf("orders = %+v", ord)
		}
		if us := st.Topics[1]; us.Pending != 2 || us.Queued != 0 || us.Dead != 1 || us.PublishedLastMinute != 2 ||
			us.OldestPendingAgeSeconds < 299 || us.OldestPendingAgeSeconds > 360 || us.OldestQueuedAgeSeconds != 0 {
			t.Fatalf("users = %+v", us)
		}
		sinksByName := func(st *deadletter.Status) map[string]deadletter.SinkStatus {
			out := map[string]deadletter.SinkStatus{}
			for _, s := range st.Sinks {
				out[s.Sink] = s
			}
			return out
		}
		// Without routes, pending events are no sink's.
		byName := sinksByName(st)
		if len(byName) != 3 {
			t.Fatalf("sinks = %+v", st.Sinks)
		}
		if h := byName["hook"]; h.Pending != 0 || h.Queued != 2 || h.Dead != 0 || h.PublishedLastMinute != 2 || h.OldestQueuedAgeSeconds < 1199 {
			t.Fatalf("hook = %+v", h)
		}
		if k := byName["kafka"]; k.Pending != 0 || k.Queued != 0 || k.Dead != 1 || k.PublishedLastMinute != 7 {
			t.Fatalf("kafka = %+v", k)
		}
		if r := byName[""]; r.Dead != 1 || r.Queued != 0 {
			t.Fatalf("the routing step = %+v", r)
		}

		// With routes: orders go to hook and kafka, users to hook.
		st, err = tb.store.Status(ctx, func(topic string) []string {
			switch topic {
			case "orders":
				return []string{"hook", "kafka"}
			case "users":
				return []string{"hook"}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		byName = sinksByName(st)
		if h := byName["hook"]; h.Pending != 4 || h.Queued != 2 || h.Dead != 0 || h.OldestPendingAgeSeconds < 599 {
			t.Fatalf("hook from routes = %+v", h)
		}
		if k := byName["kafka"]; k.Pending != 2 || k.Dead != 1 {
			t.Fatalf("kafka from routes = %+v", k)
		}
		b, _ := json.Marshal(st)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["total"].(map[string]any)["pending"] != 4.0 || m["total"].(map[string]any)["queued"] != 2.0 {
			t.Fatalf("JSON: %s", b)
		}

		totals, err := tb.store.Totals(ctx)
		// The delayed event, two hours old, is not the oldest: the queued head is.
		if err != nil || totals.Pending != 4 || totals.Queued != 2 || totals.Dead != 2 || totals.Undelivered() != 6 ||
			totals.OldestAge < 1199*time.Second || totals.OldestAge > 1260*time.Second {
			t.Fatalf("Totals = %+v, %v", totals, err)
		}
	})
}
