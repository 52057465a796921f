package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// The isolation tests: a slow sink, or a slow event, holds back only
// itself. Each slow thing here is a sink blocked on a gate the test holds:
// what must keep flowing is checked while the gate is still shut, so no
// test depends on how fast the machine is.

// gatedSink delivers to a recorder, each event one at a time with
// sinks.PublishEach (results reported as they come), blocking an event
// while hold says so until the gate opens. It counts what it holds.
type gatedSink struct {
	name  string
	rec   *recorder
	hold  func(e *sinks.Event) bool
	gate  chan struct{} // closed: nothing is held any more
	limit *sinks.Limiter
	fail  func(e *sinks.Event) error
	// pace is how long each event takes to answer (0: at once).
	pace time.Duration

	held    atomic.Int64 // events blocked at the gate now
	peak    atomic.Int64 // the most events ever handed to Publish and not answered at once
	inside  atomic.Int64
	callsMu sync.Mutex
	calls   [][]sinks.Event // every call's events
}

func newGatedSink(name string, rec *recorder, hold func(e *sinks.Event) bool) *gatedSink {
	return &gatedSink{name: name, rec: rec, hold: hold, gate: make(chan struct{}), limit: sinks.NewLimiter(64)}
}

func (s *gatedSink) Name() string                { return s.name }
func (s *gatedSink) Close(context.Context) error { return nil }
func (s *gatedSink) PublishesConcurrently() bool { return true }
func (s *gatedSink) open()                       { close(s.gate) }
func (s *gatedSink) waitHeld(t *testing.T, n int) {
	s.waitFor(t, fmt.Sprintf("%d events held at %s's gate", n, s.name), n)
}

func (s *gatedSink) waitFor(t *testing.T, what string, n int) {
	t.Helper()
	waitFor(t, time.Minute, what, func() bool { return s.held.Load() == int64(n) })
}

// Publish counts the events handed to it and not answered yet (inside,
// and its peak), as the relay counts them in flight.
func (s *gatedSink) Publish(ctx context.Context, events []sinks.Event) []error {
	s.callsMu.Lock()
	s.calls = append(s.calls, slices.Clone(events))
	s.callsMu.Unlock()
	n := s.inside.Add(int64(len(events)))
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	var answered atomic.Int64
	defer func() { s.inside.Add(answered.Load() - int64(len(events))) }()
	return sinks.NewResults(ctx, events, nil).PublishEach(s.limit, func(ctx context.Context, e *sinks.Event) error {
		defer func() {
			answered.Add(1)
			s.inside.Add(-1)
		}()
		if s.hold != nil && s.hold(e) {
			s.held.Add(1)
			select {
			case <-s.gate:
				s.held.Add(-1)
			case <-ctx.Done():
				s.held.Add(-1)
				return ctx.Err()
			}
		}
		if s.pace > 0 {
			t := time.NewTimer(s.pace)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		if s.fail != nil {
			if err := s.fail(e); err != nil {
				return err
			}
		}
		s.rec.mu.Lock()
		s.rec.got = append(s.rec.got, received{sink: s.name, id: e.ID, key: e.Key, seq: e.Seq, attempt: e.Attempt, at: time.Now()})
		s.rec.mu.Unlock()
		return nil
	})
}

// callKeys returns, for each Publish call so far, how many keys it carried.
func (s *gatedSink) callKeys() []int {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	out := make([]int, len(s.calls))
	for i, evs := range s.calls {
		keys := map[string]bool{}
		for _, e := range evs {
			keys[e.Key] = true
		}
		out[i] = len(keys)
	}
	return out
}

// TestSlowSinkHoldsBackOnlyItself: one route, a fast sink and a slow one
// that has not answered. The fast sink keeps receiving every event, of the
// slow sink's keys too, while the slow one still holds its first; once it
// answers, it gets every event once, in key order.
func TestSlowSinkHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		fast := &testSink{name: "fast", rec: b.rec}
		slow := newGatedSink("slow", b.rec, func(*sinks.Event) bool { return true })
		cfg := b.config(t, fast, slow)
		cfg.HandOffAfter = 20 * time.Millisecond
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute // held until the gate opens
		seqs := b.insert(t, ev{topic: "t", key: "k"})
		b.start(t, cfg)
		slow.waitHeld(t, 1)
		// Later events, of the held key and of others, in several batches.
		for i := range 5 {
			seqs = append(seqs, b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: fmt.Sprintf("other-%d", i)})...)
			waitFor(t, time.Minute, "the fast sink to get the batch", func() bool { return len(b.rec.forSink("fast")) == len(seqs) })
		}
		if n := slow.held.Load(); n == 0 {
			t.Fatal("the slow sink answered before the test opened its gate")
		}
		if got := b.rec.forSink("slow"); len(got) != 0 {
			t.Fatalf("the slow sink delivered %d events while held", len(got))
		}
		slow.open()
		waitFor(t, time.Minute, "the slow sink to catch up and the queues to drain", func() bool {
			return len(b.rec.forSink("slow")) >= len(seqs) && b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
		})
		got := b.rec.all()
		checkKeyOrder(t, got)
		exactlyOnce(t, got, "fast", seqs)
		exactlyOnce(t, got, "slow", seqs)
	})
}

