package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/relay/internal/store"
)

// A relay whose lanes were taken over must not record its batch: the new
// owner delivers those events again. Every write is fenced by lane,
// deliveries included, and a record in flight keeps its lanes from being
// taken over until it commits.
func TestRecordIsFencedByLanes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seqs := b.insert(t, ev{"t", "a"}, ev{"t", "b"}, ev{"t", ""})
	old := b.relay(t, "old-relay")
	if _, _, err := old.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	rows, _, err := old.claim(ctx, 10, "")
	if err != nil || len(rows) != 3 {
		t.Fatalf("claimed %d rows: %v", len(rows), err)
	}
	// The lease runs out (set in the past rather than waited for).
	if _, err := b.db.Exec("UPDATE " + b.tables.Lanes() + " SET lease_until = utc_timestamp(6) - INTERVAL 1 SECOND"); err != nil {
		t.Fatal(err)
	}

	// While a record holds the old relay's lanes, they cannot be taken.
	next := b.relay(t, "new-relay")
	err = old.inTx(ctx, func(tx *sql.Tx) error {
		if _, _, err := old.Store.record(ctx, tx, old.owner, &store.Outcome{OutboxSeqs: seqs[:1], Fence: old.leases}, false, false); err != nil {
			return err
		}
		if held, _, err := next.takeLanes(ctx, time.Hour); err != nil || held != 0 {
			return fmt.Errorf("took lanes %064b (%v) while the old relay was recording on them", held, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d rows left after the old relay recorded one on its lanes, want 2", n)
	}

	// Once the lanes are taken over, the old relay's records change nothing.
	held, takenOver, err := next.takeLanes(ctx, time.Hour)
	if err != nil || held != ^uint64(0) || takenOver != ^uint64(0) {
		t.Fatalf("new relay holds %064b, took over %064b: %v", held, takenOver, err)
	}
	if rec, err := old.recordAll(ctx, &store.Outcome{OutboxSeqs: seqs[1:]}); !errors.Is(err, store.ErrFenced) || rec.Left != nil || rec.Fenced != old.leases.Mask {
		t.Fatalf("the old relay's record left %v, fenced %064b (%v), want nothing left and every lane fenced", rec.Left, rec.Fenced, err)
	}
	retry := &store.Outcome{OutboxSeqs: seqs[1:]}
	retry.FromOutbox.Add(seqs[2], "mem", store.Ready, false, 1, time.Hour, boom)
	if _, err := old.record(ctx, retry); !errors.Is(err, store.ErrFenced) {
		t.Fatal(err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d of 2 rows left after records by a relay that lost their lanes", n)
	}
	if n := b.countDeliveries(t, "true"); n != 0 {
		t.Fatalf("%d deliveries written by a relay that lost their lanes", n)
	}

	// The happy path deletes without locking the rows first: its DELETE is
	// fenced by itself. With key b's lane released, only c's row goes.
	c := b.insert(t, ev{"t", "c"})[0]
	lane := func(seq int64) (lane uint) {
		if err := b.db.QueryRow("SELECT lane FROM "+b.tables.Outbox()+" WHERE seq = ?", seq).Scan(&lane); err != nil {
			t.Fatal(err)
		}
		return lane
	}
	if lane(seqs[1]) == lane(c) {
		t.Fatalf("keys b and c share lane %d: the check needs two lanes", lane(c))
	}
	if err := next.Store.ReleaseLanes(ctx, next.owner, 1<<lane(seqs[1])); err != nil {
		t.Fatal(err)
	}
	if rec, err := next.recordAll(ctx, &store.Outcome{OutboxSeqs: []int64{seqs[1], c}}); err != nil || rec.Left != nil || rec.Fenced != 1<<lane(seqs[1]) {
		t.Fatalf("a happy record with a row on a lane released left %v, fenced %064b (%v), want lane %d fenced", rec.Left, rec.Fenced, err, lane(seqs[1]))
	}
	if n := b.count(t, fmt.Sprint("seq = ", c)); n != 0 {
		t.Fatalf("c's row on a lane held is still there")
	}
	if held, _, err := next.takeLanes(ctx, time.Hour); err != nil || held != ^uint64(0) {
		t.Fatalf("new relay holds %064b after taking its lane back: %v", held, err)
	}

	// The new owner's deliveries are its own too.
	failed := &store.Outcome{OutboxSeqs: seqs[1:], OutboxKeys: []string{"b", ""}}
	failed.FromOutbox.Add(seqs[1], "mem", store.Ready, false, 1, time.Hour, boom)
	if left, err := next.record(ctx, failed); err != nil || left != nil {
		t.Fatalf("the new owner's record left %v: %v", left, err)
	}
	if n := b.countDeliveries(t, "state = 'ready' AND attempts = 1"); n != 1 {
		t.Fatalf("%d deliveries after the new owner recorded one, want 1", n)
	}
	stale := &store.Outcome{}
	stale.Delete("mem", seqs[1])
	stale.Demote.Add(seqs[1], "mem", store.Dead, false, 2, 0, boom)
	stale.Heads.Add(seqs[1], "mem", store.Ready, false, 3, 0, boom)
	stale.PromoteKeys, stale.PromoteSinks = []string{"b"}, []string{"mem"}
	if _, err := old.record(ctx, stale); !errors.Is(err, store.ErrFenced) {
		t.Fatal(err)
	}
	if n := b.countDeliveries(t, "state = 'ready' AND attempts = 1"); n != 1 {
		t.Fatalf("the old relay changed the new owner's delivery")
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d rows left after the new owner recorded them", n)
	}
}

// A record does not wait past the lock wait timeout on an outbox row another
// transaction holds locked (an operator's UPDATE left open): it records
// without it and returns it as left, and on a fan-out (which skips it at
// once) leaves the other rows of its key too.
func TestRecordSkipsLockedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if _, _, err := r.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	seqs := b.insert(t, ev{"t", "a"}, ev{"t", "a"}, ev{"t", "b"}, ev{"t", "c"})
	op, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Rollback()
	if _, err := op.ExecContext(ctx, "UPDATE "+b.tables.Outbox()+" SET max_attempts = 3 WHERE seq = ?", seqs[0]); err != nil {
		t.Fatal(err)
	}

	// A fan-out: a's first row is held, so a's second stays; b fails on
	// sink s, c goes.
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"a", "a", "b", "c"}}
	o.FromOutbox.Add(seqs[1], "s", store.Ready, false, 1, 0, boom)
	o.FromOutbox.Add(seqs[2], "s", store.Ready, false, 1, 0, boom)
	left, err := r.record(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, seqs[:2]) {
		t.Fatalf("left %v, want a's rows %v", left, seqs[:2])
	}
	if n := b.countDeliveries(t, "true"); n != 1 || b.countDeliveries(t, fmt.Sprint("seq = ", seqs[2])) != 1 {
		t.Fatalf("%d deliveries, want b's alone", n)
	}

	// The happy path waits for the held row up to the lock wait timeout
	// (a second, Configure), then leaves only it.
	left, err = r.record(ctx, &store.Outcome{OutboxSeqs: seqs[:2]})
	if err != nil || !slices.Equal(left, seqs[:1]) {
		t.Fatalf("happy record left %v (%v), want %v", left, err, seqs[:1])
	}
	if err := op.Rollback(); err != nil {
		t.Fatal(err)
	}
	if left, err := r.record(ctx, &store.Outcome{OutboxSeqs: seqs[:1]}); err != nil || left != nil {
		t.Fatalf("record after the operator's rollback left %v: %v", left, err)
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d outbox rows left", n)
	}
}

