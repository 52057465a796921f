package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// Hostile rows and peers: values a writer or a peer can put where the relay
// reads or stores them. Each must stop nothing but its own event.
// PostgreSQL only: the values are PostgreSQL's (infinity, triggers, roles);
// the MySQL tables' refusals are tested in migrations/mysql and
// relay/internal/mysqlstore.

// TestTimesAWriterSetsMustBeTimes covers created_at and available_at set to
// 'infinity', '-infinity' or dates outside years 1 to 9999 by a plain
// INSERT: the table refuses what cannot be a time (migration 006), and
// accepts '-infinity' (due at once) and a far future (a long delay).
func TestTimesAWriterSetsMustBeTimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		column, value string
		refused       bool
	}{
		{"created_at", "infinity", true},
		{"created_at", "-infinity", true},
		{"created_at", "10000-01-01", true},
		{"created_at", "0001-01-01 BC", true},
		{"available_at", "infinity", true},
		{"available_at", "-infinity", false},
		{"available_at", "3000-01-01", false},
	} {
		_, err := b.pool.Exec(ctx, "INSERT INTO "+b.tables.Outbox()+" (topic, "+c.column+") VALUES ('t', $1::timestamptz)", c.value)
		switch {
		case c.refused && (err == nil || !strings.Contains(err.Error(), c.column+"_check")):
			t.Errorf("%s = %s: %v, want refused by %s_check", c.column, c.value, err, c.column)
		case !c.refused && err != nil:
			t.Errorf("%s = %s: %v, want accepted", c.column, c.value, err)
		}
	}
}

// TestUnreadableCreatedAtStopsOnlyItsEvent covers a row whose created_at
// is 'infinity', written before migration 006 checked it: the relay once
// failed every claim of its lanes on it (cannot scan Infinity), and 9 of 20
// ordinary events stayed pending. Now that row alone is dead-lettered with
// the reason, the others are delivered, and listing the dead letters works.
func TestUnreadableCreatedAtStopsOnlyItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, "ALTER TABLE "+b.tables.Outbox()+" DROP CONSTRAINT outbox_created_at_check"); err != nil {
		t.Fatal(err)
	}
	var bad int64
	if err := b.pool.QueryRow(ctx, "INSERT INTO "+b.tables.Outbox()+" (topic, key, payload, created_at) VALUES ('t', 'k', '{}', 'infinity') RETURNING seq").Scan(&bad); err != nil {
		t.Fatal(err)
	}
	evs := make([]ev, 20)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%3)}
	}
	seqs := b.insert(t, evs...)
	b.start(t, b.config(t, &testSink{name: "mem", rec: b.rec}))
	waitFor(t, time.Minute, "the 20 events delivered and the bad row dead-lettered", func() bool {
		return len(b.rec.all()) == 20 && b.countDeliveries(t, "sink = '' AND state = 'dead'") == 1
	})
	exactlyOnce(t, b.rec.all(), "mem", seqs)
	store, err := deadletter.New(b.pool, b.tables)
	if err != nil {
		t.Fatal(err)
	}
	var got []deadletter.DeadLetter
	if err := store.List(ctx, deadletter.Filter{}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		got = append(got, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Seq != bad || !strings.Contains(got[0].LastError, "created_at is infinity") {
		t.Fatalf("dead letters %+v, want seq %d naming created_at", got, bad)
	}
	if got[0].CreatedAt.Year() != 9999 {
		t.Fatalf("created_at 'infinity' listed as %v, want the last time JSON can carry", got[0].CreatedAt)
	}
}

// TestAttemptsAtTheLimitDoNotOverflow covers an attempts count an operator
// (or a long outage of a retrying sink) left at 2,147,483,647: the next
// failure made it overflow the integer column, the record failed, and the
// batch was sent again and again. It is clamped, and the delivery dies of
// its attempts.
func TestAttemptsAtTheLimitDoNotOverflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sink := &testSink{name: "mem", rec: b.rec, fail: func(sinks.Event) error { return errBoom }}
	cfg := b.config(t, sink)
	cfg.Backoff = Backoff{Initial: time.Hour, Max: time.Hour}
	seqs := b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "j"})
	stop := b.start(t, cfg)
	waitFor(t, time.Minute, "both events retrying", func() bool { return b.countDeliveries(t, "state = 'ready' AND attempts = 1") == 2 })
	stop()
	if _, err := b.pool.Exec(ctx, "UPDATE "+b.tables.Deliveries()+" SET attempts = 2147483647, next_at = now() WHERE seq = $1", seqs[0]); err != nil {
		t.Fatal(err)
	}
	b.start(t, cfg)
	waitFor(t, time.Minute, "the event at the limit dead", func() bool {
		return b.countDeliveries(t, "state = 'dead' AND attempts = 2147483647") == 1
	})
}

