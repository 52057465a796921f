package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// recordingSink records what it acknowledges; reject decides which events
// it refuses for good.
type recordingSink struct {
	name   string
	reject func(e sinks.Event) bool
	mu     sync.Mutex
	got    []sinks.Event
}

func (s *recordingSink) Name() string { return s.name }

func (s *recordingSink) Publish(_ context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range events {
		if s.reject != nil && s.reject(e) {
			errs[i] = sinks.Permanent(errors.New("rejected: bad request"))
			continue
		}
		s.got = append(s.got, e)
	}
	return errs
}

func (s *recordingSink) Close(context.Context) error { return nil }

func (s *recordingSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.got))
	for i, e := range s.got {
		out[i] = e.ID
	}
	return out
}

// broken is a switch for a sink's reject function.
type broken struct{ on atomic.Bool }

func (b *broken) reject(sinks.Event) bool { return b.on.Load() }

// run starts a relay on tb's tables until the test ends.
func (tb *testBundle) run(t *testing.T, stopKey bool, targets ...sinks.Sink) {
	t.Helper()
	var ts []relay.Target
	for _, s := range targets {
		ts = append(ts, relay.Target{Sink: s})
	}
	cfg := relay.Config{
		Tables: tb.tables, PollInterval: 20 * time.Millisecond, Lease: 5 * time.Second,
		StopKeyOnDeadLetter: stopKey,
		Routes:              []relay.Route{{Topics: []string{"*"}, Targets: ts}},
		Logger:              slog.New(slog.DiscardHandler),
	}
	var (
		r   *relay.Relay
		err error
	)
	if tb.my != nil {
		r, err = relay.NewMySQL(tb.my, cfg)
	} else {
		r, err = relay.NewPostgres(tb.pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	})
}

// insert commits events of one key ("" for none) and returns their ids.
func (tb *testBundle) insert(t *testing.T, keys ...string) []string {
	t.Helper()
	ids := make([]string, len(keys))
	for i, key := range keys {
		var k any
		if key != "" {
			k = key
		}
		if tb.my != nil {
			// The id is chosen here: the relay may take the row before a
			// SELECT reads it back.
			ids[i] = uuid.NewString()
			tb.execMy(t, "INSERT INTO "+tb.mt.Outbox()+" (id, topic, `key`) VALUES (?, 'orders', ?)", ids[i], k)
			continue
		}
		if err := tb.pool.QueryRow(context.Background(), "INSERT INTO "+tb.tables.Outbox()+" (topic, key) VALUES ('orders', $1) RETURNING id::text", k).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// only returns the ids of got that are in of, in got's order.
func only(got, of []string) []string {
	var out []string
	for _, id := range got {
		if slices.Contains(of, id) {
			out = append(out, id)
		}
	}
	return out
}

// TestReplayAndPurgeThroughRelay runs a real relay with two sinks, one
// rejecting everything, under stop_key_on_dead_letter: k1's first event
// dies on bad and the later ones wait behind it there. Once bad is fixed,
// replaying the dead letters delivers them to bad alone, and the waiting
// events follow in order; purging them instead lets the waiting events go
// without them. good gets nothing twice.
func TestReplayAndPurgeThroughRelay(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"replay", "purge"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			forEachDB(t, func(t *testing.T, tb *testBundle) {
				ctx := context.Background()
				var off broken
				off.on.Store(true)
				good, bad := &recordingSink{name: "good"}, &recordingSink{name: "bad", reject: off.reject}
				tb.run(t, true, good, bad)

				ids := tb.insert(t, "k1", "k1", "k1", "", "")
				// k1's first event and both unkeyed ones die on bad; k1's
				// later events are delivered to good and wait on bad.
				waitFor(t, "3 dead letters and 2 waiting deliveries", func() bool {
					return tb.count(t, tb.deliveries(), "sink = 'bad' AND state = 'dead'") == 3 &&
						tb.count(t, tb.deliveries(), "sink = 'bad' AND state = 'waiting'") == 2
				})
				waitFor(t, "good to get all 5", func() bool { return len(good.ids()) == 5 })
				if n := tb.count(t, tb.deliveries(), "stops_key"); n != 1 {
					t.Fatalf("%d dead letters stop their key, want k1's", n)
				}

				off.on.Store(false)
				var (
					res deadletter.Result
					err error
				)
				if op == "replay" {
					res, err = tb.store.Replay(ctx, deadletter.Filter{Sink: "bad"}, deadletter.ReplayOpts{})
				} else {
					res, err = tb.store.Purge(ctx, deadletter.Filter{Sink: "bad"}, deadletter.PurgeOpts{})
				}
				if err != nil || res.Count != 3 {
					t.Fatalf("%s = %+v, %v", op, res, err)
				}
				waitFor(t, "the deliveries to empty", func() bool { return tb.count(t, tb.deliveries(), "true") == 0 })
				if got := good.ids(); len(got) != 5 || !sameSet(got, ids) {
					t.Fatalf("good got %v, want each of %v once", got, ids)
				}
				want := ids
				if op == "purge" {
					want = ids[1:3]
				}
				gotBad := bad.ids()
				if len(gotBad) != len(want) || !sameSet(gotBad, want) {
					t.Fatalf("bad got %v, want each of %v once", gotBad, want)
				}
				if k1 := only(gotBad, ids[:3]); !slices.Equal(k1, only(ids[:3], want)) {
					t.Fatalf("bad got key k1 as %v, want seq order %v", k1, only(ids[:3], want))
				}
				if n := tb.count(t, tb.outboxTable(), "true"); n != 0 {
					t.Fatalf("%d outbox rows left", n)
				}
			})
		})
	}
}

