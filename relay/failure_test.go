package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/sinks"
)

// The failure path's regression tests: each reproduces a way the earlier
// design (a hold per waiting event, copied from its head's retry time)
// stranded, churned, slowed or reordered events.

// TestReplayReleasesEveryFollower: with stop_key_on_dead_letter and three
// sinks, E1 (good+bad) dies on bad and stops key k there; E2
// (good+bad+flaky) waits behind it on bad while it keeps failing on flaky;
// E3 (good+bad) waits on bad too. Replaying E1 while E2 still fails on flaky
// must let E1, E2 and E3 reach bad in order, and E2 reach flaky once it
// heals. The earlier design left E3 parked at 'infinity' for good.
func TestReplayReleasesEveryFollower(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, testReplayReleasesEveryFollower)
}

func testReplayReleasesEveryFollower(t *testing.T, b *testBundle) {
	ctx := context.Background()
	var badDown, flakyDown atomic.Bool
	badDown.Store(true)
	flakyDown.Store(true)
	good := &testSink{name: "good", rec: b.rec}
	bad := &testSink{name: "bad", rec: b.rec, fail: func(e sinks.Event) error {
		if badDown.Load() {
			return sinks.Permanent(errors.New("HTTP 400"))
		}
		return nil
	}}
	flaky := &testSink{name: "flaky", rec: b.rec, fail: func(e sinks.Event) error {
		if flakyDown.Load() {
			return errors.New("HTTP 500")
		}
		return nil
	}}
	cfg := b.config(t)
	cfg.StopKeyOnDeadLetter = true
	cfg.MaxAttempts = 1000
	cfg.Routes = []Route{
		{Topics: []string{"a"}, Targets: []Target{{Sink: good}, {Sink: bad}, {Sink: flaky}}},
		{Topics: []string{"b"}, Targets: []Target{{Sink: good}, {Sink: bad}}},
	}
	seqs := b.insert(t, ev{topic: "b", key: "k"}, ev{topic: "a", key: "k"}, ev{topic: "b", key: "k"})
	b.start(t, cfg)
	waitFor(t, time.Minute, "E1 dead on bad, E2 and E3 waiting behind it", func() bool {
		return b.countDeliveries(t, "sink = 'bad' AND state = 'dead' AND stops_key") == 1 &&
			b.countDeliveries(t, "sink = 'bad' AND state = 'waiting'") == 2 &&
			b.countDeliveries(t, "sink = 'flaky' AND state = 'ready' AND attempts > 0") == 1
	})
	badDown.Store(false)
	if res, err := b.db.deadLetters(t).Replay(ctx, deadletter.Filter{Sink: "bad"}, deadletter.ReplayOpts{}); err != nil || res.Count != 1 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	waitFor(t, time.Minute, "E1, E2, E3 delivered to bad", func() bool { return len(b.rec.forSink("bad")) == 3 })
	flakyDown.Store(false)
	waitFor(t, time.Minute, "E2 delivered to flaky", func() bool { return len(b.rec.forSink("flaky")) == 1 })
	waitFor(t, time.Minute, "outbox and queues empty", func() bool {
		return b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
	})
	got := b.rec.all()
	checkKeyOrder(t, got)
	exactlyOnce(t, got, "bad", seqs)
	exactlyOnce(t, got, "good", seqs)
	exactlyOnce(t, got, "flaky", seqs[1:2])
}

// writeCounter counts, by trigger, every row written to the outbox and
// deliveries tables from the moment it is installed: exact, unlike the
// statistics views, which are flushed when a backend feels like it.
type writeCounter struct {
	b *testBundle
}

