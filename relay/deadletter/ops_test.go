package deadletter_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// TestReplayRejoinsQueues replays dead letters into the queues the relay
// left, without a relay: each becomes its queue's head when the queue has
// none, and waits behind the head otherwise.
func TestReplayRejoinsQueues(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		// k1 on hook: a dead letter stopping the key, two deliveries behind
		// it. On mail, k1 is stopped too (not replayed: the filter says hook).
		d1 := tb.newEvent(t, "t", "k1")
		tb.put(t, d1, delivery{sink: "hook", stops: true, attempts: 3, lastError: "HTTP 500"},
			delivery{sink: "mail", stops: true, lastError: "550"})
		w2, w3 := tb.newEvent(t, "t", "k1"), tb.newEvent(t, "t", "k1")
		tb.put(t, w2, delivery{sink: "hook", state: "waiting"}, delivery{sink: "mail", state: "waiting"})
		tb.put(t, w3, delivery{sink: "hook", state: "waiting"})
		// k2 on hook: an earlier dead letter that did not stop the key, and a
		// head due later (a retry), a later dead letter, and one waiting.
		early := tb.dead(t, "t", "k2", "hook")
		h := tb.newEvent(t, "t", "k2")
		tb.put(t, h, delivery{sink: "hook", state: "ready", attempts: 1})
		tb.dueIn(t, h, "hook", time.Hour)
		late := tb.dead(t, "t", "k2", "hook")
		// k3 on hook: two dead letters, no queue left: the first leads.
		x1, x2 := tb.dead(t, "t", "k3", "hook"), tb.dead(t, "t", "k3", "hook")
		// No key: due at once.
		free := tb.dead(t, "t", "", "hook")

		res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "hook"}, deadletter.ReplayOpts{})
		if err != nil || res.Count != 6 || res.Missing != nil {
			t.Fatalf("Replay = %+v, %v", res, err)
		}
		for _, c := range []struct {
			what string
			e    *event
			sink string
			want row
		}{
			{"k1's stopping dead letter", d1, "hook", ready},
			{"k1's first follower", w2, "hook", waiting},
			{"k1's second follower", w3, "hook", waiting},
			{"k1 on mail, not selected", d1, "mail", row{state: "dead", stops: true, err: true, died: true}},
			{"k1's follower on mail", w2, "mail", waiting},
			{"k2's early dead letter, into a queue with a head", early, "hook", waiting},
			{"k2's head, due later", h, "hook", row{state: "ready", attempts: 1}},
			{"k2's late dead letter", late, "hook", waiting},
			{"k3's first dead letter", x1, "hook", ready},
			{"k3's second dead letter", x2, "hook", waiting},
			{"a dead letter without a key", free, "hook", ready},
		} {
			if got := tb.row(t, c.e, c.sink); got != c.want {
				t.Errorf("%s: %v, want %v", c.what, got, c.want)
			}
		}
		tb.checkHeads(t)
		// Nothing dead is left on hook.
		if res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "hook", IDs: []string{d1.id}}, deadletter.ReplayOpts{}); err != nil || res.Count != 0 || !slices.Equal(res.Missing, []string{d1.id}) {
			t.Fatalf("second replay = %+v, %v", res, err)
		}
	})
}

// TestReplayMissing reports the requested ids that matched nothing.
func TestReplayMissing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	e := tb.dead(t, "t", "", "hook", "mail")
	missing := "0190a0b0-0000-7000-8000-000000000000"
	res, err := tb.store.Replay(context.Background(), deadletter.Filter{IDs: []string{e.id, missing}}, deadletter.ReplayOpts{})
	if err != nil || res.Count != 2 || !slices.Equal(res.Missing, []string{missing}) {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
}

