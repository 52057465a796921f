// Package storetest is the conformance suite of the relay engine's stores:
// every store.Store and store.Operator runs the same cases against its real
// database, and the queues' invariant is checked after each. Adding a store
// means implementing both interfaces and passing Run (its package's test
// calls it with a Harness that opens a database of the test's own).
package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Harness connects the suite to one store and its database.
type Harness struct {
	// Open returns a database of the calling test's own, with the relay's
	// schema, dropped when the test ends.
	Open func(t *testing.T) DB
}

// DB is a test's database, as the suite reaches it.
type DB interface {
	// Store returns a store on the database, on a pool of its own
	// configured as a relay's.
	Store(t *testing.T) store.Store
	// Operator returns the operators' store on the database, on a pool
	// of its own.
	Operator(t *testing.T) store.Operator
	// Insert commits one transaction of events with plain SQL, as any
	// application would, and returns their seqs in order.
	Insert(t *testing.T, evs ...Event) []int64
	// Count counts the rows of the outbox ("outbox") or of the deliveries
	// ("deliveries") that match where, SQL both dialects read alike.
	Count(t *testing.T, table, where string) int
	// Now is the SQL of the database's clock, as the store compares it.
	Now() string
	// ExpireLeases ends every lane's lease now, as if their owners had
	// stopped renewing them a lease ago.
	ExpireLeases(t *testing.T)
}

// Event is an event to insert.
type Event struct{ Topic, Key string }

// Run runs the suite as subtests of t.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"ClaimAndRecord", claimAndRecord},
		{"RecordIsFencedByLease", recordIsFencedByLease},
		{"StaleOutcomeAfterLanesComeBack", staleOutcomeAfterLanesComeBack},
		{"FencedRecordIsNotALockedRow", fencedRecordIsNotALockedRow},
		{"KeepDoneAndPurge", keepDoneAndPurge},
		{"QueueHeadsAndPromotion", queueHeadsAndPromotion},
		{"QueueClaimSharesRowsBetweenHeads", queueClaimSharesRowsBetweenHeads},
		{"QueueClaimBoundsChains", queueClaimBoundsChains},
		{"DelaysRunOnTheDatabaseClock", delaysRunOnTheDatabaseClock},
		{"HeadInsertedWhereOneIsWaits", headInsertedWhereOneIsWaits},
		{"ClaimFromAPosition", claimFromAPosition},
		{"ReplayRejoinsTheQueue", replayRejoinsTheQueue},
		{"PurgeLetsTheKeyMoveOn", purgeLetsTheKeyMoveOn},
		{"ReplayThroughTheRoutingStep", replayThroughTheRoutingStep},
		{"QueueDrop", queueDrop},
		{"OperatorRacesRecords", operatorRacesRecords},
		{"QueuedSinksOfKeys", queuedSinksOfKeys},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := &suite{t: t, db: h.Open(t), ctx: context.Background()}
			c.run(t, s)
			s.checkInvariant()
		})
	}
}

// suite is one case's world.
type suite struct {
	t   *testing.T
	db  DB
	ctx context.Context
}

// relay is one relay (owner) on its own store, driven step by step.
type relay struct {
	s      *suite
	st     store.Store
	owner  string
	leases store.Leases
}

func (s *suite) relay(owner string) *relay {
	return &relay{s: s, st: s.db.Store(s.t), owner: owner}
}

// takeLanes announces the relay and takes every free lane (those of an
// owner whose lease ran out included), as the only live relay does; it
// returns the lanes taken over.
func (r *relay) takeLanes(lease time.Duration) (takenOver uint64) {
	r.s.t.Helper()
	v, err := r.st.Renew(r.s.ctx, r.owner, "", lease, nil)
	if err != nil {
		r.s.t.Fatalf("%s: renewing: %v", r.owner, err)
	}
	acquired, over, err := r.st.AcquireLanes(r.s.ctx, r.owner, lease, 0, store.Lanes-1)
	if err != nil {
		r.s.t.Fatalf("%s: acquiring lanes: %v", r.owner, err)
	}
	r.leases = v.Held
	for lane := range store.Lanes {
		if acquired.Mask&(1<<uint(lane)) != 0 {
			r.leases.Add(lane, acquired.Epochs[lane])
		}
	}
	return over
}