func countWrites(t *testing.T, b *testBundle) *writeCounter {
	t.Helper()
	schema := b.tables.Schema
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE %q.row_writes (tbl text, op text, n bigint, PRIMARY KEY (tbl, op))`, schema),
		fmt.Sprintf(`CREATE FUNCTION %q.count_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO %q.row_writes VALUES (TG_TABLE_NAME, TG_OP, 1)
    ON CONFLICT (tbl, op) DO UPDATE SET n = row_writes.n + 1;
    RETURN NULL;
END $$`, schema, schema),
	}
	for _, tbl := range []string{b.tables.Outbox(), b.tables.Deliveries()} {
		stmts = append(stmts, fmt.Sprintf(`CREATE TRIGGER count_writes AFTER INSERT OR UPDATE OR DELETE ON %s
FOR EACH ROW EXECUTE FUNCTION %q.count_write()`, tbl, schema))
	}
	for _, s := range stmts {
		if _, err := b.pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return &writeCounter{b: b}
}

// total returns the row writes counted so far, excluding inserts into the
// outbox (the events themselves), and a summary.
func (c *writeCounter) total(t *testing.T) (int64, string) {
	t.Helper()
	var n int64
	var summary string
	err := c.b.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
    coalesce(sum(n) FILTER (WHERE NOT (tbl = 'outbox' AND op = 'INSERT')), 0),
    coalesce(string_agg(tbl || ' ' || op || ' ' || n, ', ' ORDER BY tbl, op), '')
FROM %q.row_writes`, c.b.tables.Schema)).Scan(&n, &summary)
	if err != nil {
		t.Fatal(err)
	}
	return n, summary
}

// TestSinkDownWritesNothingWhileDown: while a sink is down, its events cost
// one delivery each, written once; probing the sink writes nothing, however
// long the outage, and the backlog is not re-dated when it comes back. The
// earlier design rewrote every waiting row (and its hold) each pause period.
//
// PostgreSQL only: it counts row writes with PL/pgSQL triggers. MySQL's
// counters without triggers are not the test's own: Com_* and
// Innodb_rows_* count every client of the shared server, and MariaDB's
// per-table statistics need userstat turned on for the whole server.
func TestSinkDownWritesNothingWhileDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writes := countWrites(t, b)
	var down atomic.Bool
	down.Store(true)
	var probes atomic.Int64
	good := &testSink{name: "good", rec: b.rec}
	downSink := &testSink{name: "down", rec: b.rec, fail: func(e sinks.Event) error {
		if down.Load() {
			return sinks.Unavailable(errors.New("dial tcp: connection refused"))
		}
		return nil
	}}
	cfg := b.config(t, good, downSink)
	cfg.SinkPause = Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond, Jitter: -1}
	const events = 1000
	evs := make([]ev, events)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%100)}
	}
	seqs := b.insert(t, evs...)
	// The batches wait for their sinks as long as a publish may last
	// rather than handing off: what is counted is the outage's writes.
	cfg.HandOffAfter = cfg.WithDefaults().PublishTimeout
	var handedOff atomic.Int64
	cfg.Observer = probeCounter{sink: "down", n: &probes, handedOff: &handedOff}
	b.start(t, cfg)
	waitFor(t, time.Minute, "the healthy sink to get every event and the backlog to be queued", func() bool {
		return len(b.rec.forSink("good")) == events && b.count(t, "true") == 0 && b.countDeliveries(t, "sink = 'good'") == 0
	})
	during, summary := writes.total(t)
	// A machine that stalls past the hand-off budget still hands off:
	// those events are counted.
	if allowed := 2*events + 2*handedOff.Load(); during > allowed {
		t.Fatalf("%d row writes to queue %d events for a sink that is down (%s, %d events handed off), want at most %d",
			during, events, summary, handedOff.Load(), allowed)
	}
	// Each probe of the down sink is a claim and a Publish call; none may
	// write.
	seen := probes.Load()
	waitFor(t, time.Minute, "ten more probes of the down sink", func() bool { return probes.Load() >= seen+10 })
	if after, summary := writes.total(t); after != during {
		t.Fatalf("%d row writes while the sink stayed down, want none (%s)", after-during, summary)
	}
	down.Store(false)
	waitFor(t, time.Minute, "the down sink to catch up", func() bool {
		return len(b.rec.forSink("down")) >= events && b.countDeliveries(t, "true") == 0
	})
	// Through the outage: the event's delete from the outbox, its
	// delivery's insert and delete, and the promotions of the next head of
	// each queue as it drains: a drain shares each claim between the keys'
	// heads (two events each here: 100 keys, batches of 200), so each key
	// gets a new head every two events.
	total, summary := writes.total(t)
	if total > 3*events+events/2 {
		t.Fatalf("%d row writes for %d events through an outage (%s), want at most 3.5 per event", total, events, summary)
	}
	t.Logf("row writes through the outage: %s (%.2f per event)", summary, float64(total)/events)
	got := b.rec.all()
	exactlyOnce(t, got, "good", seqs)
	exactlyOnce(t, got, "down", seqs)
	checkKeyOrder(t, got)
}

