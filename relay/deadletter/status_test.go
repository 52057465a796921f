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
		if err != nil || st.Total != (deadletter.Backlog{}) || len(st.Topics) != 0 || len(st.Sinks) != 0 || len(st.Patterns) != 0 || st.At.IsZero() {
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
		// The queues: two orders wait on hook (the head 20 minutes old, its
		// second attempt failed), a users event is dead on kafka, an orders
		// event died at the routing step.
		head := tb.newEvent(t, "orders", "o-1")
		head.createdAgo = 20 * time.Minute
		tb.put(t, head, delivery{sink: "hook", state: "ready", attempts: 2})
		tb.put(t, tb.newEvent(t, "orders", "o-1"), delivery{sink: "hook", state: "waiting"})
		tb.dead(t, "users", "", "kafka")
		tb.dead(t, "orders", "", "")
		// Delivered this minute count whole; two minutes ago not at all.
		// The relays count them by topic pattern (relay.metrics_topics).
		tb.published(t, 0, "kafka", "orders.*", 7)
		tb.published(t, 0, "hook", "users", 2)
		tb.published(t, 2, "kafka", "orders.*", 1000)

		st, err = tb.store.Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tot := st.Total; tot.Pending != 4 || tot.Queued != 2 || tot.Dead != 2 || st.DeliveredLastMinute != 9 {
			t.Fatalf("total = %+v, %d delivered", tot, st.DeliveredLastMinute)
		}
		// Deliveries are by pattern, never mixed with the topics' rows.
		if len(st.Patterns) != 2 || st.Patterns[0] != (deadletter.PatternStatus{Pattern: "orders.*", DeliveredLastMinute: 7}) ||
			st.Patterns[1] != (deadletter.PatternStatus{Pattern: "users", DeliveredLastMinute: 2}) {
			t.Fatalf("patterns = %+v", st.Patterns)
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
		if ord := st.Topics[0]; ord.Pending != 2 || ord.Queued != 2 || ord.Dead != 1 ||
			ord.OldestPendingAgeSeconds < 599 || ord.OldestQueuedAgeSeconds < 1199 {
			t.Fatalf("orders = %+v", ord)
		}
		if us := st.Topics[1]; us.Pending != 2 || us.Queued != 0 || us.Dead != 1 ||
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
		// hook: a head waits to be retried while other events get through;
		// kafka: a dead letter this minute while others get through; the
		// routing step: a dead letter this minute and nothing delivered.
		if h := byName["hook"]; h.Pending != 0 || h.Queued != 2 || h.Dead != 0 || h.DeliveredLastMinute != 2 || h.OldestQueuedAgeSeconds < 1199 ||
			h.Retrying != 1 || h.DeadLastMinute != 0 || h.State != deadletter.SinkRetrying {
			t.Fatalf("hook = %+v", h)
		}
		if k := byName["kafka"]; k.Pending != 0 || k.Queued != 0 || k.Dead != 1 || k.DeliveredLastMinute != 7 ||
			k.DeadLastMinute != 1 || k.Retrying != 0 || k.State != deadletter.SinkRefusing {
			t.Fatalf("kafka = %+v", k)
		}
		if r := byName[""]; r.Dead != 1 || r.Queued != 0 || r.DeadLastMinute != 1 || r.State != deadletter.SinkFailing {
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
		if err := json.Unmarshal(b, &m); err != nil || m["total"].(map[string]any)["pending"] != 4.0 || m["total"].(map[string]any)["queued"] != 2.0 ||
			m["delivered_last_minute"] != 9.0 || m["topic_patterns"].([]any)[0].(map[string]any)["topic_pattern"] != "orders.*" {
			t.Fatalf("JSON: %s", b)
		}

		// A sink refusing every delivery of the last minute is failing, not
		// flowing; one whose dead letters are older is flowing.
		tb.put(t, tb.newEvent(t, "orders", ""), delivery{sink: "mail", lastError: "HTTP 400"})
		tb.put(t, tb.newEvent(t, "orders", ""), delivery{sink: "old", lastError: "HTTP 400", diedAgo: 2 * time.Minute})
		st, err = tb.store.Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		byName = sinksByName(st)
		if m := byName["mail"]; m.State != deadletter.SinkFailing || m.DeadLastMinute != 1 {
			t.Fatalf("mail, refusing everything = %+v", m)
		}
		if o := byName["old"]; o.State != deadletter.SinkFlowing || o.DeadLastMinute != 0 || o.Dead != 1 {
			t.Fatalf("old, with an old dead letter = %+v", o)
		}
		// A sink a live relay holds paused is paused, whatever else it
		// does, and listed even with nothing waiting.
		if tb.my != nil {
			tb.execMy(t, "INSERT INTO "+tb.mt.Relays()+` (owner, heartbeat_until, config, config_since, paused_sinks)
VALUES ('r1', utc_timestamp(6) + INTERVAL 1 MINUTE, 'c', utc_timestamp(6), '["mail", "sms"]')`)
		} else {
			tb.exec(t, "INSERT INTO "+tb.tables.Relays()+` (owner, heartbeat_until, config, config_since, paused_sinks)
VALUES ('r1', now() + interval '1 minute', 'c', now(), '{mail,sms}')`)
		}
		st, err = tb.store.Status(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		byName = sinksByName(st)
		if m, s := byName["mail"], byName["sms"]; m.State != deadletter.SinkPaused || s.State != deadletter.SinkPaused || s.Sink != "sms" {
			t.Fatalf("paused: mail = %+v, sms = %+v", m, s)
		}

		totals, err := tb.store.Totals(ctx)
		// The delayed event, two hours old, is not the oldest: the queued head is.
		if err != nil || totals.Pending != 4 || totals.Queued != 2 || totals.Dead != 4 || totals.Undelivered() != 6 ||
			totals.OldestAge < 1199*time.Second || totals.OldestAge > 1260*time.Second {
			t.Fatalf("Totals = %+v, %v", totals, err)
		}
	})
}