// claim claims from every lane held, at most rows outbox rows and, from
// each queue sink, rows deliveries over at most heads heads.
func (r *relay) claim(rows, heads int, queueSinks ...string) (fresh, queued []store.Claimed) {
	r.s.t.Helper()
	return r.claimChains(rows, heads, rows, queueSinks...)
}

// claimChains is claim with at most chain rows a head.
func (r *relay) claimChains(rows, heads, chain int, queueSinks ...string) (fresh, queued []store.Claimed) {
	r.s.t.Helper()
	p := store.ClaimParams{Lanes: r.leases.Mask, Rows: rows, Bytes: 32 << 20, EventBytes: 16 << 20}
	for _, sink := range queueSinks {
		p.QueueSinks = append(p.QueueSinks, sink)
		p.QueueHeads = append(p.QueueHeads, int32(heads))
		p.QueueRows = append(p.QueueRows, int32(rows))
		p.QueueChain = append(p.QueueChain, int32(chain))
	}
	fresh, queued, err := r.st.Claim(r.s.ctx, p)
	if err != nil {
		r.s.t.Fatalf("%s: claiming: %v", r.owner, err)
	}
	return fresh, queued
}

// record records o under the leases the relay holds, unless o has a fence.
func (r *relay) record(o *store.Outcome, keepDone bool) (store.Recorded, error) {
	if o.Fence.Mask == 0 {
		o.Fence = r.leases
	}
	return r.st.Record(r.s.ctx, r.owner, o, keepDone)
}

// mustRecord records o and fails the test on any error.
func (r *relay) mustRecord(o *store.Outcome) store.Recorded {
	r.s.t.Helper()
	rec, err := r.record(o, false)
	if err != nil {
		r.s.t.Fatalf("%s: recording: %v", r.owner, err)
	}
	return rec
}

var boom = sql.NullString{String: "boom", Valid: true}

func (s *suite) count(table, where string) int { s.t.Helper(); return s.db.Count(s.t, table, where) }

// want fails unless count(table, where) is n.
func (s *suite) want(n int, table, where, why string) {
	s.t.Helper()
	if got := s.count(table, where); got != n {
		s.t.Fatalf("%s: %d rows of %s where %s, want %d", why, got, table, where, n)
	}
}

// checkInvariant fails if a queue breaks the invariant every writer keeps:
// a delivery waiting with a key has a head in its queue (one head per key
// and sink is the unique index's).
func (s *suite) checkInvariant() {
	s.t.Helper()
	if s.t.Failed() {
		return
	}
	n := s.count("deliveries", `state = 'waiting' AND key IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM `+deliveriesMarker+` h WHERE h.key = d.key AND h.sink = d.sink AND (h.state = 'ready' OR h.stops_key))`)
	if n != 0 {
		s.t.Fatalf("%d waiting deliveries have no head in their queue", n)
	}
}

// deliveriesMarker in a where condition stands for the deliveries table's
// name; the table the condition is on is aliased d.
const deliveriesMarker = "/*deliveries*/"

// DeliveriesMarker is deliveriesMarker for the harnesses' Count.
const DeliveriesMarker = deliveriesMarker

// claimAndRecord: a claim reads due rows in seq order and locks nothing;
// a happy record removes them.
func claimAndRecord(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "a"}, Event{"t", "b"}, Event{"t", ""})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	fresh, _ := r.claim(10, 0)
	if got := seqsOf(fresh); !slices.Equal(got, seqs) {
		t.Fatalf("claimed %v, want %v", got, seqs)
	}
	if rec := r.mustRecord(&store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"a", "b", ""}}); rec.Left != nil || rec.Fenced != 0 {
		t.Fatalf("happy record: %+v", rec)
	}
	s.want(0, "outbox", "true", "after the happy record")
}

