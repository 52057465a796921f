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

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// The WAL capture tests (Config.Capture = CaptureWAL): events that
// outbox_emit writes into PostgreSQL's write-ahead log, read from a real
// logical replication slot of the test's own (dropped with its schema).

// setupWAL is a PostgreSQL bundle on a server that writes logical WAL.
func setupWAL(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	return pgBundle(pool, pgtest.Schema(t, pool))
}

// walConfig is b.config reading the WAL.
func (b *testBundle) walConfig(t testing.TB, owner string, targets ...sinks.Sink) Config {
	cfg := b.config(t, targets...)
	cfg.Capture, cfg.Owner = CaptureWAL, owner
	return cfg
}

// startWAL starts a relay reading the WAL and waits until its slot
// exists: events emitted before that are not in it.
func (b *testBundle) startWAL(t testing.TB, cfg Config) (stop func()) {
	t.Helper()
	stop = b.start(t, cfg)
	slot := cfg.WithDefaults().Slot
	waitFor(t, 60*time.Second, "slot "+slot, func() bool {
		var n int
		err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL", slot).Scan(&n)
		return err == nil && n == 1
	})
	return stop
}

// emit runs one transaction calling outbox_emit for each of evs, and
// returns the events' ids.
func (b *testBundle) emit(t testing.TB, evs ...ev) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ids := make([]string, len(evs))
	for i, e := range evs {
		var key *string
		if e.key != "" {
			key = &e.key
		}
		err := tx.QueryRow(ctx, "SELECT "+b.tables.Emit()+"($1, $2, $3::jsonb, max_attempts => $4)::text",
			e.topic, key, e.payloadOr(i), nilIfZero(e.maxAtt)).Scan(&ids[i])
		if err != nil {
			t.Fatalf("outbox_emit: %v", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

func nilIfZero(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

// waitDelivered waits until sink has received every event of ids at least
// once.
func waitDelivered(t testing.TB, rec *recorder, sink string, ids []string) {
	t.Helper()
	waitFor(t, 60*time.Second, fmt.Sprintf("%d events on %s", len(ids), sink), func() bool {
		got := map[string]bool{}
		for _, r := range rec.forSink(sink) {
			got[r.id] = true
		}
		for _, id := range ids {
			if !got[id] {
				return false
			}
		}
		return true
	})
}

// deliveredTimes counts the deliveries of each event id to sink.
func deliveredTimes(rec *recorder, sink string) map[string]int {
	n := map[string]int{}
	for _, r := range rec.forSink(sink) {
		n[r.id]++
	}
	return n
}

// slotCaughtUp waits until the slot has confirmed every position up to
// the WAL's end when called: nothing it read is left to settle.
func (b *testBundle) slotCaughtUp(t testing.TB, slot string) {
	t.Helper()
	ctx := context.Background()
	var target string
	if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the slot to confirm "+target, func() bool {
		var ok bool
		err := b.pool.QueryRow(ctx, "SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1",
			slot, target).Scan(&ok)
		return err == nil && ok
	})
}

// TestCaptureWALDeliversWithoutRows: events emitted into the WAL reach the
// sink once each, in order per key, with no row written for them; rows
// inserted into the table by other writers flow beside them (in order per
// key among the rows: a key written both ways has no order between the
// two); the slot
// confirms its position once they are delivered (and, idle, keeps it
// current).
func TestCaptureWALDeliversWithoutRows(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	sink := &testSink{name: "mem", rec: b.rec}
	cfg := b.walConfig(t, "wal-a", sink)
	b.startWAL(t, cfg)

	var ids []string
	for tx := range 10 {
		var evs []ev
		for i := range 5 {
			evs = append(evs, ev{topic: "orders.paid", key: fmt.Sprintf("k%d", (tx+i)%4)})
		}
		ids = append(ids, b.emit(t, evs...)...)
	}
	b.insert(t, ev{topic: "orders.paid", key: "table-1"}, ev{topic: "orders.paid", key: "table-2"})
	waitDelivered(t, b.rec, "mem", ids)
	waitFor(t, time.Minute, "the table's rows", func() bool { return len(b.rec.forSink("mem")) >= len(ids)+2 })
	for id, n := range deliveredTimes(b.rec, "mem") {
		if n != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n)
		}
	}
	checkKeyOrder(t, b.rec.all())
	if n := b.countDeliveries(t, "true"); n != 0 {
		t.Errorf("%d deliveries written for events delivered at their first attempt, want none", n)
	}
	b.slotCaughtUp(t, cfg.WithDefaults().Slot)
	if n := b.count(t, "true"); n != 0 {
		t.Errorf("%d outbox rows left", n)
	}
}

