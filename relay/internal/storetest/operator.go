package storetest

import (
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// The operator's cases: replays, purges and drops keep the queues whole,
// alone and racing the relays' records.

// everything selects every dead letter, from the beginning.
var (
	everything = store.DeadLetterFilter{}
	beginning  = store.DeadLetterPosition{Seq: -1 << 63}
)

// queue records, for one key on sink "s", a head (dead and stopping the
// key when stopped, else ready and due at once) and followers waiting
// behind it, and returns their seqs.
func (s *suite) queue(r *relay, key string, n int, stopped bool) []int64 {
	s.t.Helper()
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{"t", key}
	}
	seqs := s.db.Insert(s.t, evs...)
	o := &store.Outcome{OutboxSeqs: seqs}
	for i, seq := range seqs {
		o.OutboxKeys = append(o.OutboxKeys, key)
		switch {
		case i > 0:
			o.FromOutbox.Add(seq, "s", store.Waiting, false, 0, 0, sql.NullString{})
		case stopped:
			o.FromOutbox.Add(seq, "s", store.Dead, true, 3, 0, boom)
		default:
			o.FromOutbox.Add(seq, "s", store.Ready, false, 1, 0, boom)
		}
	}
	r.mustRecord(o)
	return seqs
}

// replayRejoinsTheQueue: a replayed dead letter that stopped its key is
// its queue's head again, attempts reset and due at once, its followers
// behind it; one that left its queue (not stopping the key) waits behind
// the head the queue has meanwhile.
func replayRejoinsTheQueue(t *testing.T, s *suite) {
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	stopped := s.queue(r, "k", 3, true)
	left := s.db.Insert(t, Event{"t", "j"})
	o := &store.Outcome{OutboxSeqs: left, OutboxKeys: []string{"j"}}
	o.FromOutbox.Add(left[0], "s", store.Dead, false, 3, 0, boom)
	r.mustRecord(o)
	heldJ := s.queue(r, "j", 1, false)
	op := s.db.Operator(t)
	taken, err := op.ReplayDeadLetters(s.ctx, everything, beginning, 10, false)
	if err != nil || len(taken) != 2 {
		t.Fatalf("replay: %d taken, %v; want the 2 dead letters", len(taken), err)
	}
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'ready' AND attempts = 0 AND NOT stops_key AND next_at <= %s", stopped[0], s.db.Now()),
		"the replayed head of k")
	s.want(2, "deliveries", fmt.Sprintf("key = 'k' AND state = 'waiting' AND seq > %d", stopped[0]), "k's followers")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'waiting' AND attempts = 0", left[0]), "j's replayed dead letter, behind j's head")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'ready'", heldJ[0]), "j's head")
	_, queued := r.claim(10, 10, "s")
	if got := seqsOf(queued); !slices.Contains(got, stopped[0]) || !slices.Contains(got, heldJ[0]) {
		t.Fatalf("queue claim after the replay: %v, want the heads %d and %d", got, stopped[0], heldJ[0])
	}
}

// purgeLetsTheKeyMoveOn: purging a dead letter that stopped its key makes
// the next delivery of the key its head, due at once; purging one that did
// not stop its key leaves its queue alone.
func purgeLetsTheKeyMoveOn(t *testing.T, s *suite) {
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	seqs := s.queue(r, "k", 3, true)
	op := s.db.Operator(t)
	taken, err := op.PurgeDeadLetters(s.ctx, store.DeadLetterFilter{Key: "k"}, beginning, 10)
	if err != nil || len(taken) != 1 || taken[0].Seq != seqs[0] || !taken[0].StopsKey {
		t.Fatalf("purge: %+v, %v; want the dead letter %d, stopping its key", taken, err, seqs[0])
	}
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'ready' AND next_at <= %s", seqs[1], s.db.Now()), "k's next head")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND state = 'waiting'", seqs[2]), "k's last delivery")
	if taken, err := op.PurgeDeadLetters(s.ctx, everything, beginning, 10); err != nil || len(taken) != 0 {
		t.Fatalf("purge with no dead letter left: %+v, %v", taken, err)
	}
}