// TestPurgeMovesKeyOn: purging a dead letter that stops its key makes the
// next delivery waiting behind it the head; purging one that did not stop
// its key leaves its queue alone.
func TestPurgeMovesKeyOn(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		d1 := tb.dead(t, "t", "k1", "mail")
		tb.put(t, d1, delivery{sink: "hook", stops: true, diedAgo: 2 * time.Hour})
		w2, w3 := tb.newEvent(t, "t", "k1"), tb.newEvent(t, "t", "k1")
		tb.put(t, w2, delivery{sink: "hook", state: "waiting"})
		tb.put(t, w3, delivery{sink: "hook", state: "waiting"})
		h := tb.newEvent(t, "t", "k2")
		tb.put(t, h, delivery{sink: "hook", state: "ready"})
		tb.dueIn(t, h, "hook", time.Hour)
		d4 := tb.newEvent(t, "t", "k2")
		tb.put(t, d4, delivery{sink: "hook", diedAgo: 2 * time.Hour})
		young := tb.dead(t, "t", "k3", "hook")

		res, err := tb.store.Purge(ctx, deadletter.Filter{Sink: "hook", OlderThan: time.Hour}, deadletter.PurgeOpts{})
		if err != nil || res.Count != 2 {
			t.Fatalf("Purge = %+v, %v", res, err)
		}
		for _, c := range []struct {
			what string
			e    *event
			sink string
			want row
		}{
			{"the purged stopping dead letter", d1, "hook", row{state: "gone"}},
			{"its dead letter on mail, not selected", d1, "mail", row{state: "dead", err: true, died: true}},
			{"k1's first follower", w2, "hook", ready},
			{"k1's second follower", w3, "hook", waiting},
			{"k2's head, due later", h, "hook", row{state: "ready"}},
			{"k2's purged dead letter", d4, "hook", row{state: "gone"}},
			{"a dead letter too young", young, "hook", row{state: "dead", err: true, died: true}},
		} {
			if got := tb.row(t, c.e, c.sink); got != c.want {
				t.Errorf("%s: %v, want %v", c.what, got, c.want)
			}
		}
		tb.checkHeads(t)
	})
}

// TestReplayAllSinksRows: with AllSinks, an event's dead letters give way
// to one delivery on the routing step, which joins its key's queue there.
func TestReplayAllSinksRows(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		// e is dead on hook (stopping k1, with a delivery behind it) and on
		// mail; only hook is selected, but both dead letters go.
		e := tb.newEvent(t, "t", "k1")
		tb.put(t, e, delivery{sink: "hook", stops: true}, delivery{sink: "mail"})
		behind := tb.newEvent(t, "t", "k1")
		tb.put(t, behind, delivery{sink: "hook", state: "waiting"})
		// queued is dead on hook but still waits on mail: it cannot go through
		// the routing step, its dead letter is replayed on hook.
		queued := tb.newEvent(t, "t", "k2")
		tb.put(t, queued, delivery{sink: "hook"}, delivery{sink: "mail", state: "ready"})
		// later's key already has a head on the routing step: it waits there.
		first := tb.newEvent(t, "t", "k3")
		tb.put(t, first, delivery{sink: "", state: "ready"})
		later := tb.dead(t, "t", "k3", "hook")
		// routing died before any sink; it is not on hook.
		routing := tb.dead(t, "t", "", "")

		res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "hook"}, deadletter.ReplayOpts{AllSinks: true})
		if err != nil || res.Count != 3 {
			t.Fatalf("Replay = %+v, %v", res, err)
		}
		res, err = tb.store.Replay(ctx, deadletter.Filter{IDs: []string{routing.id}}, deadletter.ReplayOpts{AllSinks: true})
		if err != nil || res.Count != 1 {
			t.Fatalf("Replay of the routing step's dead letter = %+v, %v", res, err)
		}
		for _, c := range []struct {
			what string
			e    *event
			sink string
			want row
		}{
			{"e on the routing step", e, "", ready},
			{"e's dead letter on hook", e, "hook", row{state: "gone"}},
			{"e's dead letter on mail", e, "mail", row{state: "gone"}},
			{"the delivery behind e on hook", behind, "hook", ready},
			{"queued, replayed on hook", queued, "hook", ready},
			{"queued on mail", queued, "mail", ready},
			{"queued on the routing step", queued, "", row{state: "gone"}},
			{"later on the routing step", later, "", waiting},
			{"later's dead letter", later, "hook", row{state: "gone"}},
			{"the routing step's own dead letter, reused", routing, "", ready},
		} {
			if got := tb.row(t, c.e, c.sink); got != c.want {
				t.Errorf("%s: %v, want %v", c.what, got, c.want)
			}
		}
		tb.checkHeads(t)
		// The copy on the routing step is the event.
		got, err := tb.store.Show(ctx, e.id)
		if err != nil || got.Topic != "t" || got.Key != "k1" || string(got.Payload) != `{"n": 1}` || len(got.Deliveries) != 1 || got.Status != "queued" {
			t.Fatalf("Show = %+v, %v", got, err)
		}
	})
}

// TestReplayNotifies: relays listening on the outbox's channel are woken
// by a replay and a purge.
func TestReplayNotifies(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	conn, err := tb.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+tb.tables.ChannelIdent()); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "UNLISTEN *") //nolint:errcheck // the connection goes back to the pool
	e := tb.dead(t, "t", "k", "hook")
	for _, op := range []string{"replay", "purge"} {
		if op == "replay" {
			_, err = tb.store.Replay(ctx, deadletter.Filter{IDs: []string{e.id}}, deadletter.ReplayOpts{})
		} else {
			tb.exec(t, "UPDATE "+tb.tables.Deliveries()+" SET state = 'dead', next_at = NULL, dead_at = now() WHERE seq = $1", e.seq)
			_, err = tb.store.Purge(ctx, deadletter.Filter{IDs: []string{e.id}}, deadletter.PurgeOpts{})
		}
		if err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(waitCtx)
		cancel()
		if err != nil || n.Channel != tb.tables.Channel() {
			t.Fatalf("%s: no notification on %s: %v", op, tb.tables.Channel(), err)
		}
	}
}

