package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/sinks"
)

func TestDeliversCommittedEventsOnce(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := &testSink{name: "mem", rec: b.rec}
		stop := b.start(t, b.config(t, sink))

		// A rolled-back transaction leaves nothing to publish.
		b.insertRolledBack(t, ev{topic: "orders.paid", key: "o-1", payload: `{"rolled":"back"}`})
		seqs := b.insert(t, ev{topic: "orders.paid", key: "o-2"}, ev{topic: "orders.paid"}, ev{topic: "orders.created", key: "o-3"})
		waitFor(t, time.Minute, "3 deliveries", func() bool { return len(b.rec.all()) >= 3 })
		waitFor(t, time.Minute, "rows deleted", func() bool { return b.count(t, "true") == 0 })
		// Once Run has returned, nothing more can arrive: a duplicate or the
		// rolled-back event would be in the recorder now.
		stop()
		exactlyOnce(t, b.rec.all(), "mem", seqs)
	})
}

func TestManyRelaysKeepKeyOrder(t *testing.T) {
	t.Parallel()
	for _, keys := range []int{200, 5} {
		t.Run(fmt.Sprintf("%dkeys", keys), func(t *testing.T) {
			t.Parallel()
			eachStore(t, func(t *testing.T, b *testBundle) {
				const events = 3000
				evs := make([]ev, events)
				for i := range evs {
					evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%keys)}
					if i%50 == 0 {
						evs[i].key = "" // some events have no key
					}
				}
				seqs := b.insert(t, evs...)
				for i := range 3 {
					// Each relay has its own sink instance (Publish is never
					// concurrent on one sink), all writing to one recorder.
					cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
					cfg.Owner = fmt.Sprintf("relay-%d", i)
					b.start(t, cfg)
				}
				waitFor(t, 60*time.Second, "all events delivered", func() bool { return len(b.rec.all()) >= events })
				got := b.rec.all()
				exactlyOnce(t, got, "mem", seqs)
				checkKeyOrder(t, got)
				waitFor(t, time.Minute, "table drained", func() bool { return b.count(t, "true") == 0 })
			})
		})
	}
}

// TestRetriesWithBackoffThenDeadLetters: a failing head is tried again
// after each backoff (due that long after the database's clock, and not
// claimed before), then dead-lettered after its last attempt, while other
// keys flow; its follower moves on once it is dead. The test moves each
// retry's time to now instead of waiting for the backoff.
func TestRetriesWithBackoffThenDeadLetters(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var calls atomic.Int32
		sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
			if e.Topic == "bad" {
				calls.Add(1)
				return fmt.Errorf("attempt %d: %w", e.Attempt, errBoom)
			}
			return nil
		}}
		cfg := b.config(t, sink)
		cfg.MaxAttempts = 4
		cfg.Backoff = Backoff{Initial: time.Minute, Max: time.Hour, Multiplier: 2, Jitter: -1}
		cfg.Workers = 1 // each claim below looks at every lane
		obs := &progress{}
		cfg.Observer = obs
		seqs := b.insert(t, ev{topic: "bad", key: "k"}, ev{topic: "good", key: "k"}, ev{topic: "good", key: "other"})
		b.start(t, cfg)

		// The other key is not held back.
		waitFor(t, time.Minute, "other key delivered", func() bool { return len(b.rec.all()) >= 1 })
		if first := b.rec.all()[0]; first.seq != seqs[2] {
			t.Fatalf("first delivery was seq %d, want the other key's %d", first.seq, seqs[2])
		}
		// Attempts 1 to 3 fail and wait 1, 2 and 4 minutes.
		now := b.db.now()
		for attempt := 1; attempt < 4; attempt++ {
			waitFor(t, time.Minute, fmt.Sprintf("attempt %d recorded", attempt), func() bool {
				return b.countDeliveries(t, fmt.Sprintf("seq = %d AND attempts = %d", seqs[0], attempt)) == 1
			})
			delay := int(cfg.Backoff.Delay(attempt).Seconds())
			if n := b.countDeliveries(t, fmt.Sprintf("seq = %d AND state = 'ready' AND next_at > %s + INTERVAL '%d' SECOND AND next_at <= %s + INTERVAL '%d' SECOND",
				seqs[0], now, delay-30, now, delay)); n != 1 {
				t.Fatalf("after attempt %d the head is not due %ds after the database's clock", attempt, delay)
			}
			// Queue claims come every poll interval while the relay is
			// idle: after several, the head would have been tried again
			// if its backoff did not hold it.
			obs.waitClaims(t, 3)
			if got := calls.Load(); got != int32(attempt) {
				t.Fatalf("sink saw %d attempts before the head was due, want %d", got, attempt)
			}
			if got := b.rec.all(); len(got) != 1 {
				t.Fatalf("deliveries %+v while the key's head retries: its follower overtook it", got)
			}
			b.makeDue(t, fmt.Sprintf("seq = %d", seqs[0]))
		}
		waitFor(t, time.Minute, "dead letter", func() bool { return b.countDeliveries(t, "state = 'dead'") == 1 })
		if got := calls.Load(); got != 4 {
			t.Fatalf("sink saw %d attempts, want 4", got)
		}
		var attempts int
		var state, lastErr string
		b.db.queryRow(t, fmt.Sprintf("SELECT state, attempts, last_error FROM %s WHERE sink = 'mem' AND seq = %d", b.db.names().Deliveries(), seqs[0]),
			&state, &attempts, &lastErr)
		if state != "dead" || attempts != 4 || !strings.Contains(lastErr, "attempt 4: boom") {
			t.Fatalf("dead letter: state %s, attempts %d, last_error %q", state, attempts, lastErr)
		}
		// Once the head is dead, the key moves on: its follower is delivered.
		waitFor(t, time.Minute, "follower delivered", func() bool { return len(b.rec.all()) >= 2 })
		if got := b.rec.all(); got[1].seq != seqs[1] {
			t.Fatalf("second delivery seq %d, want follower %d", got[1].seq, seqs[1])
		}
		waitFor(t, time.Minute, "queue emptied", func() bool { return b.countDeliveries(t, "state <> 'dead'") == 0 })
	})
}