// replayThroughTheRoutingStep: replayed with allSinks, an event whose
// deliveries are all dead goes back to the routing step, its dead letters
// on the sinks removed; an event still queued on a sink is replayed on its
// own sink instead.
func replayThroughTheRoutingStep(t *testing.T, s *suite) {
	seqs := s.db.Insert(t, Event{"t", "k"}, Event{"t", "j"})
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	o := &store.Outcome{OutboxSeqs: seqs, OutboxKeys: []string{"k", "j"}}
	o.FromOutbox.Add(seqs[0], "a", store.Dead, false, 3, 0, boom)
	o.FromOutbox.Add(seqs[0], "b", store.Dead, false, 3, 0, boom)
	o.FromOutbox.Add(seqs[1], "a", store.Dead, false, 3, 0, boom)
	o.FromOutbox.Add(seqs[1], "b", store.Ready, false, 1, time.Hour, boom)
	r.mustRecord(o)
	taken, err := s.db.Operator(t).ReplayDeadLetters(s.ctx, everything, beginning, 10, true)
	if err != nil || len(taken) != 3 {
		t.Fatalf("replay to the routing step: %d taken, %v; want 3", len(taken), err)
	}
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND sink = '' AND state = 'ready'", seqs[0]), "k's event at the routing step")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d", seqs[0]), "k's event, its dead letters gone")
	s.want(1, "deliveries", fmt.Sprintf("seq = %d AND sink = 'a' AND state = 'ready' AND attempts = 0", seqs[1]), "j's dead letter, replayed on its sink")
	s.want(0, "deliveries", fmt.Sprintf("seq = %d AND sink = ''", seqs[1]), "j's event, still queued on b")
}

// queueDrop: a sink's queue dropped in batches, in seq order, leaves the
// queues whole after every batch (a run stopped half way cuts no queue),
// other sinks' queues alone, and counts what it dropped.
func queueDrop(t *testing.T, s *suite) {
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	var all []int64
	for _, key := range []string{"a", "b", "c"} {
		all = append(all, s.queue(r, key, 3, key == "b")...)
	}
	other := s.db.Insert(t, Event{"t", "a"})
	o := &store.Outcome{OutboxSeqs: other, OutboxKeys: []string{"a"}}
	o.FromOutbox.Add(other[0], "other", store.Ready, false, 1, 0, boom)
	r.mustRecord(o)
	op := s.db.Operator(t)
	if n, err := op.QueueSize(s.ctx, "s"); err != nil || n != int64(len(all)) {
		t.Fatalf("queue size of s: %d, %v; want %d", n, err, len(all))
	}
	var dropped []int64
	after := int64(0)
	for {
		taken, err := op.DropQueue(s.ctx, "s", after, 2)
		if err != nil {
			t.Fatalf("dropping after %d: %v", after, err)
		}
		for _, x := range taken {
			dropped = append(dropped, x.Seq)
			after = x.Seq
		}
		s.checkInvariant()
		if len(taken) < 2 {
			break
		}
	}
	slices.Sort(all)
	if !slices.Equal(dropped, all) {
		t.Fatalf("dropped %v, want %v in seq order", dropped, all)
	}
	s.want(0, "deliveries", "sink = 's'", "after the drop")
	s.want(1, "deliveries", "sink = 'other' AND state = 'ready'", "the other sink's queue")
}

