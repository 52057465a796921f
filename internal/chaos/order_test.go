package chaos

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
)

// switchSink records what it delivers and fails while fail is set.
type switchSink struct {
	name string
	fail atomic.Pointer[error]

	mu  sync.Mutex
	got []int64 // seqs in delivery order
}

func (s *switchSink) Name() string { return s.name }

func (s *switchSink) Publish(_ context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	if p := s.fail.Load(); p != nil {
		return sinks.Fill(len(events), *p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range events {
		s.got = append(s.got, e.Seq)
	}
	return errs
}

func (s *switchSink) Close(context.Context) error { return nil }

func (s *switchSink) delivered() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.got...)
}

// TestParkedEventKeepsItsPlace reproduces the order violation the chaos
// suite found. Event 1 (routed to sinks A and B) fails on A (retry in 5s,
// a hold on A) and finds B down (paused 1s, a hold on B). Event 2 of the
// same key, routed to A only, is parked behind event 1's hold on A until 5s.
// Both sinks recover; event 1 comes due after 1s (its row's earliest
// target) and is delivered to A early, which frees its hold. Event 3 of the
// key, inserted then, finds no hold and must still wait for event 2 on A.
func TestParkedEventKeepsItsPlace(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	a, b := &switchSink{name: "A"}, &switchSink{name: "B"}
	failA, downB := errors.New("A refuses for now"), sinks.Unavailable(errors.New("B is down"))
	a.fail.Store(&failA)
	b.fail.Store(&downB)
	r, err := relay.NewPostgres(pool, relay.Config{
		Tables:       tables,
		Lease:        10 * time.Second,
		PollInterval: 50 * time.Millisecond,
		Backoff:      relay.Backoff{Initial: 5 * time.Second, Max: 5 * time.Second, Jitter: -1},
		SinkPause:    relay.Backoff{Initial: time.Second, Max: time.Second, Jitter: -1},
		Routes: []relay.Route{
			{Topics: []string{"ab"}, Targets: []relay.Target{{Sink: a}, {Sink: b}}},
			{Topics: []string{"a"}, Targets: []relay.Target{{Sink: a}}},
		},
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	insert := func(topic string) int64 {
		t.Helper()
		var seq int64
		if err := pool.QueryRow(context.Background(), `INSERT INTO `+tables.Outbox()+` (topic, key, payload)
VALUES ($1, 'k', '{}') RETURNING seq`, topic).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	query := func(sql string, args ...any) bool {
		var ok bool
		if err := pool.QueryRow(context.Background(), sql, args...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	e1 := insert("ab")
	until("event 1 to fail on A", func() bool {
		return query(`SELECT count(*) = 1 FROM `+tables.Deliveries()+` WHERE sink = 'A' AND seq = $1 AND attempts >= 1`, e1)
	})
	e2 := insert("a")
	until("event 2 to be parked", func() bool {
		return query(`SELECT count(*) = 1 FROM `+tables.Deliveries()+` WHERE sink = 'A' AND seq = $1 AND state = 'waiting'`, e2)
	})
	a.fail.Store(nil)
	b.fail.Store(nil)
	until("event 1 to be delivered", func() bool {
		return query(`SELECT NOT EXISTS (SELECT 1 FROM `+tables.Outbox()+` WHERE seq = $1)
    AND NOT EXISTS (SELECT 1 FROM `+tables.Deliveries()+` WHERE seq = $1)`, e1)
	})
	e3 := insert("a")
	until("events 2 and 3 to be delivered", func() bool {
		return query(`SELECT NOT EXISTS (SELECT 1 FROM `+tables.Outbox()+` WHERE seq = ANY($1))
    AND NOT EXISTS (SELECT 1 FROM `+tables.Deliveries()+` WHERE seq = ANY($1))`, []int64{e2, e3})
	})
	got := a.delivered()
	want := []int64{e1, e2, e3}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("sink A received seqs %v, want %v: event 3 overtook event 2, parked behind event 1's hold, "+
			"once event 1 was delivered early and its hold freed", got, want)
	}
}