func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
			if e.Topic == "bad" {
				return sinks.Permanent(fmt.Errorf("rejected: %w", errBoom))
			}
			return nil
		}}
		seqs := b.insert(t, ev{topic: "bad", key: "k"}, ev{topic: "good", key: "k"})
		b.start(t, b.config(t, sink))
		waitFor(t, time.Minute, "follower delivered", func() bool { return len(b.rec.all()) == 1 })
		if got := b.rec.all()[0].seq; got != seqs[1] {
			t.Fatalf("delivered seq %d, want %d", got, seqs[1])
		}
		var attempts int
		var state, lastErr string
		b.db.queryRow(t, fmt.Sprintf("SELECT state, attempts, last_error FROM %s WHERE sink = 'mem' AND seq = %d", b.db.names().Deliveries(), seqs[0]),
			&state, &attempts, &lastErr)
		if state != "dead" || attempts != 1 || !strings.Contains(lastErr, "rejected: boom") {
			t.Fatalf("dead letter: state %s attempts %d last_error %q", state, attempts, lastErr)
		}
	})
}

func TestFailingHeadHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var failures atomic.Int32
		sink := &testSink{name: "mem", rec: b.rec}
		head := int64(0)
		sink.fail = func(e sinks.Event) error {
			if e.Seq == atomic.LoadInt64(&head) && failures.Add(1) <= 2 {
				return errBoom
			}
			return nil
		}
		var evs []ev
		for i := range 30 {
			evs = append(evs, ev{topic: "t", key: []string{"a", "b", "c"}[i%3]})
		}
		seqs := b.insert(t, evs...)
		atomic.StoreInt64(&head, seqs[0]) // key a's first event fails twice
		b.start(t, b.config(t, sink))
		waitFor(t, time.Minute, "all delivered", func() bool { return len(b.rec.all()) >= 30 })
		got := b.rec.all()
		exactlyOnce(t, got, "mem", seqs)
		checkKeyOrder(t, got)
		// b and c were not held back: all of them arrived before a's head.
		var headAt time.Time
		for _, g := range got {
			if g.seq == seqs[0] {
				headAt = g.at
				if g.attempt != 3 {
					t.Fatalf("head delivered on attempt %d, want 3", g.attempt)
				}
			}
		}
		for _, g := range got {
			if g.key != "a" && g.at.After(headAt) {
				t.Fatalf("key %s event %d waited for key a's head", g.key, g.seq)
			}
		}
	})
}

