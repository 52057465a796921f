package deadletter_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// recordingSink records what it acknowledges; while broken it rejects
// every event for good.
type recordingSink struct {
	name   string
	broken atomic.Bool
	mu     sync.Mutex
	got    []sinks.Event
}

func (s *recordingSink) Name() string { return s.name }

func (s *recordingSink) Publish(_ context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range events {
		if s.broken.Load() {
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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplayThroughRelay runs a real relay with two sinks, one rejecting
// everything, under stop_key_on_dead_letter. After the failing sink is fixed,
// a replay delivers the dead events to it alone, and the parked later events
// of the stopped key follow in order; the healthy sink gets nothing twice.
func TestReplayThroughRelay(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	good, bad := &recordingSink{name: "good"}, &recordingSink{name: "bad"}
	bad.broken.Store(true)
	r, err := relay.New(tb.pool, relay.Config{
		Tables: tb.tables, PollInterval: 20 * time.Millisecond, PollOnly: true, Lease: 5 * time.Second,
		StopKeyOnDeadLetter: true,
		Routes:              []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: good}, {Sink: bad}}}},
		Logger:              slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	var ids []string
	for _, key := range []string{"k1", "k1", "k1", "", ""} {
		var k any
		if key != "" {
			k = key
		}
		var id string
		if err := tb.pool.QueryRow(ctx, "INSERT INTO "+tb.tables.Outbox()+" (topic, key) VALUES ('orders', $1) RETURNING id::text", k).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// k1's first event and both unkeyed ones die on bad; k1's later events
	// are delivered to good and parked for bad.
	waitFor(t, "3 dead letters and 2 parked events", func() bool {
		var deadN, parked int
		_ = tb.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status = 'pending' AND available_at = 'infinity') FROM "+tb.tables.Outbox()).Scan(&deadN, &parked)
		return deadN == 3 && parked == 2
	})
	waitFor(t, "good to get all 5", func() bool { return len(good.ids()) == 5 })

	bad.broken.Store(false)
	res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "bad"}, deadletter.ReplayOpts{})
	if err != nil || res.Count != 3 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	waitFor(t, "the table to empty", func() bool {
		var n int
		_ = tb.pool.QueryRow(ctx, "SELECT count(*) FROM "+tb.tables.Outbox()).Scan(&n)
		return n == 0
	})
	if got := good.ids(); len(got) != 5 || !sameSet(got, ids) {
		t.Fatalf("good got %v, want each of %v once", got, ids)
	}
	gotBad := bad.ids()
	if !sameSet(gotBad, ids) || len(gotBad) != 5 {
		t.Fatalf("bad got %v, want each of %v once", gotBad, ids)
	}
	var k1 []string
	for _, id := range gotBad {
		if slices.Contains(ids[:3], id) {
			k1 = append(k1, id)
		}
	}
	if !slices.Equal(k1, ids[:3]) {
		t.Fatalf("bad got key k1 as %v, want seq order %v", k1, ids[:3])
	}
	var holds int
	if err := tb.pool.QueryRow(ctx, "SELECT count(*) FROM "+tb.tables.Holds()).Scan(&holds); err != nil || holds != 0 {
		t.Fatalf("%d holds left (%v)", holds, err)
	}
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), y)
}