// TestCaptureWALFailuresQueueAndDeadLetter: an event read from the WAL that
// fails is written to the deliveries table as in table mode: retried with
// backoff ahead of its key's later events, or dead-lettered and listed and
// replayed by the operators' store like any other dead letter, while
// other keys keep flowing.
func TestCaptureWALFailuresQueueAndDeadLetter(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	var healed atomic.Bool
	sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
		switch {
		case e.Key == "flaky" && e.Attempt < 3:
			return errBoom
		case e.Key == "poison" && !healed.Load():
			return sinks.Permanent(errors.New("refused"))
		}
		return nil
	}}
	cfg := b.walConfig(t, "wal-a", sink)
	cfg.StopKeyOnDeadLetter = true
	b.startWAL(t, cfg)

	flaky := b.emit(t, ev{topic: "t", key: "flaky"}, ev{topic: "t", key: "flaky"}, ev{topic: "t", key: "flaky"})
	poison := b.emit(t, ev{topic: "t", key: "poison"})
	after := b.emit(t, ev{topic: "t", key: "poison"})
	fine := b.emit(t, ev{topic: "t", key: "fine"}, ev{topic: "t", key: "fine"})
	waitDelivered(t, b.rec, "mem", slices.Concat(flaky, fine))
	checkKeyOrder(t, b.rec.all())
	for _, r := range b.rec.forSink("mem") {
		if r.id == flaky[0] && r.attempt != 3 {
			t.Errorf("the flaky key's first event was delivered at attempt %d, want 3", r.attempt)
		}
	}

	// The poison event is a dead letter stopping its key; the event after
	// it waits behind it, in the table.
	waitFor(t, time.Minute, "the dead letter", func() bool { return b.countDeliveries(t, "state = 'dead'") == 1 })
	if n := b.countDeliveries(t, "state = 'waiting'"); n != 1 {
		t.Fatalf("%d deliveries waiting behind the dead letter, want 1", n)
	}
	dl := b.db.deadLetters(t)
	var listed []string
	if err := dl.List(context.Background(), deadletter.Filter{Key: "poison"}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		listed = append(listed, d.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(listed, poison) {
		t.Fatalf("dead letters listed %v, want %v", listed, poison)
	}
	healed.Store(true)
	if _, err := dl.Replay(context.Background(), deadletter.Filter{Key: "poison"}, deadletter.ReplayOpts{}); err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, b.rec, "mem", slices.Concat(poison, after))
	checkKeyOrder(t, b.rec.all())
	waitFor(t, time.Minute, "the queues to empty", func() bool { return b.countDeliveries(t, "true") == 0 })
}

// TestCaptureWALSinkDownDoesNotPinTheSlot: while one of two sinks is down,
// the events read from the WAL are delivered to the other and queued for
// it in the deliveries table, so the slot's position moves on (the WAL is
// not kept for an outage); when the sink is back, its queue drains in key
// order.
func TestCaptureWALSinkDownDoesNotPinTheSlot(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	var up atomic.Bool
	down := &testSink{name: "down", rec: b.rec, fail: func(sinks.Event) error {
		if !up.Load() {
			return sinks.Unavailable(errors.New("dial tcp: connection refused"))
		}
		return nil
	}}
	fine := &testSink{name: "fine", rec: b.rec}
	cfg := b.walConfig(t, "wal-a", down, fine)
	b.startWAL(t, cfg)
	var ids []string
	for tx := range 10 {
		var evs []ev
		for i := range 10 {
			evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", (tx+i)%7)})
		}
		ids = append(ids, b.emit(t, evs...)...)
	}
	waitDelivered(t, b.rec, "fine", ids)
	waitFor(t, 60*time.Second, "the down sink's queue", func() bool { return b.countDeliveries(t, "true") == len(ids) })
	b.slotCaughtUp(t, cfg.WithDefaults().Slot)
	if got := len(b.rec.forSink("down")); got != 0 {
		t.Fatalf("the down sink received %d events", got)
	}
	up.Store(true)
	waitDelivered(t, b.rec, "down", ids)
	waitFor(t, 60*time.Second, "the queue to empty", func() bool { return b.countDeliveries(t, "true") == 0 })
	checkKeyOrder(t, b.rec.all())
}