// TestDelayedEventsAreNotPublishedEarly: a delayed event waits for its
// time, and does not hold back its key's later event that is due. The
// delay is an hour, which the test ends by moving the row's available_at
// to the database's now: the check does not depend on the relay reading
// both events before a short delay runs out.
func TestDelayedEventsAreNotPublishedEarly(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := &testSink{name: "mem", rec: b.rec}
		later := b.insert(t, ev{topic: "later", key: "k", delay: time.Hour})[0]
		now := b.insert(t, ev{topic: "now", key: "k"})[0]
		b.start(t, b.config(t, sink))
		waitFor(t, time.Minute, "the undelayed event delivered", func() bool { return len(b.rec.all()) >= 1 })
		// The cycle that delivered it claimed the outbox too, where the
		// delayed event was not due.
		if got := b.rec.all(); len(got) != 1 || got[0].seq != now {
			t.Fatalf("delivered %+v, want only the undelayed event %d", got, now)
		}
		due := time.Now()
		b.db.exec(t, fmt.Sprintf("UPDATE %s SET available_at = %s WHERE seq = %d", b.db.names().Outbox(), b.db.now(), later))
		waitFor(t, time.Minute, "the delayed event delivered once due", func() bool { return len(b.rec.all()) == 2 })
		if got := b.rec.all()[1]; got.seq != later || got.at.Before(due) {
			t.Fatalf("second delivery %+v, want the delayed event %d after it came due", got, later)
		}
	})
}

func TestSinkDownLosesAndDeadLettersNothing(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down atomic.Bool
		down.Store(true)
		downSink := &testSink{name: "down", rec: b.rec, fail: func(e sinks.Event) error {
			if down.Load() {
				return sinks.Unavailable(fmt.Errorf("dial tcp: connection refused"))
			}
			return nil
		}}
		upSink := &testSink{name: "up", rec: b.rec}
		cfg := b.config(t)
		// One worker: each publish to the down sink follows the record of the
		// one before it, so publishes() below counts recorded tries.
		cfg.Workers = 1
		cfg.MaxAttempts = 2
		cfg.Backoff = Backoff{Initial: 20 * time.Millisecond, Max: 40 * time.Millisecond, Jitter: -1}
		cfg.Routes = []Route{
			{Topics: []string{"orders.*"}, Targets: []Target{{Sink: upSink}, {Sink: downSink}}},
			{Topics: []string{"*"}, Targets: []Target{{Sink: upSink}}},
		}
		var evs []ev
		for i := range 60 {
			evs = append(evs, ev{topic: "orders.paid", key: fmt.Sprintf("o%d", i%6)})
		}
		seqs := b.insert(t, evs...)
		b.start(t, cfg)
		// The healthy sink keeps receiving everything while the other is down,
		// and the down sink is tried (and its tries recorded) more often than
		// max_attempts would allow if they were counted.
		waitFor(t, time.Minute, "up sink received all", func() bool { return len(b.rec.forSink("up")) >= 60 })
		const tries = 3 * 2 // 3 × max_attempts
		waitFor(t, time.Minute, fmt.Sprintf("%d tries of the down sink", tries+1), func() bool { return downSink.publishes() > tries })
		if n := b.countDeliveries(t, "state = 'dead'"); n != 0 {
			t.Fatalf("%d events dead-lettered while their sink was down", n)
		}
		if n := b.countDeliveries(t, "attempts > 0"); n != 0 {
			t.Fatalf("%d events spent attempts while their sink was down", n)
		}
		down.Store(false)
		waitFor(t, time.Minute, "down sink caught up", func() bool { return len(b.rec.forSink("down")) >= 60 })
		got := b.rec.all()
		exactlyOnce(t, got, "up", seqs)
		exactlyOnce(t, got, "down", seqs)
		checkKeyOrder(t, got)
		waitFor(t, time.Minute, "table drained", func() bool { return b.count(t, "true") == 0 })
	})
}