// recordIsFencedByLease: once the lanes are taken over, the old owner's
// records change nothing, and say so (ErrFenced, every lane fenced), rather
// than report rows left locked.
func recordIsFencedByLease(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "a"}, Event{"t", "b"})
	old := s.relay("old")
	old.takeLanes(time.Hour)
	if fresh, _ := old.claim(10, 0); len(fresh) != 2 {
		t.Fatalf("claimed %d rows, want 2", len(fresh))
	}
	s.db.ExpireLeases(t)
	next := s.relay("next")
	if over := next.takeLanes(time.Hour); over != ^uint64(0) {
		t.Fatalf("took over %064b, want every lane", over)
	}
	retry := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"a", "b"}}
	retry.FromOutbox.Add(seqs[0], "mem", store.Ready, false, 1, time.Hour, boom)
	rec, err := old.record(retry, false)
	if !errors.Is(err, store.ErrFenced) || rec.Fenced != old.leases.Mask || rec.Left != nil {
		t.Fatalf("the old owner's record: %+v, %v; want ErrFenced, every lane fenced, nothing left", rec, err)
	}
	s.want(2, "outbox", "true", "after a fenced record")
	s.want(0, "deliveries", "true", "after a fenced record")
	// The new owner's record is its own.
	retry.Fence = next.leases
	next.mustRecord(retry)
	s.want(0, "outbox", "true", "after the owner's record")
	s.want(1, "deliveries", "state = 'ready' AND attempts = 1", "after the owner's record")
	// Nor can the old owner rewrite the new owner's deliveries.
	stale := &store.Outcome{}
	stale.Delete("mem", seqs[0])
	stale.Heads.Add(seqs[0], "mem", store.Dead, true, 3, 0, boom)
	stale.PromoteKeys, stale.PromoteSinks = []string{"a"}, []string{"mem"}
	if _, err := old.record(stale, false); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the old owner's record of deliveries: %v, want ErrFenced", err)
	}
	s.want(1, "deliveries", "state = 'ready' AND attempts = 1", "after a stale record of deliveries")
}

// staleOutcomeAfterLanesComeBack: relay A claims an event and cannot
// record it for longer than a lease; relay B takes the lanes over, delivers
// the event (kept as done) and gives the lanes back; A takes them again,
// under new epochs, and records its stale outcome (a dead letter stopping
// the key): it writes nothing.
func staleOutcomeAfterLanesComeBack(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"})
	a := s.relay("relay-a")
	a.takeLanes(time.Hour)
	if fresh, _ := a.claim(10, 0); len(fresh) != 1 {
		t.Fatalf("A claimed %d", len(fresh))
	}
	stale := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k"}, Fence: a.leases}
	stale.FromOutbox.Add(seqs[0], "mem", store.Dead, true, 1, 0, boom)
	stale.PromoteKeys, stale.PromoteSinks = []string{"k"}, []string{"mem"}

	s.db.ExpireLeases(t)
	b := s.relay("relay-b")
	if over := b.takeLanes(time.Hour); over == 0 {
		t.Fatal("B took nothing over")
	}
	if fresh, _ := b.claim(10, 0); len(fresh) != 1 {
		t.Fatalf("B claimed %d", len(fresh))
	}
	if _, err := b.record(&store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k"}}, true); err != nil {
		t.Fatal(err)
	}
	if err := b.st.ReleaseAll(s.ctx, b.owner); err != nil {
		t.Fatal(err)
	}
	if over := a.takeLanes(time.Hour); over != 0 {
		t.Fatalf("A took over %064b of lanes B released", over)
	}
	rec, err := a.record(stale, true)
	if !errors.Is(err, store.ErrFenced) || rec.Fenced != stale.Fence.Mask {
		t.Fatalf("A's stale record: %+v, %v; want it fenced out of every lane", rec, err)
	}
	s.want(0, "deliveries", "true", "after A's stale record")
	s.want(1, "outbox", "status = 'done'", "after A's stale record")
}

