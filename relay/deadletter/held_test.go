package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks"
)

// queueOf writes a queue of key on sink: a head (hd, ready when its state
// is empty), then n deliveries waiting behind it. It returns the events.
func (tb *testBundle) queueOf(t *testing.T, key, sink string, hd delivery, n int) []*event {
	t.Helper()
	if hd.state == "" {
		hd.state = "ready"
	}
	hd.sink = sink
	first := tb.newEvent(t, "orders."+key, key)
	tb.put(t, first, hd)
	out := []*event{first}
	for range n {
		e := tb.newEvent(t, "orders."+key, key)
		tb.put(t, e, delivery{sink: sink, state: "waiting"})
		out = append(out, e)
	}
	return out
}

// queuedAgo dates e's delivery on sink as queued d ago.
func (tb *testBundle) queuedAgo(t *testing.T, e *event, sink string, d time.Duration) {
	t.Helper()
	if tb.my != nil {
		tb.execMy(t, `UPDATE `+tb.mt.Deliveries()+` SET queued_at = utc_timestamp(6) - INTERVAL ? MICROSECOND WHERE sink = ? AND seq = ?`, d.Microseconds(), sink, e.seq)
		return
	}
	tb.exec(t, `UPDATE `+tb.tables.Deliveries()+` SET queued_at = now() - $3::interval WHERE sink = $1 AND seq = $2`, sink, e.seq, d)
}

func heldNames(hs []deadletter.HeldKey) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = fmt.Sprintf("%s/%s:%d", h.Key, h.Sink, h.Behind)
	}
	return out
}

func TestHeldKeys(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()

		if got, err := tb.store.HeldKeys(ctx, 10); err != nil || got == nil || len(got) != 0 {
			t.Fatalf("empty table: %v, %v; want an empty, non-nil list", got, err)
		}

		// Key a is held on hook behind a head that failed twice, three
		// deliveries behind it; on kafka its events flow (nothing is queued
		// there), and on mail its head is due without having failed (the
		// previous head just went out): not held.
		a := tb.queueOf(t, "a", "hook", delivery{attempts: 2, lastError: "HTTP 503"}, 3)
		tb.queueOf(t, "a", "mail", delivery{}, 1)
		// Key b is stopped on hook by a dead letter, one behind it.
		b := tb.queueOf(t, "b", "hook", delivery{state: "dead", stops: true, attempts: 5, lastError: "HTTP 410", diedAgo: time.Minute}, 1)
		// Keys c and e fail on hook with nobody behind: c, queued earlier, first.
		c := tb.queueOf(t, "c", "hook", delivery{attempts: 1, lastError: "timeout"}, 0)
		e := tb.queueOf(t, "e", "hook", delivery{attempts: 1, lastError: "timeout"}, 0)
		tb.queuedAgo(t, c[0], "hook", time.Hour)
		tb.queuedAgo(t, e[0], "hook", time.Minute)
		// Key p waits only because its sink is paused: no attempt spent.
		tb.queueOf(t, "p", "down", delivery{lastError: "connection refused"}, 4)
		// Key d has a dead letter that does not stop it: it is out of the queue.
		tb.put(t, tb.newEvent(t, "orders.d", "d"), delivery{sink: "hook", lastError: "HTTP 500"})
		// An event without a key failing is no key's queue.
		tb.put(t, tb.newEvent(t, "orders.none", ""), delivery{sink: "hook", state: "ready", attempts: 3, lastError: "HTTP 500"})
		tb.checkHeads(t)

		got, err := tb.store.HeldKeys(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"a/hook:3", "b/hook:1", "c/hook:0", "e/hook:0"}
		if !slices.Equal(heldNames(got), want) {
			t.Fatalf("held keys %v, want %v", heldNames(got), want)
		}
		ha, hb := got[0], got[1]
		if ha.HeadID != a[0].id || ha.HeadSeq != a[0].seq || ha.HeadState != deadletter.StateReady || ha.Attempts != 2 ||
			ha.LastError != "HTTP 503" || ha.Topic != "orders.a" || ha.NextAt.IsZero() || time.Since(ha.Since) > time.Minute {
			t.Errorf("key a: %+v", ha)
		}
		if hb.HeadID != b[0].id || hb.HeadState != deadletter.StateDead || hb.Attempts != 5 || hb.LastError != "HTTP 410" ||
			!hb.NextAt.IsZero() || d(time.Since(hb.Since)-time.Minute) > 30*time.Second {
			t.Errorf("key b: %+v (since is when it died, a minute ago)", hb)
		}

		got, err = tb.store.HeldKeys(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(heldNames(got), want[:2]) {
			t.Fatalf("limit 2: %v, want %v", heldNames(got), want[:2])
		}
		var in *deadletter.InputError
		if _, err := tb.store.HeldKeys(ctx, 0); !errors.As(err, &in) || in.Field != "limit" {
			t.Fatalf("limit 0: %v, want an InputError on limit", err)
		}
		raw, err := json.Marshal(got[1])
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(raw, &fields); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"sink", "key", "topic", "head_id", "head_seq", "head_state", "attempts", "last_error", "since", "behind"} {
			if _, ok := fields[f]; !ok {
				t.Errorf("JSON %s has no %q", raw, f)
			}
		}
	})
}