// probeCounter counts the Publish calls to one sink.
type probeCounter struct {
	NopObserver
	sink string
	n    *atomic.Int64
	// handedOff counts the events handed off (their sink had not
	// answered within HandOffAfter): each costs a write more than the
	// outage's own (a delivery inserted and then deleted, or updated
	// once its result lands).
	handedOff *atomic.Int64
}

func (p probeCounter) SinkHandedOff(_ string, events int) {
	if p.handedOff != nil {
		p.handedOff.Add(int64(events))
	}
}

func (p probeCounter) SinkPublish(sink string, _ int, _ time.Duration) {
	if sink == p.sink {
		p.n.Add(1)
	}
}

// TestClaimLocksNothing: the claim reads the rows of its lanes without
// locking them, so that an operator's statement or a writer never waits on
// it.
//
// PostgreSQL only: it reads xmax to see that the claim locked nothing. The
// MySQL store's claim is a plain read (relay/internal/mysqlstore's tests).
func TestClaimLocksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "k"})
	s := b.session(t, "no-writes")
	if _, err := s.refreshLanes(ctx, time.Minute, nil, 0); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.claim(ctx, ^uint64(0), rowLimit(10), store.Position{}, routingQueue(10), nil); err != nil || len(got) != 2 {
		t.Fatalf("claimed %d rows: %v", len(got), err)
	}
	if n := b.count(t, "xmax <> 0"); n != 0 {
		t.Fatalf("the claim locked %d rows", n)
	}
	if err := s.releaseAll(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockedHeadIsNotOvertaken: a pending row that another transaction
// holds locked (an operator's UPDATE left open) is still claimed and sent in
// its place, before the next event of its key; its row stays until the lock
// goes, and it is sent again then. FOR UPDATE SKIP LOCKED skipped it, and
// the follower went first.
func TestLockedHeadIsNotOvertaken(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		seqs := b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "k"})
		unlock := b.db.lockRow(t, seqs[0])
		b.start(t, b.config(t, &testSink{name: "mem", rec: b.rec}))
		waitFor(t, time.Minute, "both sent", func() bool { return len(b.rec.all()) >= 2 })
		if got := seqsInOrder(b.rec.all()); got[0] != seqs[0] || got[1] != seqs[1] {
			t.Fatalf("key k delivered as %v, want %v first", got, seqs)
		}
		waitFor(t, time.Minute, "the follower's row removed, the locked one kept", func() bool {
			return b.count(t, "true") == 1 && b.count(t, fmt.Sprintf("seq = %d", seqs[0])) == 1
		})
		unlock()
		waitFor(t, time.Minute, "the locked row sent again and removed", func() bool { return b.count(t, "true") == 0 })
		checkKeyOrder(t, b.rec.all())
	})
}

// naiveSink delivers every event it can, ignoring that an earlier event of
// the same key failed in the same call (as stdout does).
type naiveSink struct {
	testSink
}

func (s *naiveSink) Publish(ctx context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	for i, e := range events {
		if err := s.fail(e); err != nil {
			errs[i] = err
			continue
		}
		s.rec.mu.Lock()
		s.rec.got = append(s.rec.got, received{sink: s.name, id: e.ID, key: e.Key, seq: e.Seq, attempt: e.Attempt, at: time.Now()})
		s.rec.mu.Unlock()
	}
	return errs
}