// fencedRecordIsNotALockedRow: a record fenced out of its lanes says so;
// it does not report its rows as left behind a lock.
func fencedRecordIsNotALockedRow(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"})
	a := s.relay("relay-a")
	a.takeLanes(time.Hour)
	s.db.ExpireLeases(t)
	s.relay("relay-b").takeLanes(time.Hour)
	rec, err := a.record(&store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k"}}, false)
	if !errors.Is(err, store.ErrFenced) || rec.Left != nil {
		t.Fatalf("fenced record: %+v, %v; want ErrFenced and nothing left", rec, err)
	}
}

// keepDoneAndPurge: keepDone marks rows done; PurgeDone removes those done
// long enough ago, at most a limit at a time.
func keepDoneAndPurge(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "a"}, Event{"t", "b"}, Event{"t", "c"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	if _, err := r.record(&store.Outcome{OutboxSeqs: seqs}, true); err != nil {
		t.Fatal(err)
	}
	s.want(3, "outbox", "status = 'done' AND finished_at IS NOT NULL", "after keepDone")
	if fresh, _ := r.claim(10, 0); len(fresh) != 0 {
		t.Fatalf("claimed %d rows marked done", len(fresh))
	}
	if n, err := r.st.PurgeDone(s.ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("PurgeDone of rows done an hour ago: %d, %v; want none", n, err)
	}
	if n, err := r.st.PurgeDone(s.ctx, 0, 2); err != nil || n != 2 {
		t.Fatalf("PurgeDone with a limit of 2: %d, %v", n, err)
	}
	if n, err := r.st.PurgeDone(s.ctx, 0, 10); err != nil || n != 1 {
		t.Fatalf("PurgeDone of the rest: %d, %v", n, err)
	}
}

// queueHeadsAndPromotion: a fan-out's failure makes its event its key's
// head on the sink, the key's later events wait; a queue claim takes the
// head with its followers; delivering the head promotes the next.
func queueHeadsAndPromotion(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"}, Event{"t", "k"}, Event{"t", "k"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	r.claim(10, 0)
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k", "k", "k"}}
	o.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, 0, boom)
	o.FromOutbox.Add(seqs[1], "s", store.Waiting, false, 0, 0, sql.NullString{})
	o.FromOutbox.Add(seqs[2], "s", store.Waiting, false, 0, 0, sql.NullString{})
	r.mustRecord(o)
	s.want(1, "deliveries", "state = 'ready'", "after the failure")
	s.want(2, "deliveries", "state = 'waiting'", "after the failure")
	_, queued := r.claim(1, 10, "s")
	if got := seqsOf(queued); !slices.Equal(got, seqs[:1]) || !queued[0].Head {
		t.Fatalf("queue claim of one row: %v, want the head %d", got, seqs[0])
	}
	// The head delivered: the next is promoted, due at once.
	done := &store.Outcome{PromoteKeys: []string{"k"}, PromoteSinks: []string{"s"}}
	done.Delete("s", seqs[0])
	r.mustRecord(done)
	_, queued = r.claim(10, 10, "s")
	if got := seqsOf(queued); !slices.Equal(got, seqs[1:]) || !queued[0].Head || queued[1].Head {
		t.Fatalf("queue claim after the head went: %v (head %v), want %v headed by the first", got, queued[0].Head, seqs[1:])
	}
}

// queueKeys inserts perKey events of each of keys keys (k0, k1…, in
// turn), claims them with a relay r1 holding every lane and records them
// queued on sink s, each key's first the head, the others waiting behind
// it; it returns the relay and the seqs in insert order.
func queueKeys(t *testing.T, s *suite, keys, perKey int) (*relay, []int64) {
	var evs []Event
	for i := range keys * perKey {
		evs = append(evs, Event{"t", fmt.Sprintf("k%d", i%keys)})
	}
	seqs := s.db.Insert(t, evs...)
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	r.claim(100, 0)
	o := &store.Outcome{OutboxSeqs: seqs}
	for i, seq := range seqs {
		o.OutboxKeys = append(o.OutboxKeys, evs[i].Key)
		state := store.Waiting
		if i < keys {
			state = store.Ready
		}
		o.FromOutbox.Add(seq, "s", state, false, 0, 0, sql.NullString{})
	}
	r.mustRecord(o)
	return r, seqs
}

// queueClaimSharesRowsBetweenHeads: a queue claim of n rows over h heads
// gives each head ceil(n / h) rows, itself included, so that a backlog
// drains over every key at once.
func queueClaimSharesRowsBetweenHeads(t *testing.T, s *suite) {
	r, _ := queueKeys(t, s, 4, 5)
	_, queued := r.claim(8, 10, "s")
	perKey := map[string]int{}
	for _, c := range queued {
		perKey[c.Key]++
	}
	if len(queued) != 8 || len(perKey) != 4 {
		t.Fatalf("a claim of 8 rows over 4 heads: %d rows over %d keys (%v), want 2 of each key", len(queued), len(perKey), perKey)
	}
	for k, n := range perKey {
		if n != 2 {
			t.Fatalf("key %s: %d rows, want 2 (%v)", k, n, perKey)
		}
	}
}