// TestCaptureWALReaderConnectionKilled: the server ending the reader's
// replication connection mid-stream (pg_terminate_backend, as an operator
// or a failover would) costs no event: a new reader resumes from the slot's
// confirmed position, and every key stays in order.
func TestCaptureWALReaderConnectionKilled(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	sink := &testSink{name: "mem", rec: b.rec}
	cfg := b.walConfig(t, "wal-a", sink)
	b.startWAL(t, cfg)
	slot := cfg.WithDefaults().Slot
	var ids []string
	for round := range 3 {
		for tx := range 5 {
			var evs []ev
			for i := range 20 {
				evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", (round+tx+i)%9)})
			}
			ids = append(ids, b.emit(t, evs...)...)
		}
		// In the select list, not the WHERE clause: the planner may order
		// a WHERE clause's conditions as it likes, and terminate another
		// test's connections before it compares the slot's name.
		var killed bool
		waitFor(t, 60*time.Second, "the reader's connection to kill", func() bool {
			err := b.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend(active_pid)
FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&killed)
			return err == nil && killed
		})
	}
	waitDelivered(t, b.rec, "mem", ids)
	checkKeyOrder(t, b.rec.all())
	b.slotCaughtUp(t, slot)
}

// TestCaptureWALResumesFromTheSlot: a relay that stops confirms what it
// delivered; events emitted while no relay runs wait in the slot, and the
// next relay (another process, as far as the database knows) delivers
// them, and only them.
func TestCaptureWALResumesFromTheSlot(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	sink := &testSink{name: "mem", rec: b.rec}
	stop := b.startWAL(t, b.walConfig(t, "wal-a", sink))
	first := b.emit(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"})
	waitDelivered(t, b.rec, "mem", first)
	stop()

	var down []string
	for i := range 5 {
		down = append(down, b.emit(t, ev{topic: "t", key: fmt.Sprintf("k%d", i%2)})...)
	}
	b.startWAL(t, b.walConfig(t, "wal-b", sink))
	waitDelivered(t, b.rec, "mem", down)
	// Only the first relay's events: the second delivers at least once,
	// and on a machine loaded enough to lapse its lease, it reads again
	// what it had not settled.
	times := deliveredTimes(b.rec, "mem")
	for _, id := range first {
		if n := times[id]; n != 1 {
			t.Errorf("event %s delivered %d times, want once (a relay that stops confirms what it delivered)", id, n)
		}
	}
	checkKeyOrder(t, b.rec.all())
}

// TestCaptureWALReadsAgainWhatItQueued: events read again from the slot
// (a reader restarted before it confirmed them) whose deliveries are
// already in the table from their first reading are recorded again without
// error: the queued delivery stands, the slot moves on, and the event is
// delivered once its sink heals. The second reading is a copy of the slot
// made before the events, read by a relay started on it.
func TestCaptureWALReadsAgainWhatItQueued(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	var healed atomic.Bool
	sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
		if e.Key == "down" && !healed.Load() {
			return errBoom
		}
		return nil
	}}
	cfg := b.walConfig(t, "wal-a", sink)
	stop := b.startWAL(t, cfg)
	slot, again := cfg.WithDefaults().Slot, cfg.WithDefaults().Slot+"_again"
	if _, err := b.pool.Exec(context.Background(), "SELECT pg_copy_logical_replication_slot($1, $2)", slot, again); err != nil {
		t.Fatal(err)
	}
	queued := b.emit(t, ev{topic: "t", key: "down"})
	fine := b.emit(t, ev{topic: "t", key: "up"})
	waitDelivered(t, b.rec, "mem", fine)
	waitFor(t, 60*time.Second, "the failed event's delivery", func() bool { return b.countDeliveries(t, "true") == 1 })
	stop()

	cfg.Slot = again
	b.startWAL(t, cfg)
	waitFor(t, 60*time.Second, "the events read again", func() bool { return deliveredTimes(b.rec, "mem")[fine[0]] == 2 })
	b.slotCaughtUp(t, again)
	healed.Store(true)
	waitDelivered(t, b.rec, "mem", queued)
	waitFor(t, 60*time.Second, "the queue to empty", func() bool { return b.countDeliveries(t, "true") == 0 })
	if n := deliveredTimes(b.rec, "mem")[queued[0]]; n != 1 {
		t.Errorf("the queued event was delivered %d times, want once (its first reading queued it)", n)
	}
}

// TestCaptureWALStandbyTakesOver: of two relays, one reads the slot holding
// every lane and the other stands by; when the reader stops, the standby
// takes the lanes and the slot over and delivers what follows.
func TestCaptureWALStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	sink := &testSink{name: "mem", rec: b.rec}
	stopA := b.startWAL(t, b.walConfig(t, "wal-a", sink))
	b.startWAL(t, b.walConfig(t, "wal-b", sink))
	first := b.emit(t, ev{topic: "t", key: "x"}, ev{topic: "t", key: "y"})
	waitDelivered(t, b.rec, "mem", first)
	waitFor(t, time.Minute, "wal-a to hold every lane", func() bool {
		return b.countIn(t, b.db.names().Lanes(), "owner = 'wal-a'") == laneCount
	})
	stopA()
	var later []string
	for i := range 6 {
		later = append(later, b.emit(t, ev{topic: "t", key: fmt.Sprintf("k%d", i%3)})...)
	}
	waitDelivered(t, b.rec, "mem", later)
	if n := b.countIn(t, b.db.names().Lanes(), "owner = 'wal-b'"); n != laneCount {
		t.Errorf("wal-b holds %d lanes after the takeover, want %d", n, laneCount)
	}
	checkKeyOrder(t, b.rec.all())
}