// The queue outcomes: a delivered head is removed and the next delivery of
// its queue promoted; a failed head gets its next attempt or dies (stopping
// its key or not); the routing step's delivery is routed to a sink; a head
// inserted where the queue already has one waits instead.
func TestRecordQueueOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if _, _, err := r.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	state := func(sink string, seq int64) string {
		t.Helper()
		var st string
		var stops bool
		var attempts int
		var next, dead sql.NullTime
		var lastErr sql.NullString
		err := b.db.QueryRow("SELECT state, stops_key, attempts, next_at, dead_at, last_error FROM "+b.tables.Deliveries()+
			" WHERE sink = ? AND seq = ?", sink, seq).Scan(&st, &stops, &attempts, &next, &dead, &lastErr)
		if errors.Is(err, sql.ErrNoRows) {
			return "gone"
		}
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%s stops=%v attempts=%d next=%v dead=%v err=%s", st, stops, attempts, next.Valid, dead.Valid, lastErr.String)
	}
	seqs := b.insert(t, ev{"t", "k"}, ev{"t", "k"}, ev{"t", "j"})
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k", "k", "j"}}
	o.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, 0, boom)
	o.FromOutbox.Add(seqs[1], "s", store.Waiting, false, 0, 0, nullString)
	o.FromOutbox.Add(seqs[2], "", store.Ready, false, 0, 0, nullString)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	// A later event recorded as a second head for k on s (the engine
	// claimed it before k's queue existed): the database makes it wait.
	seqs = append(seqs[:2], b.insert(t, ev{"t", "k"})[0], seqs[2])
	o = &store.Outcome{OutboxSeqs: seqs[2:3], OutboxKeys: []string{"k"}}
	o.FromOutbox.Add(seqs[2], "s", store.Ready, false, 0, 0, nullString)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sink string
		seq  int64
		want string
	}{{"s", seqs[0], "ready stops=false attempts=1 next=true dead=false err=boom"},
		{"s", seqs[1], "waiting stops=false attempts=0 next=false dead=false err="},
		{"s", seqs[2], "waiting stops=false attempts=0 next=false dead=false err="},
		{"", seqs[3], "ready stops=false attempts=0 next=true dead=false err="}} {
		if got := state(c.sink, c.seq); got != c.want {
			t.Fatalf("after the fan-out, %q:%d is %s, want %s", c.sink, c.seq, got, c.want)
		}
	}

	// k's head delivered: removed, the next promoted. j routed to s and t.
	o = &store.Outcome{PromoteKeys: []string{"k", "j"}, PromoteSinks: []string{"s", ""}}
	o.Delete("s", seqs[0])
	o.Delete("", seqs[3])
	o.FromRouting.Add(seqs[3], "s", store.Ready, false, 0, 0, nullString)
	o.FromRouting.Add(seqs[3], "t", store.Dead, true, 5, 0, boom)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sink string
		seq  int64
		want string
	}{{"s", seqs[0], "gone"},
		{"s", seqs[1], "ready stops=false attempts=0 next=true dead=false err="},
		{"s", seqs[2], "waiting stops=false attempts=0 next=false dead=false err="},
		{"", seqs[3], "gone"},
		{"s", seqs[3], "ready stops=false attempts=0 next=true dead=false err="},
		{"t", seqs[3], "dead stops=true attempts=5 next=false dead=true err=boom"}} {
		if got := state(c.sink, c.seq); got != c.want {
			t.Fatalf("after delivering the head, %q:%d is %s, want %s", c.sink, c.seq, got, c.want)
		}
	}

	// k's new head fails for good without stopping its key (demoted to a
	// dead letter), the next promoted; then that one is retried later.
	o = &store.Outcome{PromoteKeys: []string{"k"}, PromoteSinks: []string{"s"}}
	o.Demote.Add(seqs[1], "s", store.Dead, false, 3, 0, boom)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	if got := state("s", seqs[1]); got != "dead stops=false attempts=3 next=false dead=true err=boom" {
		t.Fatalf("the dead letter is %s", got)
	}
	if got := state("s", seqs[2]); !strings.HasPrefix(got, "ready ") {
		t.Fatalf("the next delivery after a dead letter is %s, want ready", got)
	}
	o = &store.Outcome{}
	o.Heads.Add(seqs[2], "s", store.Ready, false, 1, time.Hour, boom)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	if got := state("s", seqs[2]); got != "ready stops=false attempts=1 next=true dead=false err=boom" {
		t.Fatalf("the retried head is %s", got)
	}
	_, queued, err := r.claim(ctx, 10, "s")
	if err != nil || len(queued) != 1 || queued[0].Seq != seqs[3] {
		t.Fatalf("claimed %s (%v), want only j's delivery: k's head is due in an hour", seqsOf(queued), err)
	}

	// Heads is where the database has the last word too: a head written
	// while its queue has another (a replayed dead letter) waits.
	if _, err := b.db.Exec("UPDATE "+b.tables.Deliveries()+" SET state = 'ready', next_at = utc_timestamp(6), dead_at = NULL WHERE sink = 's' AND seq = ?", seqs[1]); err == nil {
		t.Fatal("two heads for one queue: the unique head index let them")
	}
	if _, err := b.db.Exec("UPDATE "+b.tables.Deliveries()+" SET state = 'waiting', next_at = NULL WHERE sink = 's' AND seq = ?", seqs[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec("UPDATE "+b.tables.Deliveries()+" SET state = 'ready', next_at = utc_timestamp(6), dead_at = NULL WHERE sink = 's' AND seq = ?", seqs[1]); err != nil {
		t.Fatal(err)
	}
	o = &store.Outcome{}
	o.Heads.Add(seqs[2], "s", store.Ready, false, 2, 0, boom)
	if _, err := r.record(ctx, o); err != nil {
		t.Fatal(err)
	}
	if got := state("s", seqs[2]); got != "waiting stops=false attempts=2 next=false dead=false err=boom" {
		t.Fatalf("a head written behind another is %s, want waiting", got)
	}
}

// The database refusing a record's data is a *store.DataError, and the
// transaction leaves nothing behind.
func TestRecordDataError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if _, _, err := r.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	seqs := b.insert(t, ev{"t", "k"}, ev{"t", "j"})
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k", "j"}}
	o.FromOutbox.Add(seqs[0], strings.Repeat("s", 300), store.Ready, false, 1, 0, boom)
	_, err := r.record(ctx, o)
	var de *store.DataError
	var me *gomysql.MySQLError
	if !errors.As(err, &de) || !errors.As(err, &me) {
		t.Fatalf("a sink name too long for its column: %v, want a DataError wrapping the server's error", err)
	}
	if n := b.count(t, "true"); n != 2 {
		t.Fatalf("%d outbox rows after a refused record, want 2", n)
	}
}

