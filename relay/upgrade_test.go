package relay

import (
	"context"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/deadletter"
)

// TestUpgradeToDeliveryQueues: a database of schema version 4 holding
// retrying, parked, stopped and dead events is migrated to version 5, and a
// relay then delivers everything in key order; nothing is stranded. Then
// migration 005 (with 006 after it) is reverted and applied again.
func TestUpgradeToDeliveryQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	tables := migrations.Tables{Schema: pgtest.UniqueName("herald_up"), Table: "outbox"}
	t.Cleanup(func() { pgtest.DropSchema(t, pool, tables.Schema) })
	m, err := migrations.NewMigrator(pool, tables, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, 4); err != nil {
		t.Fatal(err)
	}
	o, h := tables.Outbox(), tables.Holds()
	// Version 4's state, as its relay left it: key a's head retrying on
	// hook (done on mail) with its follower parked behind it and a third
	// event not yet claimed; key b stopped by a dead letter on hook with a
	// follower parked for an operator; key c's dead letter that did not
	// stop it; an event without a key retrying on mail; an event with no
	// route.
	for _, sql := range []string{
		`INSERT INTO ` + o + ` (topic, key, status, attempts, deliveries, available_at, last_error) VALUES
 ('t', 'a', 'pending', 2, '{"hook": {"state": "retry", "attempts": 2, "error": "HTTP 500", "at": "2026-01-01T00:00:00Z", "next": "2026-01-01T00:00:01Z"}, "mail": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now(), 'hook: HTTP 500'),
 ('t', 'a', 'pending', 0, '{"hook": {"state": "wait", "at": "2026-01-01T00:00:00Z", "next": "2026-01-01T00:00:01Z"}, "mail": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now(), NULL),
 ('t', 'a', 'pending', 0, '{}', now(), NULL),
 ('t', 'b', 'dead', 3, '{"hook": {"state": "dead", "attempts": 3, "error": "HTTP 400", "at": "2026-01-01T00:00:00Z"}, "mail": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now(), 'hook: HTTP 400'),
 ('t', 'b', 'pending', 0, '{"hook": {"state": "wait", "at": "2026-01-01T00:00:00Z", "next": "9999-12-31T00:00:00Z"}, "mail": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', 'infinity', NULL),
 ('t', 'c', 'dead', 1, '{"hook": {"state": "dead", "attempts": 1, "error": "HTTP 410", "at": "2026-01-01T00:00:00Z"}, "mail": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now(), 'hook: HTTP 410'),
 ('t', NULL, 'pending', 1, '{"mail": {"state": "retry", "attempts": 1, "error": "421", "at": "2026-01-01T00:00:00Z", "next": "2026-01-01T00:00:01Z"}, "hook": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now(), 'mail: 421'),
 ('x', 'd', 'dead', 0, '{}', now(), 'no route matches topic "x"')`,
		`UPDATE ` + o + ` SET finished_at = now() WHERE status = 'dead'`,
		`INSERT INTO ` + h + ` (key, sink, seq, until) VALUES
 ('a', 'hook', 1, now()), ('a', 'hook', 2, now()), ('b', 'hook', 4, 'infinity'), ('b', 'hook', 5, 'infinity')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := m.Up(ctx, 0); err != nil {
		t.Fatalf("migrating to the delivery queues: %v", err)
	}
	b := pgBundle(pool, tables)
	var state string
	if err := pool.QueryRow(ctx, `SELECT string_agg(sink || ':' || seq || ':' || state || CASE WHEN stops_key THEN '!' ELSE '' END
    || ':' || attempts, ' ' ORDER BY seq, sink) FROM `+tables.Deliveries()).Scan(&state); err != nil {
		t.Fatal(err)
	}
	const want = "hook:1:ready:2 hook:2:waiting:0 hook:4:dead!:3 hook:5:waiting:0 hook:6:dead:1 mail:7:ready:1 :8:dead:0"
	if state != want {
		t.Fatalf("deliveries after the upgrade:\n got %s\nwant %s", state, want)
	}
	if n := b.count(t, "true"); n != 1 {
		t.Fatalf("%d rows left in the outbox, want the one never claimed", n)
	}

	hook, mail := &testSink{name: "hook", rec: b.rec}, &testSink{name: "mail", rec: b.rec}
	cfg := b.config(t, hook, mail)
	cfg.StopKeyOnDeadLetter = true
	stop := b.start(t, cfg)
	waitFor(t, time.Minute, "key a and the keyless event delivered", func() bool {
		return len(b.rec.forSink("hook")) == 3 && len(b.rec.forSink("mail")) == 2
	})
	if got := seqsInOrder(b.rec.forSink("hook")); got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("hook received %v, want key a's 1, 2, 3 in order", got)
	}
	store, err := deadletter.New(pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := store.Replay(ctx, deadletter.Filter{Key: "b"}, deadletter.ReplayOpts{}); err != nil || res.Count != 1 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	waitFor(t, time.Minute, "key b's stopped events delivered", func() bool { return len(b.rec.forSink("hook")) == 5 })
	checkKeyOrder(t, b.rec.all())
	waitFor(t, time.Minute, "only the two dead letters left (key c's on hook, the unroutable one)", func() bool {
		return b.countDeliveries(t, "true") == 2 && b.countDeliveries(t, "state = 'dead'") == 2
	})

	stop() // migration 005 refuses to run under live relays
	if _, err := m.Down(ctx, migrations.Latest()-4); err != nil {
		t.Fatalf("reverting the migrations after version 4: %v", err)
	}
	if n := b.count(t, "status = 'dead'"); n != 2 {
		t.Fatalf("%d dead rows after reverting, want 2", n)
	}
	if _, err := m.Up(ctx, 0); err != nil {
		t.Fatalf("applying migration 005 again: %v", err)
	}
	if n := b.countDeliveries(t, "state = 'dead'"); n != 2 {
		t.Fatalf("%d dead letters after a round trip through version 4, want 2", n)
	}
}
