package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/pgtest"
	"github.com/heraldhq/herald/relay/deadletter"
)

type testBundle struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	store  *deadletter.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	store, err := deadletter.New(pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, tables: tables, store: store}
}

// dead is a dead row to insert.
type dead struct {
	topic, key, lastError string
	deliveries            string // JSON
	diedAgo               time.Duration
}

// insertDead inserts dead rows and returns their ids, in order.
func (tb *testBundle) insertDead(t *testing.T, rows ...dead) []string {
	t.Helper()
	ids := make([]string, len(rows))
	for i, r := range rows {
		if r.deliveries == "" {
			r.deliveries = "{}"
		}
		var key any
		if r.key != "" {
			key = r.key
		}
		err := tb.pool.QueryRow(context.Background(), `INSERT INTO `+tb.tables.Outbox()+`
(topic, key, payload, status, attempts, last_error, deliveries, finished_at)
VALUES ($1, $2, '{"n": 1}', 'dead', 3, $3, $4::jsonb, now() - $5::interval) RETURNING id::text`,
			r.topic, key, r.lastError, r.deliveries, r.diedAgo).Scan(&ids[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func (tb *testBundle) list(t *testing.T, f deadletter.Filter, opts deadletter.ListOpts) []deadletter.DeadLetter {
	t.Helper()
	var out []deadletter.DeadLetter
	if err := tb.store.List(context.Background(), f, opts, func(d deadletter.DeadLetter) error {
		out = append(out, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func ids(ds []deadletter.DeadLetter) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func TestTopicLike(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"orders.created": "orders.created",
		"orders.*":       "orders.%",
		"*":              "%",
		"a_b%c\\d*":      `a\_b\%c\\d%`,
		"":               "",
	} {
		if got := deadletter.TopicLike(in); got != want {
			t.Errorf("TopicLike(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	id := tb.insertDead(t,
		dead{topic: "orders.created", key: "o-1", lastError: "hook: HTTP 410 Gone", deliveries: `{"hook": {"state": "dead", "attempts": 1, "error": "HTTP 410 Gone", "at": "2026-01-01T00:00:00Z"}, "kafka": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}`, diedAgo: 3 * time.Hour},
		dead{topic: "orders.paid", key: "o-2", lastError: "kafka: MESSAGE too large", deliveries: `{"kafka": {"state": "dead", "attempts": 1, "error": "message too large", "at": "2026-01-01T00:00:00Z"}}`, diedAgo: 2 * time.Hour},
		dead{topic: "users_created", lastError: "no route matches topic", diedAgo: time.Hour},
		dead{topic: "usersXcreated", lastError: "no route matches topic", diedAgo: time.Minute},
	)
	// A pending and a delivered row are never listed.
	if _, err := tb.pool.Exec(context.Background(), "INSERT INTO "+tb.tables.Outbox()+" (topic, status, finished_at) VALUES ('orders.created', 'pending', NULL), ('orders.created', 'done', now())"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cases := []struct {
		name string
		f    deadletter.Filter
		want []string
	}{
		{"all", deadletter.Filter{}, id},
		{"topic exact", deadletter.Filter{Topic: "orders.paid"}, id[1:2]},
		{"topic wildcard", deadletter.Filter{Topic: "orders.*"}, id[:2]},
		{"underscore is literal", deadletter.Filter{Topic: "users_created"}, id[2:3]},
		{"star in the middle", deadletter.Filter{Topic: "users*created"}, id[2:4]},
		{"key", deadletter.Filter{Key: "o-2"}, id[1:2]},
		{"sink dead", deadletter.Filter{Sink: "kafka"}, id[1:2]},
		{"sink dead on hook", deadletter.Filter{Sink: "hook"}, id[:1]},
		{"error substring, any case", deadletter.Filter{Error: "message TOO"}, id[1:2]},
		{"error with LIKE characters", deadletter.Filter{Error: "%"}, nil},
		{"since", deadletter.Filter{Since: now.Add(-90 * time.Minute)}, id[2:]},
		{"until", deadletter.Filter{Until: now.Add(-90 * time.Minute)}, id[:2]},
		{"since and until", deadletter.Filter{Since: now.Add(-150 * time.Minute), Until: now.Add(-30 * time.Minute)}, id[1:3]},
		{"older than", deadletter.Filter{OlderThan: 30 * time.Minute}, id[:3]},
		{"ids", deadletter.Filter{IDs: []string{id[3], strings.ToUpper(id[0])}}, []string{id[0], id[3]}},
		{"ids and topic", deadletter.Filter{IDs: []string{id[3], id[0]}, Topic: "orders.*"}, id[:1]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ids(tb.list(t, c.f, deadletter.ListOpts{}))
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			n, err := tb.store.Count(context.Background(), c.f)
			if err != nil || n != int64(len(c.want)) {
				t.Fatalf("Count = %d, %v; want %d", n, err, len(c.want))
			}
		})
	}
	got := tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Limit: 2})
	if !slices.Equal(ids(got), id[:2]) {
		t.Fatalf("limit 2: %v", ids(got))
	}
	if next := ids(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{AfterSeq: got[1].Seq})); !slices.Equal(next, id[2:]) {
		t.Fatalf("after seq: %v", next)
	}
	d := got[0]
	if d.Topic != "orders.created" || d.Key != "o-1" || d.Attempts != 3 || d.LastError != "hook: HTTP 410 Gone" ||
		!slices.Equal(d.DeadSinks, []string{"hook"}) || time.Since(d.DiedAt) < 3*time.Hour-time.Minute || d.CreatedAt.IsZero() {
		t.Fatalf("listed %+v", d)
	}
}

func TestFilterValidate(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for _, c := range []struct {
		f    deadletter.Filter
		want string
	}{
		{deadletter.Filter{IDs: []string{"nope"}}, `id: "nope" is not a UUID`},
		{deadletter.Filter{OlderThan: -time.Second}, "older_than: must not be negative"},
		{deadletter.Filter{Since: time.Now(), Until: time.Now().Add(-time.Hour)}, "until:"},
	} {
		err := tb.store.List(context.Background(), c.f, deadletter.ListOpts{}, func(deadletter.DeadLetter) error { return nil })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("List(%+v) = %v, want %q", c.f, err, c.want)
		}
		if _, err := tb.store.Replay(context.Background(), c.f, deadletter.ReplayOpts{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Replay(%+v) = %v, want %q", c.f, err, c.want)
		}
	}
	// fn's error stops the walk and is returned.
	tb.insertDead(t, dead{topic: "a"}, dead{topic: "b"})
	stop := errors.New("stop")
	calls := 0
	err := tb.store.List(context.Background(), deadletter.Filter{}, deadletter.ListOpts{}, func(deadletter.DeadLetter) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List returned %v after %d calls", err, calls)
	}
}

func TestShow(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	var jsonID, binID string
	err := tb.pool.QueryRow(ctx, `INSERT INTO `+tb.tables.Outbox()+`
(topic, key, payload, headers, status, attempts, max_attempts, last_error, deliveries, finished_at, available_at)
VALUES ('orders.created', 'o-1', '{"total":42,"items":[1,2]}', '{"X-Tenant": "acme", "n": 5}', 'dead', 4, 7, 'hook: HTTP 500',
        '{"hook": {"state": "dead", "attempts": 4, "error": "HTTP 500", "at": "2026-01-02T03:04:05Z"}, "kafka": {"state": "done", "attempts": 1, "at": "2026-01-02T03:00:00Z"}}',
        now(), 'infinity') RETURNING id::text`).Scan(&jsonID)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.pool.QueryRow(ctx, `INSERT INTO `+tb.tables.Outbox()+` (topic, payload_bin, content_type) VALUES ('bin', '\x00ff', 'application/octet-stream') RETURNING id::text`).Scan(&binID); err != nil {
		t.Fatal(err)
	}
	e, err := tb.store.Show(ctx, jsonID)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != jsonID || e.Topic != "orders.created" || e.Key != "o-1" || e.Status != "dead" || !e.PayloadJSON ||
		string(e.Payload) != `{"total":42,"items":[1,2]}` || e.Headers["X-Tenant"] != "acme" || e.Headers["n"] != "5" ||
		e.Attempts != 4 || e.MaxAttempts != 7 || e.LastError != "hook: HTTP 500" || e.FinishedAt.IsZero() || e.AvailableAt.Year() != 9999 {
		t.Fatalf("Show = %+v", e)
	}
	if d := e.Deliveries["hook"]; d.State != "dead" || d.Attempts != 4 || d.Error != "HTTP 500" || !d.At.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("hook delivery = %+v", d)
	}
	if e.Deliveries["kafka"].State != "done" {
		t.Fatalf("kafka delivery = %+v", e.Deliveries["kafka"])
	}
	var m map[string]any
	b, _ := json.Marshal(e)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if p, ok := m["payload"].(map[string]any); !ok || p["total"] != 42.0 || m["id"] != jsonID || m["payload_base64"] != nil {
		t.Fatalf("JSON: %s", b)
	}

	e, err = tb.store.Show(ctx, binID)
	if err != nil {
		t.Fatal(err)
	}
	if e.PayloadJSON || string(e.Payload) != "\x00\xff" || e.Status != "pending" {
		t.Fatalf("binary Show = %+v", e)
	}
	b, _ = json.Marshal(e)
	if !strings.Contains(string(b), `"payload_base64":"AP8="`) || strings.Contains(string(b), `"payload":`) {
		t.Fatalf("binary JSON: %s", b)
	}

	if _, err := tb.store.Show(ctx, "0190a0b0-0000-7000-8000-000000000000"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := tb.store.Show(ctx, "x"); err == nil || !strings.Contains(err.Error(), "not a UUID") {
		t.Fatalf("bad id: %v", err)
	}
}

// rowState is the columns a replay changes.
type rowState struct {
	status, lastError, deliveries string
	attempts                      int
	availableAt                   string
	finished                      bool
}

func (tb *testBundle) state(t *testing.T, id string) rowState {
	t.Helper()
	var s rowState
	err := tb.pool.QueryRow(context.Background(), `SELECT status, coalesce(last_error, ''), deliveries::text,
  attempts, CASE WHEN available_at = 'infinity' THEN 'infinity' WHEN available_at <= now() THEN 'due' ELSE 'later' END, finished_at IS NOT NULL
FROM `+tb.tables.Outbox()+` WHERE id = $1`, id).Scan(&s.status, &s.lastError, &s.deliveries, &s.attempts, &s.availableAt, &s.finished)
	if err != nil {
		t.Fatalf("reading row %s: %v", id, err)
	}
	return s
}

func TestReplayKeepsOnlyDoneDeliveries(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	deliveries := `{"hook": {"state": "dead", "attempts": 3, "error": "HTTP 500", "at": "2026-01-01T00:00:00Z"}, "kafka": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}`
	id := tb.insertDead(t,
		dead{topic: "a", lastError: "hook: HTTP 500", deliveries: deliveries},
		dead{topic: "b", lastError: "hook: HTTP 500", deliveries: deliveries},
		dead{topic: "c", lastError: "no route"})
	missing := "0190a0b0-0000-7000-8000-000000000000"
	res, err := tb.store.Replay(ctx, deadletter.Filter{IDs: []string{id[0], missing}}, deadletter.ReplayOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 1 || !slices.Equal(res.Missing, []string{missing}) {
		t.Fatalf("Replay = %+v", res)
	}
	got := tb.state(t, id[0])
	want := rowState{status: "pending", deliveries: `{"kafka": {"at": "2026-01-01T00:00:00Z", "state": "done", "attempts": 1}}`, availableAt: "due"}
	if got != want {
		t.Fatalf("replayed row:\n got %+v\nwant %+v", got, want)
	}
	if s := tb.state(t, id[1]); s.status != "dead" || s.deliveries == "{}" {
		t.Fatalf("row not selected was changed: %+v", s)
	}
	res, err = tb.store.Replay(ctx, deadletter.Filter{Topic: "b"}, deadletter.ReplayOpts{AllSinks: true})
	if err != nil || res.Count != 1 || res.Missing != nil {
		t.Fatalf("Replay all sinks = %+v, %v", res, err)
	}
	if s := tb.state(t, id[1]); s.status != "pending" || s.deliveries != "{}" || s.attempts != 0 {
		t.Fatalf("replayed to all sinks: %+v", s)
	}
	// Replaying what is no longer dead does nothing.
	res, err = tb.store.Replay(ctx, deadletter.Filter{IDs: []string{id[0]}}, deadletter.ReplayOpts{})
	if err != nil || res.Count != 0 || !slices.Equal(res.Missing, []string{id[0]}) {
		t.Fatalf("second replay = %+v, %v", res, err)
	}
}

// TestReplayAndPurgeEndHolds: under stop_key_on_dead_letter a dead event
// keeps an 'infinity' hold and the later events of its key are parked at
// 'infinity'. Replaying or purging it removes its holds and wakes them; other
// keys stay parked.
func TestReplayAndPurgeEndHolds(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"replay", "purge"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			ctx := context.Background()
			dl := tb.insertDead(t, dead{topic: "t", key: "k1"}, dead{topic: "t", key: "k2"})
			var seq1, seq2 int64
			if err := tb.pool.QueryRow(ctx, "SELECT (SELECT seq FROM "+tb.tables.Outbox()+" WHERE id = $1), (SELECT seq FROM "+tb.tables.Outbox()+" WHERE id = $2)", dl[0], dl[1]).Scan(&seq1, &seq2); err != nil {
				t.Fatal(err)
			}
			var parked1, parked2, later string
			if err := tb.pool.QueryRow(ctx, "INSERT INTO "+tb.tables.Outbox()+" (topic, key, available_at) VALUES ('t', 'k1', 'infinity') RETURNING id::text").Scan(&parked1); err != nil {
				t.Fatal(err)
			}
			if err := tb.pool.QueryRow(ctx, "INSERT INTO "+tb.tables.Outbox()+" (topic, key, available_at) VALUES ('t', 'k2', 'infinity') RETURNING id::text").Scan(&parked2); err != nil {
				t.Fatal(err)
			}
			if err := tb.pool.QueryRow(ctx, "INSERT INTO "+tb.tables.Outbox()+" (topic, key, available_at) VALUES ('t', 'k1', now() + interval '1 hour') RETURNING id::text").Scan(&later); err != nil {
				t.Fatal(err)
			}
			if _, err := tb.pool.Exec(ctx, "INSERT INTO "+tb.tables.Holds()+" (key, sink, seq, until) VALUES ('k1', 'hook', $1, 'infinity'), ('k1', 'mail', $1, 'infinity'), ('k2', 'hook', $2, 'infinity')", seq1, seq2); err != nil {
				t.Fatal(err)
			}
			var err error
			if op == "replay" {
				_, err = tb.store.Replay(ctx, deadletter.Filter{Key: "k1"}, deadletter.ReplayOpts{})
			} else {
				_, err = tb.store.Purge(ctx, deadletter.Filter{Key: "k1"}, deadletter.PurgeOpts{})
			}
			if err != nil {
				t.Fatal(err)
			}
			var holds []string
			rows, _ := tb.pool.Query(ctx, "SELECT key || '/' || sink FROM "+tb.tables.Holds()+" ORDER BY 1")
			for rows.Next() {
				var h string
				_ = rows.Scan(&h)
				holds = append(holds, h)
			}
			if rows.Err() != nil || !slices.Equal(holds, []string{"k2/hook"}) {
				t.Fatalf("holds left: %v (%v)", holds, rows.Err())
			}
			if s := tb.state(t, parked1); s.availableAt != "due" {
				t.Fatalf("parked follower of k1 not woken: %+v", s)
			}
			if s := tb.state(t, later); s.availableAt != "later" {
				t.Fatalf("delayed event of k1 was moved: %+v", s)
			}
			if s := tb.state(t, parked2); s.availableAt != "infinity" {
				t.Fatalf("parked follower of k2 woken: %+v", s)
			}
		})
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	id := tb.insertDead(t, dead{topic: "a", diedAgo: 2 * time.Hour}, dead{topic: "a", diedAgo: time.Minute}, dead{topic: "b", diedAgo: 3 * time.Hour})
	res, err := tb.store.Purge(ctx, deadletter.Filter{Topic: "a", OlderThan: time.Hour}, deadletter.PurgeOpts{})
	if err != nil || res.Count != 1 {
		t.Fatalf("Purge = %+v, %v", res, err)
	}
	if left := ids(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{})); !slices.Equal(left, id[1:]) {
		t.Fatalf("left after purge: %v", left)
	}
}

// TestHundredThousand lists, replays and purges 100,000 dead rows in
// batches, reporting progress after each.
func TestHundredThousand(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	const n = 100000
	start := time.Now()
	if _, err := tb.pool.Exec(ctx, `INSERT INTO `+tb.tables.Outbox()+` (topic, key, payload, status, attempts, last_error, deliveries, finished_at)
SELECT CASE WHEN i % 2 = 0 THEN 'even.t' ELSE 'odd.t' END, 'k-' || (i % 1000), '{"i": 1}', 'dead', 1, 'hook: HTTP 500',
       '{"hook": {"state": "dead", "attempts": 1, "error": "HTTP 500", "at": "2026-01-01T00:00:00Z"}}', now()
FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("inserted %d rows in %s", n, time.Since(start))

	start = time.Now()
	count, pages := 0, 0
	var lastSeq int64
	err := tb.store.List(ctx, deadletter.Filter{}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		if d.Seq <= lastSeq {
			return fmt.Errorf("seq %d after %d", d.Seq, lastSeq)
		}
		lastSeq = d.Seq
		count++
		if count%deadletter.DefaultBatchSize == 1 {
			pages++
		}
		return nil
	})
	if err != nil || count != n {
		t.Fatalf("List: %d rows, %v", count, err)
	}
	t.Logf("listed %d rows in %s", count, time.Since(start))

	start = time.Now()
	var progress []int64
	res, err := tb.store.Replay(ctx, deadletter.Filter{Topic: "even.*"}, deadletter.ReplayOpts{Progress: func(done int64) { progress = append(progress, done) }})
	if err != nil || res.Count != n/2 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	if len(progress) != n/2/deadletter.DefaultBatchSize || progress[0] != deadletter.DefaultBatchSize || progress[len(progress)-1] != n/2 {
		t.Fatalf("progress calls: %d (first %v)", len(progress), progress[:min(3, len(progress))])
	}
	t.Logf("replayed %d rows in %s", res.Count, time.Since(start))

	start = time.Now()
	progress = nil
	res, err = tb.store.Purge(ctx, deadletter.Filter{}, deadletter.PurgeOpts{Progress: func(done int64) { progress = append(progress, done) }})
	if err != nil || res.Count != n/2 || len(progress) != n/2/deadletter.DefaultBatchSize {
		t.Fatalf("Purge = %+v, %v, %d progress calls", res, err, len(progress))
	}
	t.Logf("purged %d rows in %s", res.Count, time.Since(start))
	var pending, deadLeft int
	if err := tb.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'dead') FROM "+tb.tables.Outbox()).Scan(&pending, &deadLeft); err != nil {
		t.Fatal(err)
	}
	if pending != n/2 || deadLeft != 0 {
		t.Fatalf("pending %d, dead %d", pending, deadLeft)
	}
}