// TestCaptureWALConfig: what a relay reading the WAL refuses.
func TestCaptureWALConfig(t *testing.T) {
	t.Parallel()
	base := Config{Routes: []Route{{Topics: []string{"*"}, Targets: []Target{{Sink: &testSink{name: "s"}}}}}}
	for _, c := range []struct {
		name string
		cfg  func(Config) Config
		want string
	}{
		{"workers", func(c Config) Config { c.Capture, c.Workers = CaptureWAL, 2; return c }, "relay.workers: must be 1 with database.capture: wal"},
		{"capture", func(c Config) Config { c.Capture = "binlog"; return c }, `database.capture: must be "table" or "wal", got "binlog"`},
		{"slot", func(c Config) Config { c.Capture, c.Slot = CaptureWAL, "Bad-Name"; return c }, "database.slot: must be 1 to 63 lower-case letters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg(base).WithDefaults().Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	if cfg := (Config{Capture: CaptureWAL}).WithDefaults(); cfg.Workers != 1 || cfg.Slot == "" {
		t.Fatalf("defaults with capture wal: workers %d, slot %q", cfg.Workers, cfg.Slot)
	}
}

// TestCaptureWALRefusesAnOverfullSlot: a relay does not start reading a
// slot that keeps more WAL than database.max_slot_retained_bytes, and says
// what to do.
func TestCaptureWALRefusesAnOverfullSlot(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	sink := &testSink{name: "mem", rec: b.rec}
	stop := b.startWAL(t, b.walConfig(t, "wal-a", sink))
	stop()
	b.emit(t, ev{topic: "t", key: "k"}) // kept in the slot: no relay reads it
	cfg := b.walConfig(t, "wal-b", sink)
	cfg.MaxSlotRetainedBytes = 1
	r, err := b.db.newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "database.max_slot_retained_bytes: replication slot") ||
		!strings.Contains(err.Error(), "relay slot drop") {
		t.Fatalf("Run: %v, want a refusal naming the bound and the way out", err)
	}
	if len(b.rec.all()) != 0 {
		t.Fatalf("a refused relay delivered %d events", len(b.rec.all()))
	}
}

// stuckSink never answers: each Publish waits until its context ends.
type stuckSink struct {
	name    string
	entered atomic.Int64
}

func (s *stuckSink) Name() string                { return s.name }
func (s *stuckSink) Close(context.Context) error { return nil }
func (s *stuckSink) Publish(ctx context.Context, events []sinks.Event) []error {
	s.entered.Add(int64(len(events)))
	<-ctx.Done()
	return sinks.Fill(len(events), ctx.Err())
}

// TestCaptureWALStoppedMidBatchLosesNothing: a relay reading the WAL is
// cut off while its sink holds a batch, and its shutdown gives up on the
// batch: nothing of it was recorded, so the slot was not confirmed past
// it, and the next relay reads those events again and delivers every
// event, in order per key.
func TestCaptureWALStoppedMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	b := setupWAL(t)
	stuck := &stuckSink{name: "mem"}
	cfg := b.walConfig(t, "wal-a", stuck)
	// The batch waits for its sink as long as a publish may last, never
	// handing off before the relay is stopped.
	cfg.Lease, cfg.PublishTimeout, cfg.HandOffAfter = time.Minute, 30*time.Second, 30*time.Second
	cfg.ShutdownTimeout = 50 * time.Millisecond
	stop := b.startWAL(t, cfg)
	var ids []string
	for i := range 4 {
		ids = append(ids, b.emit(t, ev{topic: "t", key: fmt.Sprintf("k%d", i%2)}, ev{topic: "t", key: fmt.Sprintf("k%d", i%2)})...)
	}
	waitFor(t, time.Minute, "the stuck sink to hold a batch", func() bool { return stuck.entered.Load() > 0 })
	stop()
	if n := b.countDeliveries(t, "true"); n != 0 {
		t.Fatalf("%d deliveries written by a batch its relay gave up on", n)
	}
	sink := &testSink{name: "mem", rec: b.rec}
	b.startWAL(t, b.walConfig(t, "wal-b", sink))
	waitDelivered(t, b.rec, "mem", ids)
	checkKeyOrder(t, b.rec.all())
}