// TestSlowKeyHoldsBackOnlyItself: on one sink, an event that does not get
// its answer holds back its own key only: the sink's other keys keep
// flowing meanwhile, and the held key's later events wait behind it, then
// go in order.
func TestSlowKeyHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := newGatedSink("mem", b.rec, func(e *sinks.Event) bool { return e.Key == "stuck" })
		cfg := b.config(t, sink)
		cfg.HandOffAfter = 20 * time.Millisecond
		// The held call lasts until the gate opens, however long a loaded
		// machine takes over the rounds below (the bundle's 5s lease
		// would end it at 2.5s).
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute
		seqs := b.insert(t, ev{topic: "t", key: "stuck"}, ev{topic: "t", key: "a"})
		b.start(t, cfg)
		sink.waitHeld(t, 1)
		others := 1
		for i := range 5 {
			seqs = append(seqs, b.insert(t, ev{topic: "t", key: "stuck"}, ev{topic: "t", key: "a"}, ev{topic: "t", key: fmt.Sprintf("b%d", i)})...)
			others += 2
			waitFor(t, time.Minute, "the other keys' events", func() bool { return len(b.rec.forSink("mem")) == others })
		}
		for _, g := range b.rec.forSink("mem") {
			if g.key == "stuck" {
				t.Fatalf("an event of the held key was delivered while its first was held: seq %d", g.seq)
			}
		}
		if sink.held.Load() != 1 {
			t.Fatalf("%d events held, want the first of the stuck key alone", sink.held.Load())
		}
		sink.open()
		waitFor(t, time.Minute, "every event delivered and the queues drained", func() bool {
			return len(b.rec.forSink("mem")) >= len(seqs) && b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
		})
		got := b.rec.all()
		checkKeyOrder(t, got)
		exactlyOnce(t, got, "mem", seqs)
	})
}

// TestInFlightFailureRetriesInOrder: a held event that fails once its call
// answers (after its batch was recorded with it in flight) is retried with
// backoff and delivered before its key's later events, each once.
func TestInFlightFailureRetriesInOrder(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var failed atomic.Bool
		sink := newGatedSink("mem", b.rec, func(e *sinks.Event) bool { return e.Attempt == 1 && e.Key == "k" })
		sink.fail = func(e *sinks.Event) error {
			if e.Key == "k" && failed.CompareAndSwap(false, true) {
				return errors.New("HTTP 503")
			}
			return nil
		}
		cfg := b.config(t, sink)
		cfg.HandOffAfter = 20 * time.Millisecond
		seqs := b.insert(t, ev{topic: "t", key: "k"})
		b.start(t, cfg)
		sink.waitHeld(t, 1)
		seqs = append(seqs, b.insert(t, ev{topic: "t", key: "k"}, ev{topic: "t", key: "k"})...)
		waitFor(t, time.Minute, "the key's later events queued behind the one in flight", func() bool {
			return b.countDeliveries(t, "state = 'waiting'") == 2
		})
		sink.open()
		waitFor(t, time.Minute, "the key delivered after a retry", func() bool {
			return len(b.rec.forSink("mem")) == 3 && b.countDeliveries(t, "true") == 0
		})
		got := b.rec.all()
		checkKeyOrder(t, got)
		exactlyOnce(t, got, "mem", seqs)
		if got[0].seq != seqs[0] || got[0].attempt != 2 {
			t.Fatalf("first delivery: seq %d attempt %d, want seq %d on its second attempt", got[0].seq, got[0].attempt, seqs[0])
		}
	})
}