// TestPeerTextIsStoredClean covers an error text from a peer holding NUL,
// invalid UTF-8 and megabytes (an SMTP server answering RCPT with
// "550 5.1.1 no such user\x00\xff here"): PostgreSQL refused it in text, the
// batch's record failed, and the next batches were published again and
// again. It is stored valid, without NUL, bounded; the other events go
// through.
func TestPeerTextIsStoredClean(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hostile := "550 5.1.1 no such user\x00\xff here " + strings.Repeat("é", 100000)
	sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
		if e.Topic == "bad" {
			return sinks.Permanent(errors.New(hostile))
		}
		return nil
	}}
	evs := []ev{{topic: "bad", key: "k"}}
	for i := range 20 {
		evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", i%4)})
	}
	seqs := b.insert(t, evs...)
	b.start(t, b.config(t, sink))
	waitFor(t, time.Minute, "the good events delivered, the bad one dead", func() bool {
		return len(b.rec.all()) == 20 && b.countDeliveries(t, "state = 'dead'") == 1
	})
	exactlyOnce(t, b.rec.all(), "mem", seqs[1:])
	var stored string
	if err := b.pool.QueryRow(context.Background(), "SELECT last_error FROM "+b.tables.Deliveries()).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !utf8.ValidString(stored) || strings.ContainsRune(stored, 0) || len(stored) > maxErrorBytes+len("…") ||
		!strings.HasPrefix(stored, "550 5.1.1 no such user\uFFFD\uFFFD here") {
		t.Fatalf("stored error %.80q… (%d bytes): want the text cleaned and bounded", stored, len(stored))
	}
}

// TestRefusedRecordSetsAsideOnlyItsEvent covers one event whose record the
// database refuses (here a trigger refuses its delivery, as it would a
// value out of a column's range): the whole batch's record failed before,
// again and again, and its events were published again each time. Now the
// batch is recorded event by event, that one is a dead letter saying why,
// and the others are recorded as they went.
func TestRefusedRecordSetsAsideOnlyItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
		if e.Topic == "retry" {
			return errBoom
		}
		return nil
	}}
	cfg := b.config(t, sink)
	cfg.Backoff = Backoff{Initial: time.Hour, Max: time.Hour}
	var evs []ev
	for i := range 10 {
		evs = append(evs, ev{topic: "retry", key: fmt.Sprintf("r%d", i)}, ev{topic: "ok", key: fmt.Sprintf("o%d", i)})
	}
	seqs := b.insert(t, evs...)
	refused := seqs[4]
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]q.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.seq = %[2]d AND NEW.state <> 'dead' THEN
        RAISE EXCEPTION 'value out of range for this test' USING ERRCODE = '22003';
    END IF;
    RETURN NEW;