// TestRelayHoldsBackAKeyWhateverTheSinkReports: a sink delivers E2 after E1
// of the same key failed in the same call. The relay decides what that
// failure means: E2 waits behind E1 and is sent again after it, so the
// last word the sink hears about key k is in order. The earlier design left
// that rule to each sink and recorded E2 as done.
func TestRelayHoldsBackAKeyWhateverTheSinkReports(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var failed atomic.Bool
		var firstSeq atomic.Int64
		sink := &naiveSink{testSink{name: "naive", rec: b.rec}}
		sink.fail = func(e sinks.Event) error {
			if e.Seq == firstSeq.Load() && !failed.Swap(true) {
				return errBoom
			}
			return nil
		}
		seqs := b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "k"})
		firstSeq.Store(seqs[0])
		b.start(t, b.config(t, sink))
		_, wal := b.db.(pgWALDB)
		waitFor(t, time.Minute, "E1 delivered and E2 delivered after it", func() bool {
			got := seqsInOrder(b.rec.all())
			if wal && slices.Equal(got, []int64{seqs[0], seqs[1]}) {
				// The slot's reader hands events on as they arrive, so
				// the two may come in two batches: E2 then waits behind
				// E1 without being sent before it.
				return true
			}
			return slices.Equal(got, []int64{seqs[1], seqs[0], seqs[1]})
		})
		waitFor(t, time.Minute, "outbox and queue empty", func() bool {
			return b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
		})
	})
}

// TestQueuesOutliveAConfigurationSlip: deliveries waiting for a sink that
// a configuration leaves out (of one route, or of every route) are kept,
// never dead-lettered, and reported; once the sink is configured again,
// its queue resumes and delivers every event in key order. The earlier
// design turned a whole backlog into dead letters in a ten-second slip.
func TestQueuesOutliveAConfigurationSlip(t *testing.T) {
	t.Parallel()
	for name, routes := range map[string]func(up, other sinks.Sink) []Route{
		"sink removed from the route": func(up, other sinks.Sink) []Route {
			return []Route{{Topics: []string{"t"}, Targets: []Target{{Sink: up}}},
				{Topics: []string{"other"}, Targets: []Target{{Sink: other}}}}
		},
		"sink removed from every route": func(up, _ sinks.Sink) []Route {
			return []Route{{Topics: []string{"t"}, Targets: []Target{{Sink: up}}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
				var down atomic.Bool
				down.Store(true)
				up := &testSink{name: "up", rec: b.rec}
				hook := &testSink{name: "hook", rec: b.rec, fail: func(sinks.Event) error {
					if down.Load() {
						return sinks.Unavailable(errors.New("connection refused"))
					}
					return nil
				}}
				cfg := b.config(t, up, hook)
				evs := make([]ev, 200)
				for i := range evs {
					evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%10)}
				}
				seqs := b.insert(t, evs...)
				stop := b.start(t, cfg)
				waitFor(t, time.Minute, "the backlog queued for the sink that is down", func() bool {
					return b.count(t, "true") == 0 && b.countDeliveries(t, "sink = 'hook'") == len(seqs)
				})
				stop()

				// The slip: a configuration without the sink, for a while.
				slip := cfg
				slip.Routes = routes(up, &testSink{name: "hook", rec: b.rec})
				var unconfigured atomic.Int64
				slip.Observer = unconfiguredGauge{n: &unconfigured}
				r, err := b.db.newRelay(t, slip)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				b.db.exec(t, "UPDATE "+b.db.names().Deliveries()+" SET next_at = "+b.db.now()+" WHERE state = 'ready'")
				if name == "sink removed from every route" {
					waitFor(t, time.Minute, "the sink's deliveries reported", func() bool {
						return unconfigured.Load() == int64(len(seqs)) && r.UnconfiguredSinks()["hook"] == int64(len(seqs))
					})
				} else {
					waitFor(t, time.Minute, "the heads kept, saying why", func() bool {
						return b.countDeliveries(t, "sink = 'hook' AND state = 'ready' AND last_error LIKE 'kept: %'") == 10
					})
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if n := b.countDeliveries(t, "state = 'dead'"); n != 0 {
					t.Fatalf("%d dead letters after the slip, want none", n)
				}

				// The sink is configured again and listening.
				down.Store(false)
				b.db.exec(t, "UPDATE "+b.db.names().Deliveries()+" SET next_at = "+b.db.now()+" WHERE state = 'ready'")
				b.start(t, cfg)
				waitFor(t, time.Minute, "every event delivered to the sink", func() bool {
					return len(b.rec.forSink("hook")) >= len(seqs) && b.countDeliveries(t, "true") == 0
				})
				got := b.rec.all()
				checkKeyOrder(t, got)
				exactlyOnce(t, got, "hook", seqs)
				exactlyOnce(t, got, "up", seqs)
			})
		})
	}
}