// operatorRacesRecords: relays record outcomes (deliveries, retries, dead
// letters that stop their key or leave their queue) while an operator
// replays and purges dead letters of the same keys: every write keeps one
// head per key (the unique index would refuse a second) and a head for
// every waiting delivery, and when the dust settles every event was either
// delivered once or purged.
func operatorRacesRecords(t *testing.T, s *suite) {
	r := s.relay("r1")
	r.takeLanes(time.Hour)
	var all []int64
	for i := range 6 {
		all = append(all, s.queue(r, fmt.Sprintf("k%d", i), 5, i%2 == 0)...)
	}
	op := s.db.Operator(t)
	var (
		mu        sync.Mutex
		delivered = map[int64]int{}
		purged    = map[int64]bool{}
		wg        sync.WaitGroup
	)
	purge := func(f store.DeadLetterFilter, n int) {
		taken, err := op.PurgeDeadLetters(s.ctx, f, beginning, n)
		if err != nil {
			t.Errorf("purging: %v", err)
		}
		mu.Lock()
		for _, x := range taken {
			purged[x.Seq] = true
		}
		mu.Unlock()
	}
	wg.Go(func() {
		for i := range 30 {
			if i%3 == 2 {
				purge(store.DeadLetterFilter{Key: fmt.Sprintf("k%d", i%6)}, 1)
			} else if _, err := op.ReplayDeadLetters(s.ctx, everything, beginning, 2, false); err != nil {
				t.Errorf("replaying: %v", err)
			}
		}
	})
	rnd := rand.New(rand.NewPCG(1, 2))
	wg.Go(func() {
		for range 30 {
			r.work(rnd.IntN(3), delivered, &mu)
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	s.checkInvariant()
	// The rest: every dead letter replayed, everything delivered.
	for range 20 {
		if s.count("deliveries", "true") == 0 {
			break
		}
		if _, err := op.ReplayDeadLetters(s.ctx, everything, beginning, 100, false); err != nil {
			t.Fatalf("replaying the rest: %v", err)
		}
		r.work(0, delivered, &mu)
	}
	s.want(0, "deliveries", "true", "after delivering the rest")
	for _, seq := range all {
		if n := delivered[seq]; n+boolInt(purged[seq]) != 1 {
			t.Fatalf("seq %d: delivered %d times, purged %v; want delivered once or purged", seq, n, purged[seq])
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// work claims the relay's queue on sink "s" and records an outcome for
// every head claimed: fate 0 delivers it with the followers claimed behind
// it, 1 makes it a dead letter that stops its key, 2 one that leaves its
// queue. Deliveries are counted in delivered once recorded.
func (r *relay) work(fate int, delivered map[int64]int, mu *sync.Mutex) {
	_, queued, err := r.st.Claim(r.s.ctx, store.ClaimParams{Lanes: r.leases.Mask, Rows: 1, Bytes: 32 << 20, EventBytes: 16 << 20,
		QueueSinks: []string{"s"}, QueueHeads: []int32{4}, QueueRows: []int32{12}, QueueChain: []int32{12}})
	if err != nil {
		r.s.t.Errorf("claiming: %v", err)
		return
	}
	o := &store.Outcome{}
	var sent []int64
	headFate := 0
	for _, c := range queued {
		if c.Head {
			headFate = fate
		}
		switch {
		case headFate == 0:
			o.Delete(c.Sink, c.Seq)
			sent = append(sent, c.Seq)
			if c.Head {
				o.PromoteKeys, o.PromoteSinks = append(o.PromoteKeys, c.Key), append(o.PromoteSinks, c.Sink)
			}
		case !c.Head:
		case headFate == 1:
			o.Heads.Add(c.Seq, c.Sink, store.Dead, true, int32(c.Attempts+1), 0, boom)
		default:
			o.Demote.Add(c.Seq, c.Sink, store.Dead, false, int32(c.Attempts+1), 0, boom)
			o.PromoteKeys, o.PromoteSinks = append(o.PromoteKeys, c.Key), append(o.PromoteSinks, c.Sink)
		}
	}
	if len(queued) == 0 {
		return
	}
	if _, err := r.record(o, false); err != nil {
		r.s.t.Errorf("recording: %v", err)
		return
	}
	mu.Lock()
	for _, seq := range sent {
		delivered[seq]++
	}
	mu.Unlock()
}

// queuedSinksOfKeys: the sinks on which keys have a queue are those where
// they have a head, ready or dead and stopping the key, each once however
// many deliveries wait behind it; a key without one is left out.
func queuedSinksOfKeys(t *testing.T, s *suite) {
	r := s.relay("r1")
	r.takeLanes(time.Minute)
	s.queue(r, "flowing", 3, false)
	s.queue(r, "stopped", 1, true)
	got, err := r.st.QueuedSinks(s.ctx, []string{"flowing", "stopped", "free"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"flowing": {"s"}, "stopped": {"s"}}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("QueuedSinks = %v, want %v", got, want)
	}
}