// TestInFlightIsBounded: a sink that answers nothing is handed at most
// relay.max_in_flight events; the others wait in its queue, without an
// attempt, and all go once it answers.
func TestInFlightIsBounded(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := newGatedSink("mem", b.rec, func(*sinks.Event) bool { return true })
		cfg := b.config(t, sink)
		cfg.HandOffAfter = 20 * time.Millisecond
		cfg.MaxInFlight = 10
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute // held until the gate opens
		var gauge inFlightGauge
		cfg.Observer = &gauge
		evs := make([]ev, 50)
		for i := range evs {
			evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i)}
		}
		seqs := b.insert(t, evs...)
		b.start(t, cfg)
		sink.waitHeld(t, 10)
		waitFor(t, time.Minute, "the rest queued without an attempt", func() bool {
			return b.count(t, "true") == 0 && b.countDeliveries(t, "attempts = 0") == 50
		})
		if p := sink.peak.Load(); p > 10 {
			t.Fatalf("the sink was handed %d events at once, want at most 10", p)
		}
		waitFor(t, time.Minute, "the in-flight gauge at 10", func() bool { return gauge.peak.Load() == 10 })
		sink.open()
		waitFor(t, time.Minute, "every event delivered", func() bool {
			return len(b.rec.forSink("mem")) >= 50 && b.countDeliveries(t, "true") == 0
		})
		exactlyOnce(t, b.rec.all(), "mem", seqs)
		if p := sink.peak.Load(); p > 10 {
			t.Fatalf("the sink was handed %d events at once, want at most 10", p)
		}
	})
}

// TestQueueDrainsAcrossKeys: after an outage, a sink's queue drains over
// all its keys at once: a claim shares its rows between the queues' heads,
// so a Publish call carries every key rather than one key's backlog (a
// sink sends one key's events one after another: a call of one key would
// use one of its connections).
func TestQueueDrainsAcrossKeys(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down atomic.Bool
		down.Store(true)
		sink := newGatedSink("mem", b.rec, nil)
		sink.fail = func(*sinks.Event) error {
			if down.Load() {
				return sinks.Unavailable(errors.New("connection refused"))
			}
			return nil
		}
		cfg := b.config(t, sink)
		cfg.Workers = 1 // every key in one worker's lanes
		const keys, perKey = 20, 25
		var evs []ev
		for i := range keys * perKey {
			evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%02d", i%keys)})
		}
		seqs := b.insert(t, evs...)
		b.start(t, cfg)
		waitFor(t, time.Minute, "the backlog queued while the sink is down", func() bool {
			return b.count(t, "true") == 0 && b.countDeliveries(t, "true") == keys*perKey
		})
		outage := len(sink.callKeys()) // the calls that failed
		down.Store(false)
		waitFor(t, time.Minute, "the queue drained", func() bool {
			return len(b.rec.forSink("mem")) >= keys*perKey && b.countDeliveries(t, "true") == 0
		})
		got := b.rec.all()
		checkKeyOrder(t, got)
		exactlyOnce(t, got, "mem", seqs)
		// Not all of them in every run: a key whose head is still in
		// flight (the probe's, or a call handed off on a loaded machine)
		// sits out the next claim. The design this replaced sent one key
		// per call.
		if most := slices.Max(sink.callKeys()[outage:]); most < keys/2 {
			t.Fatalf("the most keys in one call after the outage: %d, want at least %d of %d", most, keys/2, keys)
		}
	})
}

