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
	tb := setup(t)
	ctx := context.Background()
	o := tb.tables.Outbox()
	exec := func(sql string) {
		t.Helper()
		if _, err := tb.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// orders: 3 pending (one created 10 minutes ago, retrying on hook and
	// done on kafka), 1 dead on hook. users: 1 pending never tried.
	exec(`INSERT INTO ` + o + ` (topic, created_at, deliveries) VALUES
  ('orders', now() - interval '10 minutes', '{"hook": {"state": "retry", "attempts": 2, "at": "2026-01-01T00:00:00Z"}, "kafka": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}'),
  ('orders', now() - interval '1 minute', '{}'),
  ('users', now() - interval '5 minutes', '{}')`)
	exec(`INSERT INTO ` + o + ` (topic) VALUES ('orders')`)
	exec(`INSERT INTO ` + o + ` (topic, status, finished_at, deliveries) VALUES ('orders', 'dead', now(), '{"hook": {"state": "dead", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}')`)
	exec(`INSERT INTO ` + o + ` (topic, status, finished_at) VALUES ('orders', 'done', now())`)
	// Published this minute count whole; two minutes ago not at all.
	exec(`INSERT INTO ` + tb.tables.Stats() + ` (minute, sink, topic, published) VALUES
  (date_trunc('minute', now()), 'kafka', 'orders', 7),
  (date_trunc('minute', now()), 'hook', 'users', 2),
  (date_trunc('minute', now()) - interval '2 minutes', 'kafka', 'orders', 1000)`)

	st, err := tb.store.Status(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Total.Pending != 4 || st.Total.Dead != 1 || st.Total.PublishedLastMinute != 9 {
		t.Fatalf("total = %+v", st.Total)
	}
	if a := st.Total.OldestPendingAgeSeconds; a < 599 || a > 660 {
		t.Fatalf("oldest pending age %.0fs, want about 600", a)
	}
	if len(st.Topics) != 2 || st.Topics[0].Topic != "orders" || st.Topics[1].Topic != "users" {
		t.Fatalf("topics = %+v", st.Topics)
	}
	if ord := st.Topics[0]; ord.Pending != 3 || ord.Dead != 1 || ord.PublishedLastMinute != 7 {
		t.Fatalf("orders = %+v", ord)
	}
	if us := st.Topics[1]; us.Pending != 1 || us.PublishedLastMinute != 2 || us.OldestPendingAgeSeconds < 299 {
		t.Fatalf("users = %+v", us)
	}
	// From deliveries alone: hook has one event not done (the retrying
	// one) and one dead; kafka none pending.
	sinksByName := map[string]deadletter.SinkStatus{}
	for _, s := range st.Sinks {
		sinksByName[s.Sink] = s
	}
	if h := sinksByName["hook"]; h.Pending != 1 || h.Dead != 1 || h.PublishedLastMinute != 2 || h.OldestPendingAgeSeconds < 599 {
		t.Fatalf("hook from deliveries = %+v", h)
	}
	if k := sinksByName["kafka"]; k.Pending != 0 || k.Dead != 0 || k.PublishedLastMinute != 7 {
		t.Fatalf("kafka from deliveries = %+v", k)
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
	sinksByName = map[string]deadletter.SinkStatus{}
	for _, s := range st.Sinks {
		sinksByName[s.Sink] = s
	}
	if h := sinksByName["hook"]; h.Pending != 4 || h.Dead != 1 {
		t.Fatalf("hook from routes = %+v", h)
	}
	if k := sinksByName["kafka"]; k.Pending != 2 || k.Dead != 0 {
		t.Fatalf("kafka from routes = %+v", k)
	}
	b, _ := json.Marshal(st)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["total"].(map[string]any)["pending"] != 4.0 {
		t.Fatalf("JSON: %s", b)
	}

	totals, err := tb.store.Totals(ctx)
	if err != nil || totals.Pending != 4 || totals.Dead != 1 || totals.OldestPendingAge < 599*time.Second {
		t.Fatalf("Totals = %+v, %v", totals, err)
	}
}

func TestStatusEmpty(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	st, err := tb.store.Status(context.Background(), nil)
	if err != nil || st.Total != (deadletter.Backlog{}) || len(st.Topics) != 0 || st.At.IsZero() {
		t.Fatalf("Status = %+v, %v", st, err)
	}
}