// A key failing on one sink waits in that sink's queue, in order, while the
// other sink takes every event at once and other keys flow; once the sink
// recovers, the queue drains in order and the deliveries table empties.
func TestFailingKeyQueuesAndDrains(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var failing atomic.Bool
		failing.Store(true)
		flaky := &testSink{name: "flaky", rec: b.rec, fail: func(e sinks.Event) error {
			if failing.Load() && e.Key == "bad" {
				return errors.New("bad key refused")
			}
			return nil
		}}
		steady := &testSink{name: "steady", rec: b.rec}
		keys := []string{"bad", "good1", "good2", "good3"}
		evs := make([]ev, 40)
		for i := range evs {
			evs[i] = ev{topic: "orders", key: keys[i%len(keys)]}
		}
		seqs := b.insert(t, evs...)
		b.start(t, b.config(t, flaky, steady))
		waitFor(t, time.Minute, "the steady sink and the good keys served", func() bool {
			return len(b.rec.forSink("steady")) >= 40 && len(b.rec.forSink("flaky")) >= 30
		})
		waitFor(t, time.Minute, "the bad key queued on flaky", func() bool {
			return b.countDeliveries(t, "sink = 'flaky'") == 10
		})
		if n := len(b.rec.forSink("flaky")); n != 30 {
			t.Fatalf("flaky received %d events while the bad key failed, want the 30 good ones", n)
		}
		failing.Store(false)
		waitFor(t, time.Minute, "the queue drained", func() bool { return len(b.rec.forSink("flaky")) >= 40 })
		got := b.rec.all()
		checkKeyOrder(t, got)
		exactlyOnce(t, got, "steady", seqs)
		exactlyOnce(t, got, "flaky", seqs)
		waitFor(t, time.Minute, "the outbox and the deliveries table emptied", func() bool {
			return b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
		})
	})
}

func TestFanOutRetriesOnlyTheFailedSink(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var fails atomic.Int32
		okSink := &testSink{name: "kafka", rec: b.rec}
		flaky := &testSink{name: "webhook", rec: b.rec, fail: func(e sinks.Event) error {
			if e.Key == "k1" && fails.Add(1) <= 3 {
				return errBoom
			}
			return nil
		}}
		cfg := b.config(t, okSink, flaky)
		var evs []ev
		for i := range 20 {
			evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", i%2)})
		}
		seqs := b.insert(t, evs...)
		b.start(t, cfg)
		waitFor(t, time.Minute, "both sinks complete", func() bool {
			return len(b.rec.forSink("kafka")) >= 20 && len(b.rec.forSink("webhook")) >= 20
		})
		got := b.rec.all()
		exactlyOnce(t, got, "kafka", seqs)
		exactlyOnce(t, got, "webhook", seqs)
		checkKeyOrder(t, got)
		if n := b.count(t, "true"); n != 0 {
			waitFor(t, time.Minute, "table drained", func() bool { return b.count(t, "true") == 0 })
		}
	})
}

func TestNoRouteDeadLettersWithReason(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		cfg := b.config(t)
		cfg.Routes = []Route{{Topics: []string{"orders.*"}, Targets: []Target{{Sink: &testSink{name: "mem", rec: b.rec}}}}}
		b.insert(t, ev{topic: "invoices.sent"}, ev{topic: "orders.paid"})
		b.start(t, cfg)
		waitFor(t, time.Minute, "dead letter", func() bool { return b.countDeliveries(t, "state = 'dead' AND sink = ''") == 1 })
		var lastErr string
		b.db.queryRow(t, "SELECT last_error FROM "+b.db.names().Deliveries()+" WHERE state = 'dead'", &lastErr)
		if !strings.Contains(lastErr, `no route matches topic "invoices.sent"`) {
			t.Fatalf("last_error = %q", lastErr)
		}
		waitFor(t, time.Minute, "routed event delivered", func() bool { return len(b.rec.all()) == 1 })
	})
}

type panickySink struct {
	testSink
	panicked atomic.Bool
}

func (p *panickySink) Publish(ctx context.Context, events []sinks.Event) []error {
	if !p.panicked.Swap(true) {
		panic("sink bug")
	}
	return p.testSink.Publish(ctx, events)
}

func TestSinkPanicLosesNothing(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := &panickySink{testSink: testSink{name: "mem", rec: b.rec}}
		seqs := b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "a"})
		b.start(t, b.config(t, sink))
		waitFor(t, time.Minute, "delivered after panic", func() bool { return len(b.rec.all()) == 2 })
		exactlyOnce(t, b.rec.all(), "mem", seqs)
		checkKeyOrder(t, b.rec.all())
	})
}