// TestQueueChainsFitTheirCall: a sink that sends a key's events one after
// another (each takes 20 ms here) is claimed no longer a chain of a key's
// queue than it delivers in half a publish (a 1 s publish_timeout: 25
// events), so its calls end before their deadline and no event is cut
// short and sent again. Without the bound, a claim brought the key's whole
// backlog (100 events, 2 s) and the call's deadline cut it at about the
// 50th, which went again as a retry. The sink learns its pace from a first
// small queue (key w); each key's first event fails once, queueing the
// rest behind it.
func TestQueueChainsFitTheirCall(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		firsts := map[string]bool{}
		var mu sync.Mutex
		sink := newGatedSink("slow", b.rec, nil)
		sink.pace = 20 * time.Millisecond
		sink.fail = func(e *sinks.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if !firsts[e.Key] {
				firsts[e.Key] = true
				return errors.New("HTTP 503")
			}
			return nil
		}
		cfg := b.config(t, sink)
		cfg.PublishTimeout = time.Second
		var evs []ev
		for range 10 {
			evs = append(evs, ev{topic: "t", key: "w"})
		}
		warm := b.insert(t, evs...)
		b.start(t, cfg)
		waitFor(t, time.Minute, "key w's queue delivered", func() bool { return len(b.rec.forSink("slow")) == len(warm) })
		calls := len(sink.callKeys())
		evs = evs[:0]
		for range 100 {
			evs = append(evs, ev{topic: "t", key: "k"})
		}
		seqs := b.insert(t, evs...)
		waitFor(t, time.Minute, "key k's queue delivered", func() bool {
			return len(b.rec.forSink("slow")) >= len(warm)+len(seqs) && b.countDeliveries(t, "true") == 0
		})
		got := b.rec.all()
		exactlyOnce(t, got, "slow", append(warm, seqs...))
		checkKeyOrder(t, got)
		for _, g := range got {
			want := 1
			if g.seq == warm[0] || g.seq == seqs[0] {
				want = 2 // the failed first
			}
			if g.attempt != want {
				t.Fatalf("event %d (key %s) delivered on attempt %d, want %d: a call's deadline cut it short", g.seq, g.key, g.attempt, want)
			}
		}
		sink.callsMu.Lock()
		defer sink.callsMu.Unlock()
		// The first call after the insert is the new events' own, which
		// fails at k's first event.
		for _, evs := range sink.calls[calls+1:] {
			if len(evs) > 25 {
				t.Fatalf("a call carried %d events of a sink delivering one in 20 ms, with a 1 s publish timeout", len(evs))
			}
		}
	})
}

// TestRetriesFollowTheDatabaseClock: with the relay's host clock an hour
// off either way, retries are spaced as the backoff says: the time of the
// next attempt is the database's clock plus the delay, never the host's.
// An hour behind, the old design spent every attempt at once; an hour
// ahead, it held the key for an hour.
func TestRetriesFollowTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
				var attempts atomic.Int64
				sink := &testSink{name: "mem", rec: b.rec, fail: func(e sinks.Event) error {
					if attempts.Add(1) <= 3 {
						return errors.New("HTTP 503")
					}
					return nil
				}}
				var times timeLog
				cfg := b.config(t, &attemptClock{Sink: sink, log: &times})
				cfg.Backoff = Backoff{Initial: 300 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: -1}
				cfg.MaxAttempts = 4
				cfg.Clock = func() time.Time { return time.Now().Add(skew) }
				seqs := b.insert(t, ev{topic: "t", key: "k"})
				b.start(t, cfg)
				waitFor(t, time.Minute, "the event delivered on its fourth attempt", func() bool {
					return len(b.rec.forSink("mem")) == 1
				})
				exactlyOnce(t, b.rec.all(), "mem", seqs)
				at := times.all()
				for i, want := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, time.Second} {
					if gap := at[i+1].Sub(at[i]); gap < want {
						t.Errorf("attempt %d came %s after attempt %d, want at least the backoff's %s", i+2, gap, i+1, want)
					}
				}
			})
		})
	}
}

