package main

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
)

// cycleWatch is a relay.Observer that tells the test of the relay's idle
// cycles and of its acknowledgements.
type cycleWatch struct {
	relay.NopObserver
	mu sync.Mutex
	// lastCycle is when the previous claim ended.
	lastCycle time.Time
	// quietIdle receives the end of an empty claim that came at least
	// quietGap after the previous one: the worker is idle, waiting on its
	// timers, not lingering after work.
	quietIdle chan time.Time
	published chan time.Time
}

const quietGap = 300 * time.Millisecond

func (c *cycleWatch) Claimed(events int, _ time.Duration) {
	c.mu.Lock()
	now, last := time.Now(), c.lastCycle
	c.lastCycle = now
	c.mu.Unlock()
	if events == 0 && !last.IsZero() && now.Sub(last) >= quietGap {
		select {
		case c.quietIdle <- now:
		default:
		}
	}
}

func (c *cycleWatch) Published(string, string, time.Duration) {
	select {
	case c.published <- time.Now():
	default:
	}
}

// An application that runs the relay in its own process on MySQL, where
// the relay has no notification and polls, wakes it after its commit: the
// event is published at once, although the relay's poll interval is an
// hour. An idle worker still looks on its own at each renewal of its lanes
// (every 2s at most) and at its upkeep: so each round commits right after
// such a look, and the event must be out within wakeBound, well before the
// next. Without Wake, a round passes only when an upkeep timer happens to
// fall inside wakeBound; three rounds in a row almost never do.
func TestWakeAfterCommitOnMySQL(t *testing.T) {
	t.Parallel()
	db, url := mysqltest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, 0); err != nil {
		t.Fatal(err)
	}
	writer, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL})
	if err != nil {
		t.Fatal(err)
	}

	watch := &cycleWatch{quietIdle: make(chan time.Time, 1), published: make(chan time.Time, 1)}
	relayDB, err := relay.OpenMySQL(url, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer relayDB.Close()
	rl, err := relay.NewMySQL(relayDB, relay.Config{
		Workers:      1,
		PollInterval: time.Hour,
		PollOnly:     true, // no probe either: the relay's own looks are its lanes' and upkeep's
		Routes:       []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: sinks.NewDiscard("app")}}}},
		Observer:     watch,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rl.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	const wakeBound = time.Second
	for round := range 3 {
		select {
		case <-watch.quietIdle: // stale: the look to commit after is the next
		default:
		}
		select {
		case <-watch.quietIdle: // a look of the relay's own just ended
		case <-ctx.Done():
			t.Fatalf("round %d: the relay never went idle", round)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := writer.EnqueueSQL(ctx, tx, outbox.Event{Topic: "orders.paid", Key: "o-1", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		rl.Wake()
		select {
		case at := <-watch.published:
			if took := at.Sub(committed); took > wakeBound {
				t.Fatalf("round %d: published %s after the commit and Wake, want within %s", round, took, wakeBound)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: never published", round)
		}
	}
}
