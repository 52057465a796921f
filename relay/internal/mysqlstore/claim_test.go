package mysqlstore

import (
	"context"
	"fmt"
	"hash/crc32"
	"slices"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// The claim reads due rows in seq order, of the lanes in its mask only,
// without the rows to skip, within the byte budget, and only for a relay
// running the newest live configuration.
func TestClaimOrderLanesAndLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := make([]ev, 30)
	for i := range evs {
		evs[i] = ev{topic: "t", key: fmt.Sprintf("k%d", i%7)}
	}
	evs[3].key = "" // the lane of its id
	seqs := b.insert(t, evs...)
	// A delayed event is not due.
	if _, err := b.db.Exec("INSERT INTO " + b.tables.Outbox() + " (topic, available_at) VALUES ('t', utc_timestamp(6) + INTERVAL 1 HOUR)"); err != nil {
		t.Fatal(err)
	}
	r := b.relay(t, "r1")

	fresh, _, err := r.claim(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := seqsOf(fresh), seqsOf(claimedSeqs(seqs)); got != want {
		t.Fatalf("claimed %s, want %s", got, want)
	}
	c := fresh[1]
	if c.Key != "k1" || c.Topic != "t" || string(c.Payload) != `{"n": 1}` || c.PayloadBin != nil || len(c.ID) != 36 ||
		string(c.Headers) != "{}" || c.PayloadBytes != 8 || c.CreatedAt.IsZero() || c.Queued != nil {
		t.Fatalf("claimed row read as %+v", c)
	}
	if want := int16(crc32.ChecksumIEEE([]byte("k1")) & 63); c.Lane != want {
		t.Fatalf("lane %d, want crc32 & 63 = %d", c.Lane, want)
	}

	// A mask of k1's lane alone.
	mask := uint64(1) << uint(c.Lane)
	fresh, _, err = r.Claim(ctx, store.ClaimParams{Lanes: mask, Rows: 100, Bytes: 1 << 20, EventBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fresh {
		if f.Lane != c.Lane {
			t.Fatalf("claimed a row of lane %d with a mask of lane %d", f.Lane, c.Lane)
		}
	}
	if len(fresh) < 4 {
		t.Fatalf("claimed %d rows of k1's lane, want k1's 4 at least", len(fresh))
	}

	// Rows, skip, bytes: 2 rows skipped, a budget of 3 payloads of 8 bytes.
	fresh, _, err = r.Claim(ctx, store.ClaimParams{Lanes: ^uint64(0), Rows: 10, Bytes: 24, EventBytes: 1 << 20, Skip: seqs[:2]})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := seqsOf(fresh), seqsOf(claimedSeqs(seqs[2:5])); got != want {
		t.Fatalf("claimed %s with 2 skipped and a budget of 3 payloads, want %s", got, want)
	}
	// A budget smaller than one event: it comes alone. A payload larger
	// than EventBytes is left in the database.
	fresh, _, err = r.Claim(ctx, store.ClaimParams{Lanes: ^uint64(0), Rows: 10, Bytes: 1, EventBytes: 1 << 20})
	if err != nil || len(fresh) != 1 {
		t.Fatalf("claimed %d rows with a budget of 1 byte (%v), want 1", len(fresh), err)
	}
	fresh, _, err = r.Claim(ctx, store.ClaimParams{Lanes: ^uint64(0), Rows: 2, Bytes: 1, EventBytes: 4})
	if err != nil || len(fresh) != 2 || fresh[0].Payload != nil || fresh[0].PayloadBytes != 8 {
		t.Fatalf("claimed %+v (%v), want 2 rows without their payloads", fresh, err)
	}

	// Only the newest live configuration claims.
	if err := r.Heartbeat(ctx, "old", "v1", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Heartbeat(ctx, "new", "v2", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	for config, want := range map[string]int{"v1": 0, "v2": 10} {
		fresh, _, err := r.Claim(ctx, store.ClaimParams{Config: config, Lanes: ^uint64(0), Rows: 10, Bytes: 1 << 20, EventBytes: 1 << 20})
		if err != nil || len(fresh) != want {
			t.Fatalf("config %s claimed %d rows (%v), want %d", config, len(fresh), err, want)
		}
	}
}

func claimedSeqs(seqs []int64) []store.Claimed {
	out := make([]store.Claimed, len(seqs))
	for i, s := range seqs {
		out[i].Seq = s
	}
	return out
}

// The queue claim: per sink, the due heads in next_at order, each followed
// by the deliveries waiting behind it; the routing step's deliveries come
// with their key's queues and the sinks where the event already has one.
// A claimed outbox row lists the sinks where its key has a queue.
func TestClaimQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, "r1")
	if _, _, err := r.takeLanes(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	seqs := b.insert(t, ev{"t", "a"}, ev{"t", "a"}, ev{"t", "a"}, ev{"t", "b"}, ev{"t", "c"})
	// a fails on sink s (head, two behind it) and its first event also
	// waits on the routing step; b fails on s later (due in an hour).
	o := &store.Outcome{OutboxSeqs: seqs[:4], OutboxKeys: []string{"a", "a", "a", "b"}}
	o.FromOutbox.Add(seqs[0], "s", store.Ready, false, 1, 0, boom)
	o.FromOutbox.Add(seqs[1], "s", store.Waiting, false, 0, 0, nullString)
	o.FromOutbox.Add(seqs[2], "s", store.Waiting, false, 0, 0, nullString)
	o.FromOutbox.Add(seqs[3], "s", store.Ready, false, 1, time.Hour, boom)
	o.FromOutbox.Add(seqs[0], "", store.Ready, false, 1, 0, boom)
	if left, err := r.record(ctx, o); err != nil || left != nil {
		t.Fatalf("recording the fan-out: left %v, %v", left, err)
	}
	if n := b.count(t, "true"); n != 1 {
		t.Fatalf("%d outbox rows after the fan-out, want 1", n)
	}
	later := b.insert(t, ev{"t", "a"})
	fresh, queued, err := r.claim(ctx, 100, "", "s")
	if err != nil {
		t.Fatal(err)
	}
	if got := seqsOf(fresh); got != fmt.Sprint(seqs[4], " ", later[0]) {
		t.Fatalf("claimed outbox rows %s", got)
	}
	if fresh[0].Queued != nil || !slices.Equal(sorted(fresh[1].Queued), []string{"", "s"}) {
		t.Fatalf("queues of claimed rows: %q and %q, want none and the routing step's and s", fresh[0].Queued, fresh[1].Queued)
	}
	want := fmt.Sprintf(":%d* s:%d* s:%d s:%d", seqs[0], seqs[0], seqs[1], seqs[2])
	if got := seqsOf(queued); got != want {
		t.Fatalf("claimed queues %s, want %s", got, want)
	}
	if q := queued[0]; q.Attempts != 1 || !slices.Equal(q.Elsewhere, []string{"s"}) || !slices.Equal(sorted(q.Queued), []string{"", "s"}) ||
		string(q.Payload) != `{"n": 0}` || q.Key != "a" {
		t.Fatalf("the routing step's delivery read as %+v", q)
	}

	// Heads per sink and rows per sink bound the queue claim.
	_, queued, err = r.Claim(ctx, store.ClaimParams{Lanes: ^uint64(0), Rows: 10, Bytes: 1 << 20, EventBytes: 1 << 20,
		QueueSinks: []string{"s"}, QueueHeads: []int32{1}, QueueRows: []int32{2}, QueueChain: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := seqsOf(queued), fmt.Sprintf("s:%d* s:%d", seqs[0], seqs[1]); got != want {
		t.Fatalf("claimed %s with 2 rows per sink, want %s", got, want)
	}
	// A paused sink (not in QueueSinks) and a configuration not the newest
	// claim nothing.
	if err := r.Heartbeat(ctx, "other", "v2", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	_, queued, err = r.claim(ctx, 10, "s")
	if err != nil || len(queued) != 0 {
		t.Fatalf("an old configuration claimed %s (%v)", seqsOf(queued), err)
	}
}

var nullString = boom

func init() { nullString.Valid, nullString.String = false, "" }

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