// TestCrashedRelaysEventsAreTakenOverAfterLease: a relay that claimed a
// batch and died keeps its lanes until their lease runs out on the
// database's clock, and no other relay delivers its events before; then a
// live relay takes the lanes over, waits two thirds of a lease (the dead
// relay may still have been publishing) and delivers them, once each. The
// test moves time instead of waiting for it: the dead relay's lease on the
// database, the live relay's renewals and wait on its Config.Clock (a
// lease of a minute, which the test would not outlast on the wall clock).
func TestCrashedRelaysEventsAreTakenOverAfterLease(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		seqs := b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"}, ev{topic: "t"})
		// A relay claims the batch (and all lanes) and dies before recording.
		ctx := context.Background()
		dead := b.session(t, "crashed-relay")
		if _, err := dead.refreshLanes(ctx, time.Hour, nil, 0); err != nil {
			t.Fatal(err)
		}
		rows, _, err := dead.claim(ctx, ^uint64(0), rowLimit(10), store.Position{}, routingQueue(10), nil)
		if err != nil || len(rows) != 3 {
			t.Fatalf("crashed relay claimed %d rows: %v", len(rows), err)
		}
		clock, obs := &testClock{}, &progress{}
		cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
		cfg.Lease, cfg.Clock, cfg.Observer = time.Minute, clock.now, obs
		renewEvery := 2 * time.Second // a third of a lease, at most 2 s
		b.start(t, cfg)
		heartbeat := func() time.Time {
			var hb time.Time
			b.db.queryRow(t, fmt.Sprintf("SELECT coalesce(max(heartbeat_until), %s) FROM %s WHERE owner <> 'crashed-relay'", b.db.now(), b.db.names().Relays()), &hb)
			return hb
		}
		// The live relay renews its heartbeat with its lanes, and tries to
		// acquire lanes as it does.
		waitFor(t, time.Minute, "the live relay's heartbeat", func() bool { return !heartbeat().IsZero() })
		for range 2 {
			last := heartbeat()
			clock.advance(renewEvery)
			waitFor(t, time.Minute, "the live relay's lanes renewed", func() bool { return heartbeat().After(last) })
		}
		obs.waitClaims(t, 2)
		if got := b.rec.all(); len(got) != 0 {
			t.Fatalf("delivered %+v while the crashed relay's lease was live", got)
		}
		if n := b.countIn(t, b.db.names().Lanes(), "owner = 'crashed-relay'"); n != laneCount {
			t.Fatalf("the crashed relay holds %d lanes while its lease is live, want %d", n, laneCount)
		}

		b.expireLeases(t, "crashed-relay")
		clock.advance(renewEvery)
		waitFor(t, time.Minute, "takeover", func() bool {
			return b.countIn(t, b.db.names().Lanes(), "owner = 'crashed-relay'") == 0
		})
		obs.waitClaims(t, 2)
		if got := b.rec.all(); len(got) != 0 {
			t.Fatalf("delivered %+v less than two thirds of a lease after the takeover", got)
		}
		clock.advance(cfg.Lease * 2 / 3)
		waitFor(t, time.Minute, "delivery two thirds of a lease after the takeover", func() bool { return len(b.rec.all()) == 3 })
		exactlyOnce(t, b.rec.all(), "mem", seqs)
	})
}

func TestGracefulShutdownFinishesBatchAndReleases(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := &testSink{name: "mem", rec: b.rec, delay: 500 * time.Millisecond}
		seqs := b.insert(t, ev{topic: "t", key: "a"}, ev{topic: "t", key: "b"})
		stop := b.start(t, b.config(t, sink))
		waitFor(t, time.Minute, "batch in flight", func() bool { return sink.publishes() == 1 })
		stop()
		exactlyOnce(t, b.rec.all(), "mem", seqs)
		if n := b.count(t, "true"); n != 0 {
			t.Fatalf("%d rows left after a graceful stop; the in-flight batch was not recorded", n)
		}
		if lanes := b.countIn(t, b.db.names().Lanes(), "owner IS NOT NULL"); lanes != 0 {
			t.Fatalf("%d lanes still leased after a graceful stop", lanes)
		}
	})
}