// d is the absolute value of a duration.
func d(x time.Duration) time.Duration { return max(x, -x) }

func TestKeyQueues(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()

		// Key k: held on hook behind a failing head, three waiting; stopped on
		// the routing step by a dead letter, one waiting; a dead letter on
		// kafka that does not stop it (out of the queue). Key other has its own
		// queue on hook.
		hook := tb.queueOf(t, "k", "hook", delivery{attempts: 2, lastError: "HTTP 503"}, 3)
		route := tb.queueOf(t, "k", "", delivery{state: "dead", stops: true, lastError: "no route"}, 1)
		tb.put(t, tb.newEvent(t, "orders.k", "k"), delivery{sink: "kafka", lastError: "too large"})
		tb.queueOf(t, "other", "hook", delivery{attempts: 1}, 2)
		tb.checkHeads(t)

		got, err := tb.store.KeyQueues(ctx, "k", 10)
		if err != nil {
			t.Fatal(err)
		}
		seqs := func(ds []deadletter.KeyDelivery) string {
			var s string
			for _, d := range ds {
				s += fmt.Sprintf("%d:%s ", d.Seq, d.State)
			}
			return s
		}
		want := map[string]string{
			"hook": fmt.Sprintf("%d:ready %d:waiting %d:waiting %d:waiting ", hook[0].seq, hook[1].seq, hook[2].seq, hook[3].seq),
			"":     fmt.Sprintf("%d:dead %d:waiting ", route[0].seq, route[1].seq),
		}
		if len(got) != len(want) {
			t.Fatalf("sinks %v, want hook and the routing step", got)
		}
		for sink, w := range want {
			if s := seqs(got[sink]); s != w {
				t.Errorf("sink %q: %s, want %s", sink, s, w)
			}
		}
		h := got["hook"][0]
		if h.ID != hook[0].id || h.Topic != "orders.k" || h.Attempts != 2 || h.Error != "HTTP 503" || h.NextAt.IsZero() || h.QueuedAt.IsZero() {
			t.Errorf("hook's head: %+v", h)
		}
		if r := got[""][0]; r.DeadAt.IsZero() || r.Error != "no route" {
			t.Errorf("routing step's head: %+v", r)
		}

		got, err = tb.store.KeyQueues(ctx, "k", 2)
		if err != nil {
			t.Fatal(err)
		}
		if s := seqs(got["hook"]); s != fmt.Sprintf("%d:ready %d:waiting ", hook[0].seq, hook[1].seq) {
			t.Errorf("limit 2 on hook: %s", s)
		}
		if len(got[""]) != 2 {
			t.Errorf("limit 2 on the routing step: %s", seqs(got[""]))
		}

		for _, key := range []string{"", "nobody"} {
			got, err := tb.store.KeyQueues(ctx, key, 10)
			if err != nil || got == nil || len(got) != 0 {
				t.Errorf("key %q: %v, %v; want an empty map", key, got, err)
			}
		}
	})
}

// TestHeldKeysThroughRelay runs a real relay with two sinks under
// stop_key_on_dead_letter: bad refuses key k1 for good, so k1's first
// event is a dead letter stopping k1 on bad, and its later events wait
// there behind it, while good receives them all and k2 flows on both.
func TestHeldKeysThroughRelay(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	good := &recordingSink{name: "good"}
	bad := &recordingSink{name: "bad", reject: func(e sinks.Event) bool { return e.Key == "k1" }}
	tb.run(t, true, good, bad)
	ids := tb.insert(t, "k1", "k1", "k1", "k2")

	var held []deadletter.HeldKey
	waitFor(t, "k1 held on bad with two events behind, and good to have all four", func() bool {
		var err error
		if held, err = tb.store.HeldKeys(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return len(held) == 1 && held[0].Behind == 2 && len(only(good.ids(), ids)) == 4
	})
	if h := held[0]; h.Key != "k1" || h.Sink != "bad" || h.HeadID != ids[0] || h.HeadState != deadletter.StateDead ||
		h.Attempts != 1 || h.LastError == "" {
		t.Fatalf("held %+v, want k1 on bad behind its first event, dead", h)
	}
	qs, err := tb.store.KeyQueues(ctx, "k1", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range qs["bad"] {
		got = append(got, d.ID+":"+d.State)
	}
	want := []string{ids[0] + ":dead", ids[1] + ":waiting", ids[2] + ":waiting"}
	if len(qs) != 1 || !slices.Equal(got, want) {
		t.Fatalf("k1's queues %v (bad: %v), want only bad: %v", qs, got, want)
	}
	if qs, err := tb.store.KeyQueues(ctx, "k2", 10); err != nil || len(qs) != 0 {
		t.Fatalf("k2's queues %v, %v; want none", qs, err)
	}
}