// unconfiguredGauge keeps the deliveries reported waiting for sink hook.
type unconfiguredGauge struct {
	NopObserver
	n *atomic.Int64
}

func (g unconfiguredGauge) SinkUnconfigured(sink string, n int64) {
	if sink == "hook" {
		g.n.Store(n)
	}
}

// TestStopKeyCoversEventsDeadBeforeAnySink: under stop_key_on_dead_letter,
// an event that matched no route, or whose row cannot be read, stops its
// key like one a sink refused: later events of the key wait until an
// operator replays or purges it.
func TestStopKeyCoversEventsDeadBeforeAnySink(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, testStopKeyCoversEventsDeadBeforeAnySink)
}

func testStopKeyCoversEventsDeadBeforeAnySink(t *testing.T, b *testBundle) {
	ctx := context.Background()
	cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
	cfg.StopKeyOnDeadLetter = true
	cfg.Routes[0].Topics = []string{"orders.*"}
	seqs := b.insert(t, ev{topic: "nowhere", key: "k"}, ev{topic: "orders.paid", key: "k"}, ev{topic: "orders.paid", key: "j"})
	b.start(t, cfg)
	waitFor(t, time.Minute, "key j delivered, key k's event waiting behind the unroutable one", func() bool {
		return len(b.rec.all()) == 1 && b.countDeliveries(t, "sink = '' AND state = 'waiting'") == 1 &&
			b.countDeliveries(t, "sink = '' AND state = 'dead' AND stops_key") == 1
	})
	if got := b.rec.all()[0].seq; got != seqs[2] {
		t.Fatalf("delivered seq %d, want key j's %d", got, seqs[2])
	}
	if res, err := b.db.deadLetters(t).Purge(ctx, deadletter.Filter{Key: "k"}, deadletter.PurgeOpts{}); err != nil || res.Count != 1 {
		t.Fatalf("Purge = %+v, %v", res, err)
	}
	waitFor(t, time.Minute, "key k's event delivered once the dead letter is purged", func() bool { return len(b.rec.all()) == 2 })
	exactlyOnce(t, b.rec.all(), "mem", seqs[1:])
}

// TestOwnerNameInUseIsRefused: two relays given one owner name would share
// lanes and publish a key's events at once; the second refuses to start.
func TestOwnerNameInUseIsRefused(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
		cfg.Owner = "replica"
		cfg.Workers = 1
		b.start(t, cfg)
		waitFor(t, time.Minute, "the first relay's heartbeat", func() bool {
			return b.countIn(t, b.db.names().Relays(), "owner = 'replica'") == 1
		})
		second, err := b.db.newRelay(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = second.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), `relay.owner: a relay named "replica" is already running`) {
			t.Fatalf("second relay with the same owner: Run = %v", err)
		}
	})
}