// With StopKeyOnDeadLetter, a dead event stops its key: whether the sink
// refused it for good, or it died before it was sent (its destination does
// not render), later events of its key in the same batch wait for an
// operator while other keys flow.
func TestStopKeyOnDeadLetterHoldsTheKey(t *testing.T) {
	t.Parallel()
	for name, configure := range map[string]func(*Config){
		"sink refuses": func(cfg *Config) {
			cfg.Routes[0].Targets[0].Sink.(*testSink).fail = func(e sinks.Event) error {
				if e.Topic == "bad" {
					return sinks.Permanent(errBoom)
				}
				return nil
			}
		},
		"destination fails before publish": func(cfg *Config) {
			cfg.Routes[0].Targets[0].Destination = template.Must(template.New("dest").Parse(`{{if ne .Topic "bad"}}{{.Topic}}{{end}}`))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachStore(t, func(t *testing.T, b *testBundle) {
				cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
				cfg.StopKeyOnDeadLetter = true
				cfg.Workers = 1 // each claim below looks at every lane
				obs := &progress{}
				cfg.Observer = obs
				configure(&cfg)
				seqs := b.insert(t, ev{topic: "bad", key: "k"}, ev{topic: "good", key: "k"}, ev{topic: "good", key: "j"})
				b.start(t, cfg)
				waitFor(t, time.Minute, "other key delivered", func() bool { return len(b.rec.all()) >= 1 })
				waitFor(t, time.Minute, "the dead letter and the event behind it recorded", func() bool {
					return b.countDeliveries(t, "state = 'dead' AND stops_key") == 1 && b.countDeliveries(t, "state = 'waiting'") == 1
				})
				// Claims of queued deliveries come every poll interval while the
				// relay is idle: after several, key k's second event would have
				// been published if the stop did not hold it.
				obs.waitClaims(t, 5)
				got := b.rec.all()
				if len(got) != 1 || got[0].seq != seqs[2] {
					t.Fatalf("deliveries %+v: only key j should pass while key k is stopped", got)
				}
				if n := b.countDeliveries(t, "state = 'dead' AND stops_key"); n != 1 {
					t.Fatalf("%d dead letters stopping their key, want 1", n)
				}
				if n := b.countDeliveries(t, "state = 'waiting'"); n != 1 {
					t.Fatalf("%d events waiting behind the stopped key, want 1", n)
				}
			})
		})
	}
}

func TestRetryAfterFromTheSinkIsHonoured(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var failed atomic.Bool
		sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
			if !failed.Swap(true) {
				return sinks.RetryAfter(errors.New("503 Service Unavailable"), 1200*time.Millisecond)
			}
			return nil
		}}
		cfg := b.config(t, sink)           // backoff would retry after 50ms
		cfg.Backoff.Max = 10 * time.Second // Retry-After is capped at the backoff maximum
		start := time.Now()
		b.insert(t, ev{topic: "t", key: "k"})
		b.start(t, cfg)
		waitFor(t, time.Minute, "delivered", func() bool { return len(b.rec.all()) == 1 })
		if took := b.rec.all()[0].at.Sub(start); took < 1200*time.Millisecond {
			t.Fatalf("retried after %s, before the sink's Retry-After of 1.2s", took)
		}
	})
}