// attemptClock logs when each Publish call of its sink starts.
type attemptClock struct {
	sinks.Sink
	log *timeLog
}

func (s *attemptClock) Publish(ctx context.Context, events []sinks.Event) []error {
	s.log.add(time.Now())
	return s.Sink.Publish(ctx, events)
}

type timeLog struct {
	mu sync.Mutex
	at []time.Time
}

func (l *timeLog) add(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, t)
}

func (l *timeLog) all() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.at)
}

// TestStopLandsEventsInFlight: a relay stopped while a call is in flight
// waits for its answer (within shutdown_timeout) and records it before it
// gives its lanes back: the event is delivered once, and nothing is left
// for the lanes' next owner to send again.
func TestStopLandsEventsInFlight(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		sink := newGatedSink("mem", b.rec, func(*sinks.Event) bool { return true })
		cfg := b.config(t, sink)
		cfg.HandOffAfter = 20 * time.Millisecond
		seqs := b.insert(t, ev{topic: "t", key: "k"})
		stop := b.start(t, cfg)
		sink.waitHeld(t, 1)
		waitFor(t, time.Minute, "the batch recorded with its event in flight", func() bool {
			return b.count(t, "true") == 0 && b.countDeliveries(t, "state = 'ready'") == 1
		})
		stopped := make(chan struct{})
		go func() {
			stop()
			close(stopped)
		}()
		// The relay is stopping; its call still holds the event.
		waitFor(t, time.Minute, "the relay's heartbeat to stay while it lands its call", func() bool {
			return b.countIn(t, b.db.names().Relays(), "true") > 0
		})
		sink.open()
		<-stopped
		exactlyOnce(t, b.rec.all(), "mem", seqs)
		if n := b.countDeliveries(t, "true"); n != 0 {
			t.Fatalf("%d deliveries left after the relay stopped, want the event's recorded as delivered", n)
		}
	})
}

// inFlightGauge keeps the highest in-flight count the relay reported.
type inFlightGauge struct {
	NopObserver
	peak atomic.Int64
}

func (g *inFlightGauge) SinkInFlight(_ string, n int) {
	for {
		p := g.peak.Load()
		if int64(n) <= p || g.peak.CompareAndSwap(p, int64(n)) {
			return
		}
	}
}

// TestRowBehindThePositionIsDelivered: claims of a long backlog start
// where the last full batch ended; an event committed late, whose place
// in the claim's order the claims have passed, is still delivered (by a
// walk from the beginning, when a claim is not full and every poll
// interval), before its key's later events.
//
// PostgreSQL only: it holds a pgx transaction open across the drain.
func TestRowBehindThePositionIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var late int64
	if err := tx.QueryRow(ctx, "INSERT INTO "+b.tables.Outbox()+" (topic, key, payload) VALUES ('t', 'late', '{}') RETURNING seq").Scan(&late); err != nil {
		t.Fatal(err)
	}
	evs := make([]ev, 300)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%30)}
	}
	seqs := b.insert(t, evs...)
	sink := &testSink{name: "mem", rec: b.rec}
	cfg := b.config(t, sink)
	cfg.BatchSize = 20
	cfg.Workers = 1
	b.start(t, cfg)
	waitFor(t, time.Minute, "the backlog delivered", func() bool { return len(b.rec.forSink("mem")) == len(seqs) })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.insert(t, ev{topic: "t", key: "late"})
	waitFor(t, time.Minute, "the late event delivered", func() bool { return len(b.rec.forSink("mem")) == len(seqs)+2 })
	got := b.rec.all()
	checkKeyOrder(t, got)
	exactlyOnce(t, got, "mem", append(seqs, late, got[len(got)-1].seq))
}
