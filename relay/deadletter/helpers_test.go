package deadletter_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/pgtest"
	_ "github.com/heraldhq/herald/migrations/pgtest/pgcontainer" // a container when no server answers
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

func (tb *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := tb.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// event is an event written straight into the deliveries table, as the
// relay would have left it: its seq comes from the outbox's identity.
type event struct {
	seq        int64
	id         string
	topic, key string
	// payload (JSON text, default {"n": 1}), headers (a JSON object) and
	// maxAttempts are copied into each of its deliveries.
	payload, headers string
	maxAttempts      int
	createdAgo       time.Duration
}

// newEvent allocates an event's seq and id.
func (tb *testBundle) newEvent(t *testing.T, topic, key string) *event {
	t.Helper()
	e := &event{topic: topic, key: key}
	err := tb.pool.QueryRow(context.Background(), `SELECT nextval(pg_get_serial_sequence($1, 'seq')), gen_random_uuid()::text`,
		tb.tables.Outbox()).Scan(&e.seq, &e.id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// delivery is one row of the deliveries table to write for an event.
type delivery struct {
	sink      string
	state     string // dead when empty
	stops     bool
	attempts  int
	lastError string
	diedAgo   time.Duration
}

// put writes deliveries of e.
func (tb *testBundle) put(t *testing.T, e *event, ds ...delivery) {
	t.Helper()
	payload, headers := e.payload, e.headers
	if payload == "" {
		payload = `{"n": 1}`
	}
	if headers == "" {
		headers = "{}"
	}
	for _, d := range ds {
		if d.state == "" {
			d.state = "dead"
		}
		tb.exec(t, `INSERT INTO `+tb.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, headers, created_at,
    max_attempts, state, stops_key, attempts, next_at, last_error, dead_at)
VALUES ($1, $2, hashtext(coalesce($5::text, $3::text)) & 63, $3::text::uuid, $4, $5, $6::json, $7::jsonb, now() - $8::interval,
    $9, $10, $11, $12, CASE WHEN $10 = 'ready' THEN now() END, $13, CASE WHEN $10 = 'dead' THEN now() - $14::interval END)`,
			d.sink, e.seq, e.id, e.topic, pgtype.Text{String: e.key, Valid: e.key != ""}, payload, headers, e.createdAgo,
			pgtype.Int4{Int32: int32(e.maxAttempts), Valid: e.maxAttempts > 0}, d.state, d.stops, d.attempts,
			pgtype.Text{String: d.lastError, Valid: d.lastError != ""}, d.diedAgo)
	}
}

// dead writes an event with one dead letter on each of sinks.
func (tb *testBundle) dead(t *testing.T, topic, key string, sinks ...string) *event {
	t.Helper()
	e := tb.newEvent(t, topic, key)
	for _, s := range sinks {
		tb.put(t, e, delivery{sink: s, lastError: "HTTP 500"})
	}
	return e
}

// row is a delivery's state as the tests compare it.
type row struct {
	state    string
	stops    bool
	attempts int
	due      bool // next_at set and not in the future
	err      bool // last_error set
	died     bool // dead_at set
}

func (r row) String() string {
	return fmt.Sprintf("%s stops=%v attempts=%d due=%v err=%v died=%v", r.state, r.stops, r.attempts, r.due, r.err, r.died)
}

var (
	ready   = row{state: "ready", due: true}
	waiting = row{state: "waiting"}
)

// row returns e's delivery on sink, or a row with state "gone".
func (tb *testBundle) row(t *testing.T, e *event, sink string) row {
	t.Helper()
	var r row
	err := tb.pool.QueryRow(context.Background(), `SELECT state, stops_key, attempts, coalesce(next_at <= now(), false),
       last_error IS NOT NULL, dead_at IS NOT NULL
FROM `+tb.tables.Deliveries()+` WHERE sink = $1 AND seq = $2`, sink, e.seq).Scan(&r.state, &r.stops, &r.attempts, &r.due, &r.err, &r.died)
	if err != nil && strings.Contains(err.Error(), "no rows") {
		return row{state: "gone"}
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkHeads fails unless every queue with waiting deliveries has exactly
// one head.
func (tb *testBundle) checkHeads(t *testing.T) {
	t.Helper()
	var bad []string
	rows, err := tb.pool.Query(context.Background(), `SELECT key || '/' || sink FROM `+tb.tables.Deliveries()+`
WHERE key IS NOT NULL AND (state <> 'dead' OR stops_key)
GROUP BY key, sink HAVING count(*) FILTER (WHERE state = 'ready' OR stops_key) <> 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, q)
	}
	if rows.Err() != nil || len(bad) > 0 {
		t.Fatalf("queues without exactly one head: %v (%v)", bad, rows.Err())
	}
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

// names are dead letters as "id/sink".
func names(ds []deadletter.DeadLetter) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID + "/" + d.Sink
	}
	return out
}

func name(e *event, sink string) string { return e.id + "/" + sink }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tb *testBundle) count(t *testing.T, table, where string) int {
	t.Helper()
	var n int
	if err := tb.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}