// TestRetryAfterSchedulesTheDelivery reads the delivery a custom sink's
// sinks.RetryAfter leaves behind: its next attempt is due the asked delay
// after the failure (capped at the backoff maximum), the attempt counts,
// and the mark's text is the recorded error. Permanent and Unavailable
// keep their meaning over a RetryAfter mark.
func TestRetryAfterSchedulesTheDelivery(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		err      error
		max      time.Duration // Backoff.Max
		want     time.Duration // next_at - failure
		state    string
		attempts int
	}{
		{name: "asked delay", err: sinks.RetryAfter(errors.New("throttled"), 40*time.Minute), max: time.Hour, want: 40 * time.Minute, state: "ready", attempts: 1},
		{name: "capped at backoff max", err: sinks.RetryAfter(errors.New("throttled"), 50*time.Hour), max: time.Hour, want: time.Hour, state: "ready", attempts: 1},
		{name: "permanent wins", err: sinks.Permanent(sinks.RetryAfter(errors.New("gone"), 40*time.Minute)), max: time.Hour, state: "dead", attempts: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			eachStore(t, func(t *testing.T, b *testBundle) {
				sink := &testSink{name: "mem", rec: b.rec, fail: func(sinks.Event) error { return c.err }}
				cfg := b.config(t, sink)
				cfg.Backoff = Backoff{Initial: 50 * time.Millisecond, Max: c.max, Jitter: -1}
				b.insert(t, ev{topic: "t", key: "k"})
				failedBefore := time.Now()
				b.start(t, cfg)
				waitFor(t, time.Minute, "the failure recorded", func() bool {
					return b.countDeliveries(t, "sink = 'mem' AND attempts > 0") == 1
				})
				var (
					state, lastErr string
					attempts       int
					nextAt         *time.Time
				)
				b.db.queryRow(t, `SELECT state, attempts, last_error, next_at FROM `+b.db.names().Deliveries()+` WHERE sink = 'mem'`,
					&state, &attempts, &lastErr, &nextAt)
				if state != c.state || attempts != c.attempts || !strings.Contains(lastErr, c.err.Error()) {
					t.Fatalf("delivery state %s, attempts %d, error %q; want %s, %d, %q", state, attempts, lastErr, c.state, c.attempts, c.err)
				}
				if c.want == 0 {
					return
				}
				// The failure happened between failedBefore and now.
				if nextAt == nil || nextAt.Before(failedBefore.Add(c.want)) || nextAt.After(time.Now().Add(c.want)) {
					t.Fatalf("next attempt at %v, want %s after the failure (between %v and %v)", nextAt, c.want, failedBefore.Add(c.want), time.Now().Add(c.want))
				}
			})
		})
	}
}

// TestLateEventWaitsForParkedFollower: head H fails once; its follower F is
// parked behind it. While H's retry is in flight, a transaction that began
// long ago commits event E of the same key (its available_at sorts before
// F's). Claiming one event at a time, E is claimed before F; it must still
// reach the sink after F, because F holds the key while it waits.
func TestLateEventWaitsForParkedFollower(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var (
			headSeq  atomic.Int64
			failed   atomic.Bool
			retrying = make(chan struct{})
			release  = make(chan struct{})
		)
		sink := &testSink{name: "mem", rec: b.rec}
		sink.fail = func(e sinks.Event) error {
			if e.Seq != headSeq.Load() {
				return nil
			}
			if !failed.Swap(true) {
				return errBoom
			}
			close(retrying)
			<-release // hold the head's retry in flight
			return nil
		}
		cfg := b.config(t, sink)
		cfg.BatchSize = 1
		cfg.Backoff = Backoff{Initial: 300 * time.Millisecond, Max: time.Second, Jitter: -1}
		seqs := b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "k"})
		headSeq.Store(seqs[0])
		b.start(t, cfg)

		select {
		case <-retrying:
		case <-time.After(10 * time.Second):
			t.Fatal("the head's retry never started")
		}
		late := b.insert(t, ev{topic: "t", key: "k", payload: "{}", delay: -time.Hour})[0]
		close(release)
		waitFor(t, time.Minute, "all three delivered", func() bool { return len(b.rec.all()) == 3 })
		got := seqsInOrder(b.rec.all())
		want := []int64{seqs[0], seqs[1], late}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("delivery order %v, want %v: the late event overtook the parked one", got, want)
			}
		}
	})
}

func seqsInOrder(got []received) []int64 {
	out := make([]int64, len(got))
	for i, g := range got {
		out[i] = g.seq
	}
	return out
}