// TestReplayWaitsForRecordInFlight: a relay records a batch holding its
// lanes in share mode. A replay of a dead letter of a lane in that state
// waits for the record to commit, then sees what it wrote. Here the record
// delivered the head of the key's queue: the replayed dead letter must
// become the head. Had the replay not waited, it would have seen the old
// head, made the dead letter wait behind it, and left it waiting for good
// once the record committed.
func TestReplayWaitsForRecordInFlight(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	d := tb.dead(t, "t", "k", "hook")
	h := tb.newEvent(t, "t", "k")
	tb.put(t, h, delivery{sink: "hook", state: "ready"})

	// The record in flight: the lane held as a relay holds it, the head
	// delivered.
	record, err := tb.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer record.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := record.Exec(ctx, `SELECT lane FROM `+tb.tables.Lanes()+` WHERE lane = (SELECT lane FROM `+tb.tables.Deliveries()+` WHERE seq = $1) FOR SHARE`, h.seq); err != nil {
		t.Fatal(err)
	}
	if _, err := record.Exec(ctx, `DELETE FROM `+tb.tables.Deliveries()+` WHERE sink = 'hook' AND seq = $1`, h.seq); err != nil {
		t.Fatal(err)
	}

	replayed := make(chan error, 1)
	go func() {
		_, err := tb.store.Replay(ctx, deadletter.Filter{IDs: []string{d.id}}, deadletter.ReplayOpts{})
		replayed <- err
	}()
	waitFor(t, "the replay to wait for the lanes", func() bool {
		var n int
		err := tb.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%' AND query LIKE '%'||$1||'%'`, tb.tables.Schema).Scan(&n)
		return err == nil && n == 1
	})
	if err := record.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	if got := tb.row(t, d, "hook"); got != ready {
		t.Fatalf("the replayed dead letter: %v, want the head, due", got)
	}
	tb.checkHeads(t)
}

// TestBatches: a replay and a purge walk their dead letters in batches,
// each its own transaction, reporting the running total after each, and a
// list reads page after page.
func TestBatches(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		deadletter.SetBatchSize(tb.store, 3)
		var all []string
		for i := range 4 {
			e := tb.dead(t, "t", fmt.Sprintf("k%d", i%2), "hook", "mail")
			all = append(all, name(e, "hook"), name(e, "mail"))
		}
		slices.Sort(all)
		if got := names(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{})); !sameSet(got, all) || len(got) != 8 {
			t.Fatalf("listed %v, want %v", got, all)
		}
		var progress []int64
		res, err := tb.store.Replay(ctx, deadletter.Filter{Sink: "hook"}, deadletter.ReplayOpts{Progress: func(n int64) { progress = append(progress, n) }})
		if err != nil || res.Count != 4 || !slices.Equal(progress, []int64{3, 4}) {
			t.Fatalf("Replay = %+v, %v; progress %v", res, err, progress)
		}
		tb.checkHeads(t)
		progress = nil
		res, err = tb.store.Purge(ctx, deadletter.Filter{}, deadletter.PurgeOpts{Progress: func(n int64) { progress = append(progress, n) }})
		if err != nil || res.Count != 4 || !slices.Equal(progress, []int64{3, 4}) {
			t.Fatalf("Purge = %+v, %v; progress %v", res, err, progress)
		}
		if n, err := tb.store.Count(ctx, deadletter.Filter{}); err != nil || n != 0 {
			t.Fatalf("Count after the purge = %d, %v", n, err)
		}
		tb.checkHeads(t)
	})
}