// TestPublishEndsWithTheLanesLease: a publish is bounded by the lanes'
// lease as well as by publish_timeout. A batch whose sink has not answered
// after hand_off_after is recorded with its event in flight (a delivery due
// only once the call must have ended), within the lease; a batch whose
// lease ran out before its record is not recorded: its lanes may have a new
// owner, which delivers those events again.
func TestPublishEndsWithTheLanesLease(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		deadline := make(chan time.Time, 1)
		// Concurrent: the second call does not wait for the first's turn.
		sink := concurrentSink{&blockingSink{name: "slow", deadline: deadline}}
		cfg := b.config(t, sink)
		cfg.Lease = 4 * time.Second
		cfg.PublishTimeout = 2 * time.Second
		cfg.HandOffAfter = 200 * time.Millisecond
		r, err := b.db.newRelay(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		w := r.workers[0]
		if err := w.refreshLanes(ctx); err != nil {
			t.Fatal(err)
		}

		// The lease outlasts the wait: the event is handed off, in flight.
		b.insert(t, ev{topic: "t", key: "k"})
		w.lanesExpire = time.Now().Add(time.Hour)
		if _, err := w.cycle(ctx); err != nil {
			t.Fatalf("cycle = %v, want the batch recorded with its event in flight", err)
		}
		if got := <-deadline; got.After(time.Now().Add(cfg.PublishTimeout)) {
			t.Fatalf("publish deadline %v, more than publish_timeout away", got)
		}
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d rows left, want the event handed to the sink's queue", n)
		}
		if n := b.countDeliveries(t, "state = 'ready' AND attempts = 0 AND next_at > "+b.db.now()); n != 1 {
			t.Fatalf("%d deliveries in flight, want the event's, due only after its call", n)
		}

		// The lease runs out before the wait: the call ends with it, and
		// its batch is not recorded.
		b.insert(t, ev{topic: "t", key: "other"})
		w.lanesExpire = time.Now().Add(100 * time.Millisecond)
		before := time.Now()
		_, err = w.cycle(ctx)
		took := time.Since(before)
		// The cycle reads how long the lease has left on the relay's clock,
		// then sets the call's deadline on the monotonic one.
		if got := <-deadline; got.Before(w.lanesExpire) || got.After(w.lanesExpire.Add(took)) {
			t.Fatalf("publish deadline %v, want the lanes' expiry %v (the cycle took %s)", got, w.lanesExpire, took)
		}
		if err == nil || !strings.Contains(err.Error(), "lease ran out") {
			t.Fatalf("cycle = %v, want the batch left unrecorded", err)
		}
		if n := b.count(t, "true"); n != 1 {
			t.Fatalf("%d rows left, want the unrecorded event still pending", n)
		}
		w.calls.Wait()
		if err := w.store.releaseAll(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// blockingSink blocks each Publish until its context ends and reports the
// context's deadline.
type blockingSink struct {
	name     string
	deadline chan time.Time
}

func (s *blockingSink) Name() string { return s.name }

func (s *blockingSink) Publish(ctx context.Context, events []sinks.Event) []error {
	d, _ := ctx.Deadline()
	select {
	case s.deadline <- d:
	default:
	}
	<-ctx.Done()
	return sinks.Fill(len(events), ctx.Err())
}

func (s *blockingSink) Close(context.Context) error { return nil }

// concurrentSink is a sink the relay may call concurrently.
type concurrentSink struct{ sinks.Sink }

func (concurrentSink) PublishesConcurrently() bool { return true }

// TestFencedRecordIsReported: a batch whose lanes changed hands while it
// was published records nothing of them, and says so (a fenced record,
// counted by the Observer), instead of taking its rows for rows another
// transaction holds locked; the lanes' new owner has the events.
func TestFencedRecordIsReported(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		thief := b.session(t, "thief")
		var fencedLanes atomic.Int64
		sink := &testSink{name: "mem", rec: b.rec, fail: func(sinks.Event) error {
			// While the batch is published, its lanes change hands.
			b.db.exec(t, "UPDATE "+b.db.names().Lanes()+" SET lease_until = "+b.db.now()+" - INTERVAL '1' SECOND")
			if _, _, err := thief.store.AcquireLanes(ctx, thief.owner, time.Minute, 0, laneCount-1); err != nil {
				t.Error(err)
			}
			return nil
		}}
		cfg := b.config(t, sink)
		// The batch waits for the sink, which steals its lanes, before it
		// records: a hand-off on a loaded machine would record first.
		cfg.HandOffAfter = cfg.WithDefaults().PublishTimeout
		cfg.Observer = fencedCounter{n: &fencedLanes}
		r, err := b.db.newRelay(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		w := r.workers[0]
		if err := w.refreshLanes(ctx); err != nil {
			t.Fatal(err)
		}
		b.insert(t, ev{topic: "t", key: "k"})
		if _, err := w.cycle(ctx); err != nil {
			t.Fatalf("cycle = %v, want the fenced record reported, not failed", err)
		}
		if fencedLanes.Load() != 1 {
			t.Fatalf("fenced lanes reported: %d, want the event's one lane", fencedLanes.Load())
		}
		if len(w.skip) != 0 {
			t.Fatalf("the fenced row was set aside as if another transaction held it locked: %v", w.skip)
		}
		if n := b.count(t, "true"); n != 1 {
			t.Fatalf("%d rows left, want the event, for the lanes' new owner", n)
		}
		if err := thief.releaseAll(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// fencedCounter counts the lanes of fenced records.
type fencedCounter struct {
	NopObserver
	n *atomic.Int64
}

func (f fencedCounter) RecordFenced(lanes int) { f.n.Add(int64(lanes)) }