// queueClaimBoundsChains: a head brings at most the chain the claim gives
// its sink, itself included, however many rows the sink's share would
// give it; the deliveries behind it wait, and the next claim goes on
// from where the chain stopped once its part is delivered.
func queueClaimBoundsChains(t *testing.T, s *suite) {
	r, seqs := queueKeys(t, s, 2, 6)
	_, queued := r.claimChains(100, 10, 3, "s")
	var k0 []int64
	for _, c := range queued {
		if c.Key == "k0" {
			k0 = append(k0, c.Seq)
		}
	}
	if len(queued) != 6 || !slices.Equal(k0, []int64{seqs[0], seqs[2], seqs[4]}) {
		t.Fatalf("a claim of chains of 3 over 2 heads: %v (k0: %v), want 3 of each key, k0's first three", seqsOf(queued), k0)
	}
	done := &store.Outcome{PromoteKeys: []string{"k0"}, PromoteSinks: []string{"s"}}
	for _, seq := range k0 {
		done.Delete("s", seq)
	}
	r.mustRecord(done)
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'ready'", seqs[6]), "k0's next delivery, made head")
}

// delaysRunOnTheDatabaseClock: a delivery's next attempt is the
// database's clock plus the delay the relay gives, and it is not claimed
// before then.
func delaysRunOnTheDatabaseClock(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"}, Event{"t", "j"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	r.claim(10, 0)
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k", "j"}}
	o.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, time.Hour, boom)
	o.FromOutbox.Add(seqs[1], "s", store.Ready, false, 1, 0, boom)
	r.mustRecord(o)
	now := s.db.Now()
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND next_at > %s + INTERVAL '59' MINUTE AND next_at < %s + INTERVAL '61' MINUTE", seqs[0], now, now),
		"the delayed delivery's next attempt")
	_, queued := r.claim(10, 10, "s")
	if got := seqsOf(queued); !slices.Equal(got, seqs[1:]) {
		t.Fatalf("claimed %v, want only %d, the delivery due now", got, seqs[1])
	}
}

// headInsertedWhereOneIsWaits: a delivery inserted as its queue's head
// waits instead when the queue has a head already (the database has the
// last word), keeping one head per key and sink.
func headInsertedWhereOneIsWaits(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"}, Event{"t", "k"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	r.claim(10, 0)
	first := &store.Outcome{OutboxSeqs: seqs[:1], OutboxKeys: []string{"k"}}
	first.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, time.Hour, boom)
	r.mustRecord(first)
	second := &store.Outcome{OutboxSeqs: seqs[1:], OutboxKeys: []string{"k"}}
	second.FromOutbox.Add(seqs[1], "s", store.Ready, false, 1, 0, boom)
	r.mustRecord(second)
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'ready'", seqs[0]), "the first head")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'waiting'", seqs[1]), "the second, inserted as a head")
}

// claimFromAPosition: a claim from a position reads only the rows after
// it in (available_at, seq) order, and each claimed row says its
// available_at, so that the next claim can start where one ended.
func claimFromAPosition(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "a"}, Event{"t", "b"}, Event{"t", "c"}, Event{"t", "d"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	first, _ := r.claim(2, 0)
	if got := seqsOf(first); !slices.Equal(got, seqs[:2]) || first[1].AvailableAt.IsZero() {
		t.Fatalf("first claim %v (available_at %v), want %v with their times", got, first[1].AvailableAt, seqs[:2])
	}
	p := store.ClaimParams{Lanes: r.leases.Mask, Rows: 10, Bytes: 32 << 20, EventBytes: 16 << 20,
		After: store.Position{AvailableAt: first[1].AvailableAt, Seq: first[1].Seq}}
	rest, _, err := r.st.Claim(s.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := seqsOf(rest); !slices.Equal(got, seqs[2:]) {
		t.Fatalf("claim after %d: %v, want %v", first[1].Seq, got, seqs[2:])
	}
	if all, _ := r.claim(10, 0); len(all) != 4 {
		t.Fatalf("claim from the beginning: %d rows, want all 4", len(all))
	}
}

func seqsOf(cs []store.Claimed) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.Seq
	}
	return out
}