// TestReplayChangesWhatWasPlanned: dead letters that die after a Plan
// counted them, or while a Replay or Purge runs, are left alone, so that
// the progress never passes what was counted (a dlq replay once printed
// "replayed 6/5 dead letters (120 %)" on MariaDB while the demo's webhook
// kept refusing events).
func TestReplayChangesWhatWasPlanned(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		deadletter.SetBatchSize(tb.store, 2)
		var planned []*event
		for i := range 4 {
			planned = append(planned, tb.dead(t, "orders", fmt.Sprintf("k%d", i), "hook"))
		}
		f, n, err := tb.store.Plan(ctx, deadletter.Filter{Sink: "hook"})
		if err != nil || n != 4 || f.Sink != "hook" || f.Until.IsZero() {
			t.Fatalf("Plan = %+v, %d, %v; want the filter fixed to 4 dead letters", f, n, err)
		}
		afterPlan := tb.dead(t, "orders", "late", "hook")
		var progress []int64
		var duringReplay *event
		res, err := tb.store.Replay(ctx, f, deadletter.ReplayOpts{Progress: func(done int64) {
			progress = append(progress, done)
			if duringReplay == nil {
				duringReplay = tb.dead(t, "orders", "during", "hook") // after every planned one in (seq, sink) order
			}
		}})
		if err != nil || res.Count != n || !slices.Equal(progress, []int64{2, 4}) {
			t.Fatalf("Replay of the plan = %+v, %v; progress %v, want 2 then 4 of %d", res, err, progress, n)
		}
		for _, e := range planned {
			if got := tb.row(t, e, "hook"); got.state == "dead" {
				t.Errorf("planned dead letter %d not replayed: %v", e.seq, got)
			}
		}
		for what, e := range map[string]*event{"died after the plan": afterPlan, "died during the replay": duringReplay} {
			if got := tb.row(t, e, "hook"); got.state != "dead" {
				t.Errorf("a dead letter that %s was replayed: %v", what, got)
			}
		}

		// Without a plan, a run fixes its own start: one that dies during a
		// purge is not purged by it.
		progress = nil
		var duringPurge *event
		res, err = tb.store.Purge(ctx, deadletter.Filter{Topic: "orders"}, deadletter.PurgeOpts{Progress: func(done int64) {
			progress = append(progress, done)
			if duringPurge == nil {
				duringPurge = tb.dead(t, "orders", "during-purge", "hook")
			}
		}})
		if err != nil || res.Count != 2 || !slices.Equal(progress, []int64{2}) {
			t.Fatalf("Purge = %+v, %v; progress %v, want the 2 dead before it", res, err, progress)
		}
		if got := tb.row(t, duringPurge, "hook"); got.state != "dead" {
			t.Errorf("a dead letter that died during the purge was purged: %v", got)
		}
		tb.checkHeads(t)
	})
}

// TestReplayWaitsForRecordInFlightMySQL is TestReplayWaitsForRecordInFlight
// on MySQL, where a record share-locks its lanes (LOCK IN SHARE MODE).
func TestReplayWaitsForRecordInFlightMySQL(t *testing.T) {
	t.Parallel()
	tb := setupMySQL(t)
	ctx := context.Background()
	d := tb.dead(t, "t", "k", "hook")
	h := tb.newEvent(t, "t", "k")
	tb.put(t, h, delivery{sink: "hook", state: "ready"})

	// The record in flight: the lane held as a relay holds it, the head
	// delivered.
	record, err := tb.my.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer record.Rollback() //nolint:errcheck // committed below
	rows, err := record.Query(`SELECT lane FROM `+tb.mt.Lanes()+` WHERE lane = (SELECT lane FROM `+tb.mt.Deliveries()+` WHERE sink = 'hook' AND seq = ?) LOCK IN SHARE MODE`, h.seq)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if _, err := record.Exec(`DELETE FROM `+tb.mt.Deliveries()+` WHERE sink = 'hook' AND seq = ?`, h.seq); err != nil {
		t.Fatal(err)
	}

	// The replay's store waits for a lock up to a minute, not the relay's
	// second: the test sees it wait however loaded the machine.
	patient, err := relay.OpenMySQL(tb.myURL+"?innodb_lock_wait_timeout=60", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer patient.Close()
	store, err := deadletter.NewMySQL(patient, tb.tables)
	if err != nil {
		t.Fatal(err)
	}
	replayed := make(chan error, 1)
	go func() {
		_, err := store.Replay(ctx, deadletter.Filter{IDs: []string{d.id}}, deadletter.ReplayOpts{})
		replayed <- err
	}()
	waitFor(t, "the replay to wait for the lanes", func() bool {
		var n int
		// The replay's statement runs (waits) on its connection; this
		// query's own text matches the pattern too.
		err := tb.my.QueryRow(`SELECT count(*) FROM information_schema.processlist
WHERE db = database() AND id <> connection_id() AND info LIKE '%ORDER BY lane FOR UPDATE%'`).Scan(&n)
		select {
		case err := <-replayed:
			t.Fatalf("the replay did not wait for the record: %v", err)
		default:
		}
		return err == nil && n == 1
	})
	if err := record.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	if got := tb.row(t, d, "hook"); got != ready {
		t.Fatalf("the replayed dead letter: %v, want the head, due", got)
	}
	tb.checkHeads(t)
}