// keepDone marks rows done instead of deleting them; PurgeDone removes the
// old ones, oldest first, at most a limit at a time.
func TestKeepDoneAndPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if _, _, err := r.takeLanes(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	seqs := b.insert(t, ev{"t", "a"}, ev{"t", "b"}, ev{"t", "c"}, ev{"t", "d"})
	if _, err := r.Record(ctx, r.owner, &store.Outcome{OutboxSeqs: seqs, Fence: r.leases}, true); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "status = 'done' AND finished_at IS NOT NULL"); n != 4 {
		t.Fatalf("%d rows done, want 4", n)
	}
	if fresh, _, err := r.claim(ctx, 10); err != nil || len(fresh) != 0 {
		t.Fatalf("claimed %d done rows (%v)", len(fresh), err)
	}
	if _, err := b.db.Exec("UPDATE "+b.tables.Outbox()+" SET finished_at = utc_timestamp(6) - INTERVAL 2 HOUR + INTERVAL seq SECOND WHERE seq <= ?", seqs[2]); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PurgeDone(ctx, time.Hour, 2); err != nil || n != 2 {
		t.Fatalf("purged %d (%v), want 2", n, err)
	}
	if n := b.count(t, fmt.Sprint("seq IN (", seqs[2], ", ", seqs[3], ")")); n != 2 {
		t.Fatalf("the purge did not remove the oldest first")
	}
	if n, err := r.PurgeDone(ctx, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("purged %d (%v), want the last old one", n, err)
	}
}