// TestReplayAllSinksThroughRelay: an event replayed with AllSinks goes
// through the routing step again, to every sink of its route; a later
// event of its key waits for it there.
func TestReplayAllSinksThroughRelay(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	var off broken
	off.on.Store(true)
	good, bad := &recordingSink{name: "good"}, &recordingSink{name: "bad", reject: off.reject}
	tb.run(t, false, good, bad)

	first := tb.insert(t, "k1", "")
	waitFor(t, "2 dead letters on bad", func() bool {
		return tb.count(t, tb.tables.Deliveries(), "sink = 'bad' AND state = 'dead'") == 2
	})
	waitFor(t, "good to get both", func() bool { return len(good.ids()) == 2 })
	off.on.Store(false)
	res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "bad"}, deadletter.ReplayOpts{AllSinks: true})
	if err != nil || res.Count != 2 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	waitFor(t, "the deliveries to empty", func() bool { return tb.count(t, tb.tables.Deliveries(), "true") == 0 })
	waitFor(t, "good to get both again", func() bool { return len(good.ids()) == 4 })
	if got := good.ids(); !sameSet(got, append(slices.Clone(first), first...)) {
		t.Fatalf("good got %v, want %v twice", got, first)
	}
	if got := bad.ids(); len(got) != 2 || !sameSet(got, first) {
		t.Fatalf("bad got %v, want %v once", got, first)
	}
}

// TestReplayWhileRelayRecords: a relay records outcomes while replays run
// one after another. The flaky sink refuses every event for good the
// first time it sees it, so every event becomes a dead letter that stops
// its key, and is delivered once a replay has put it back. Every event
// must arrive exactly once, in key order, with nothing left behind: the
// lanes' lock keeps each replay batch and each record apart.
func TestReplayWhileRelayRecords(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	var seenMu sync.Mutex
	seen := map[string]bool{}
	flaky := &recordingSink{name: "flaky", reject: func(e sinks.Event) bool {
		seenMu.Lock()
		defer seenMu.Unlock()
		first := !seen[e.ID]
		seen[e.ID] = true
		return first
	}}
	tb.run(t, true, flaky)

	const keys, perKey = 20, 15
	done := make(chan struct{})
	replayed := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				replayed <- nil
				return
			default:
			}
			if _, err := tb.store.Replay(ctx, deadletter.Filter{}, deadletter.ReplayOpts{}); err != nil {
				replayed <- err
				return
			}
		}
	}()
	var ids []string
	byKey := map[string][]string{}
	for i := range perKey {
		batch := make([]string, 0, keys+1)
		for k := range keys {
			batch = append(batch, fmt.Sprintf("k%d", k))
		}
		batch = append(batch, "")
		got := tb.insert(t, batch...)
		for j, id := range got {
			byKey[batch[j]] = append(byKey[batch[j]], id)
		}
		ids = append(ids, got...)
		if i%5 == 0 {
			time.Sleep(10 * time.Millisecond) // let the relay overlap the writers
		}
	}
	waitFor(t, "every event to be delivered", func() bool { return len(flaky.ids()) >= len(ids) })
	waitFor(t, "the deliveries and the outbox to empty", func() bool {
		return tb.count(t, tb.tables.Deliveries(), "true") == 0 && tb.count(t, tb.tables.Outbox(), "true") == 0
	})
	close(done)
	if err := <-replayed; err != nil {
		t.Fatalf("Replay: %v", err)
	}
	got := flaky.ids()
	if len(got) != len(ids) || !sameSet(got, ids) {
		t.Fatalf("flaky got %d events, want each of %d once", len(got), len(ids))
	}
	for key, want := range byKey {
		if key == "" {
			continue
		}
		if order := only(got, want); !slices.Equal(order, want) {
			t.Fatalf("key %s arrived as %v, want %v", key, order, want)
		}
	}
}