END $$`, b.tables.Schema, refused)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON %s
FOR EACH ROW EXECUTE FUNCTION %q.refuse()`, b.tables.Deliveries(), b.tables.Schema)); err != nil {
		t.Fatal(err)
	}
	b.start(t, cfg)
	waitFor(t, time.Minute, "the batch recorded: 9 retrying, 1 set aside, the rest delivered", func() bool {
		return b.count(t, "true") == 0 && b.countDeliveries(t, "state = 'ready' AND attempts = 1") == 9 &&
			b.countDeliveries(t, "sink = '' AND state = 'dead'") == 1
	})
	var lastErr string
	if err := b.pool.QueryRow(ctx, "SELECT last_error FROM "+b.tables.Deliveries()+" WHERE seq = $1", refused).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "the database refused to record this event") || !strings.Contains(lastErr, "value out of range for this test") {
		t.Fatalf("set-aside event's error %q, want the database's reason", lastErr)
	}
	if n := len(b.rec.forSink("mem")); n != 10 {
		t.Fatalf("the sink received %d events, want the 10 that succeeded, each once", n)
	}
}

// logCounter counts the relay's log records whose message starts with a
// prefix.
type logCounter struct {
	slog.Handler
	prefix string
	n      *atomic.Int64
}

// Enabled counts whatever the wrapped handler would discard.
func (h logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h logCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h logCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logCounter{h.Handler.WithAttrs(attrs), h.prefix, h.n}
}

func (h logCounter) WithGroup(name string) slog.Handler {
	return logCounter{h.Handler.WithGroup(name), h.prefix, h.n}
}

// TestRecordRefusedStopsPublishing covers a relay whose role loses the
// privilege to delete outbox rows (REVOKE DELETE for 10 s once made 845
// duplicates): after the first record it cannot write, it publishes nothing
// more and says so (RecordFailure), retries the record while it keeps its
// lanes, and resumes once the privilege is back, with every event delivered
// once.
func TestRecordRefusedStopsPublishing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	role := pgtest.UniqueName("herald_role")
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{b.tables.Schema}.Sanitize() + " TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + pgx.Identifier{b.tables.Schema}.Sanitize() + " TO " + role,
	} {
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = b.pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User = role
	pcfg.MaxConns = PoolSize(2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	sink := &testSink{name: "mem", rec: b.rec}
	var refusals atomic.Int64
	cfg := b.config(t, sink)
	cfg.Logger = slog.New(logCounter{testLogger(t).Handler(), "relay: recording failed", &refusals})
	r, err := NewPostgres(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	seqs := b.insert(t, ev{topic: "t", key: "a"})
	waitFor(t, time.Minute, "the first event delivered", func() bool { return b.count(t, "true") == 0 })
	if _, err := b.pool.Exec(ctx, "REVOKE DELETE ON "+b.tables.Outbox()+" FROM "+role); err != nil {
		t.Fatal(err)
	}
	seqs = append(seqs, b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"})...)
	waitFor(t, time.Minute, "the record refused three times", func() bool { return refusals.Load() >= 3 })
	since, ferr := r.RecordFailure()
	if since.IsZero() || ferr == nil || !strings.Contains(ferr.Error(), "permission denied") {
		t.Fatalf("RecordFailure() = %v, %v; want the refusal", since, ferr)
	}
	// Three attempts, and still only the batch in flight was published.
	calls := sink.publishes()
	more := refusals.Load() + 2
	waitFor(t, time.Minute, "two more refusals", func() bool { return refusals.Load() >= more })
	if sink.publishes() != calls || calls != 2 {
		t.Fatalf("%d Publish calls while recording failed (%d before), want the 2 of the batches before the refusal", sink.publishes(), calls)
	}
	if _, err := b.pool.Exec(ctx, "GRANT DELETE ON "+b.tables.Outbox()+" TO "+role); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the events recorded once the privilege is back", func() bool {
		return b.count(t, "true") == 0 && len(b.rec.all()) == 3
	})
	exactlyOnce(t, b.rec.all(), "mem", seqs)
	// The worker clears the failure once its record has returned, just
	// after the commit the test saw.
	waitFor(t, time.Minute, "RecordFailure cleared after recording resumed", func() bool {
		since, _ := r.RecordFailure()
		return since.IsZero()
	})
}
