package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRollingRouteChange covers relays with different routes sharing a
// table, as in a rolling deploy that adds a sink: events claimed by the
// relay still on the old routes never reached the new sink. Only relays with
// the newest configuration claim: once the new relay has announced itself,
// the old one claims nothing (it says so in Superseded and gives up its
// lanes), every event written after that reaches the new sink, and every
// event reaches the sink both configurations name.
//
// PostgreSQL only: it reads announcements with clock_timestamp().
func TestRollingRouteChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	oldRec, newRec := newRecorder(), newRecorder()

	oldCfg := b.config(t, &testSink{name: "a", rec: oldRec})
	oldCfg.Owner = "old"
	old, err := NewPostgres(b.pool, oldCfg)
	if err != nil {
		t.Fatal(err)
	}
	oldCtx, stopOld := context.WithCancel(ctx)
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Run(oldCtx) }()
	defer func() {
		stopOld()
		if err := <-oldDone; err != nil {
			t.Errorf("old relay: %v", err)
		}
	}()

	// A producer commits events all along, one per transaction, and keeps
	// each one's insert time (available_at's default).
	stopProducing, produced := make(chan struct{}), make(chan error, 1)
	written := map[string]time.Time{}
	var inserts atomic.Int64
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				produced <- nil
				return
			case <-time.After(2 * time.Millisecond):
			}
			var id string
			var at time.Time
			if err := b.pool.QueryRow(ctx, "INSERT INTO "+b.tables.Outbox()+" (topic, key) VALUES ('t', $1) RETURNING id::text, available_at",
				fmt.Sprint("k", i%20)).Scan(&id, &at); err != nil {
				produced <- err
				return
			}
			written[id] = at
			inserts.Add(1)
		}
	}()
	waitFor(t, time.Minute, "the old relay delivering", func() bool { return len(oldRec.all()) >= 50 })
	if !old.Superseded().IsZero() {
		t.Fatal("the only relay says it is superseded")
	}

	newCfg := b.config(t, &testSink{name: "a", rec: newRec}, &testSink{name: "b", rec: newRec})
	newCfg.Owner = "new"
	b.start(t, newCfg)
	// The moment the test sees the new relay's announcement committed:
	// every claim that starts later sees it too.
	var announced time.Time
	waitFor(t, time.Minute, "the new relay announced", func() bool {
		err := b.pool.QueryRow(ctx, "SELECT clock_timestamp() FROM "+b.tables.Relays()+" WHERE owner LIKE 'new%' LIMIT 1").Scan(&announced)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		return err == nil
	})
	waitFor(t, time.Minute, "the old relay superseded, holding no lane", func() bool {
		var held int
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.tables.Lanes()+" WHERE owner LIKE 'old%'").Scan(&held); err != nil {
			t.Fatal(err)
		}
		return held == 0 && !old.Superseded().IsZero()
	})
	// At least 50 events written after the announcement (one insert may
	// have been under way when the test saw it), however slowly a loaded
	// machine lets the producer write.
	since := inserts.Load()
	waitFor(t, time.Minute, "50 events written after the announcement", func() bool { return inserts.Load() >= since+51 })
	waitFor(t, time.Minute, "the new relay delivering to b", func() bool { return len(newRec.forSink("b")) >= 50 })
	close(stopProducing)
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "every event delivered", func() bool {
		return b.count(t, "true") == 0 && b.countDeliveries(t, "true") == 0
	})

	byOld, toA, toB := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, r := range oldRec.all() {
		byOld[r.id], toA[r.id] = true, true
	}
	for _, r := range newRec.all() {
		if r.sink == "a" {
			toA[r.id] = true
		} else {
			toB[r.id] = true
		}
	}
	after := 0
	for id, at := range written { // the producer has stopped
		if !toA[id] {
			t.Errorf("event %s never reached sink a", id)
		}
		if !at.After(announced) {
			continue
		}
		after++
		if byOld[id] {
			t.Errorf("event %s, written after the new configuration was announced, was published by the old relay", id)
		}
		if !toB[id] {
			t.Errorf("event %s, written after the new configuration was announced, never reached the new sink b", id)
		}
	}
	if after < 50 {
		t.Fatalf("only %d events written after the announcement; the test proves nothing", after)
	}
}