// TestTakeoverWaitsForTheOldOwnersBatch: a relay claims a key's event and
// is cut off with its publish in flight; its lanes' lease runs out and
// another relay takes them over. The new owner delivers the event again
// and the key's newer one, but only two thirds of a lease after it took
// the lanes (the old owner may claim until two thirds of a lease after it
// renewed them, and its publish ends with its lease), so the old owner's
// delivery, landing meanwhile, keeps the key in order. The test moves time
// instead of waiting for it: the old lease on the database, the new
// owner's wait on its Config.Clock.
func TestTakeoverWaitsForTheOldOwnersBatch(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		old := b.session(t, "old-relay")
		if _, err := old.refreshLanes(ctx, time.Minute, nil, 0); err != nil {
			t.Fatal(err)
		}
		b.insert(t, ev{topic: "t", key: "k"})
		rows, _, err := old.claim(ctx, ^uint64(0), rowLimit(10), store.Position{}, routingQueue(10), nil)
		if err != nil || len(rows) != 1 {
			t.Fatalf("old relay claimed %d rows: %v", len(rows), err)
		}
		b.insert(t, ev{topic: "t", key: "k"})
		b.expireLeases(t, "old-relay")

		clock, obs := &testClock{}, &progress{}
		cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
		cfg.Lease, cfg.Clock, cfg.Observer = time.Minute, clock.now, obs
		b.start(t, cfg)
		waitFor(t, time.Minute, "takeover", func() bool {
			return b.countIn(t, b.db.names().Lanes(), "owner = 'old-relay'") == 0
		})
		obs.waitClaims(t, 2)
		if got := b.rec.all(); len(got) != 0 {
			t.Fatalf("the new owner delivered %+v less than two thirds of a lease after the takeover", got)
		}
		// The old owner's publish lands.
		b.rec.mu.Lock()
		b.rec.got = append(b.rec.got, received{sink: "mem", id: rows[0].id, key: "k", seq: rows[0].seq, at: time.Now()})
		b.rec.mu.Unlock()
		clock.advance(cfg.Lease * 2 / 3)
		waitFor(t, time.Minute, "both delivered by the new owner", func() bool { return len(b.rec.all()) == 3 })
		got := seqsInOrder(b.rec.all())
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				t.Fatalf("deliveries of key k in order %v: the new owner published before the old owner's batch was over", got)
			}
		}
	})
}

// TestRelayVacuumsAsItRecords: a relay keeping up with a steady flow looks
// at the dead tuples every few thousand events, not only every
// maintainEvery, so that a high rate cannot pile up more than a few
// seconds' worth between vacuums. The periodic look is pushed past the
// test, so a vacuum can only come from the looks recording asks for.
//
// PostgreSQL only: vacuum.
func TestRelayVacuumsAsItRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.autovacuumOff(t)
	cfg := b.config(t, sinks.NewDiscard("discard"))
	cfg.BatchSize = 1000
	b.start(t, cfg, func(r *Relay) { r.vacuumEvery = time.Hour })
	// Rounds of 500 events, each drained before the next is inserted: every
	// batch the relay records is below BatchSize (a flow it keeps up with),
	// however slow the machine. The statistics the relay reads lag the
	// deletes by a second or more, so it takes a few rounds past the
	// threshold; 100,000 events is five times it.
	const round, rounds = 500, 200
	for i := 0; ; i++ {
		if vacuums, _ := b.outboxVacuums(t); vacuums > 0 {
			t.Logf("vacuumed by the relay after %d events", i*round)
			return
		}
		if i == rounds {
			_, dead := b.outboxVacuums(t)
			t.Fatalf("no vacuum by the relay after %d events recorded in batches below BatchSize (%d dead tuples)", i*round, dead)
		}
		evs := make([]ev, round)
		for j := range evs {
			evs[j] = ev{topic: "t", key: fmt.Sprintf("k%d", j%100)}
		}
		b.insert(t, evs...)
		waitFor(t, time.Minute, "the round delivered", func() bool { return b.count(t, "true") == 0 })
	}
}

// TestRelayVacuumsItsTable: every delivered event leaves a dead tuple that
// the claim walks past until a vacuum removes it. With autovacuum off (as on
// some servers) or behind, the relay vacuums the outbox itself. Autovacuum
// is off on the test's tables: the vacuum counted is the relay's.
//
// PostgreSQL only: vacuum.
func TestRelayVacuumsItsTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.autovacuumOff(t)
	const n = vacuumAfterDeadTuples + 5000
	for i := 0; i < n; i += 5000 {
		evs := make([]ev, 5000)
		for j := range evs {
			evs[j] = ev{topic: "t", key: fmt.Sprintf("k%d", (i+j)%100)}
		}
		b.insert(t, evs...)
	}
	cfg := b.config(t, sinks.NewDiscard("discard"))
	cfg.BatchSize = 2000
	// A look every second instead of every maintainEvery: the same look,
	// sooner.
	b.start(t, cfg, func(r *Relay) { r.vacuumEvery = time.Second })
	waitFor(t, 60*time.Second, "drained", func() bool { return b.count(t, "true") == 0 })
	waitFor(t, 60*time.Second, "the dead tuples vacuumed by the relay", func() bool {
		vacuums, dead := b.outboxVacuums(t)
		return vacuums > 0 && dead < vacuumAfterDeadTuples
	})
}
