package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
)

func TestTopicLike(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"orders.created": "orders.created",
		"orders.*":       "orders.%",
		"*":              "%",
		"a_b%c\\d*":      `a\_b\%c\\d%`,
		"":               "",
	} {
		if got := deadletter.TopicLike(in); got != want {
			t.Errorf("TopicLike(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		e0 := tb.newEvent(t, "orders.created", "o-1")
		tb.put(t, e0, delivery{sink: "hook", lastError: "HTTP 410 Gone", attempts: 3, stops: true, diedAgo: 3 * time.Hour})
		// Dead on two sinks: two dead letters of one seq, in sink order.
		e1 := tb.newEvent(t, "orders.paid", "o-2")
		tb.put(t, e1, delivery{sink: "kafka", lastError: "MESSAGE too large", diedAgo: 2 * time.Hour},
			delivery{sink: "hook", lastError: "HTTP 500", diedAgo: 2 * time.Hour})
		// Dead before any sink: the routing step.
		e2 := tb.newEvent(t, "users_created", "")
		tb.put(t, e2, delivery{sink: "", lastError: "no route matches topic", diedAgo: time.Hour})
		e3 := tb.newEvent(t, "usersXcreated", "")
		tb.put(t, e3, delivery{sink: "", lastError: "no route matches topic", diedAgo: time.Minute})
		// Queued deliveries and outbox rows are never listed.
		tb.put(t, tb.newEvent(t, "orders.created", "o-3"), delivery{sink: "hook", state: "ready"})
		tb.outbox(t, outboxRow{topic: "orders.created"})
		tb.outbox(t, outboxRow{topic: "orders.created", done: true})

		all := []string{name(e0, "hook"), name(e1, "hook"), name(e1, "kafka"), name(e2, ""), name(e3, "")}
		now := time.Now()
		cases := []struct {
			name string
			f    deadletter.Filter
			want []string
		}{
			{"all", deadletter.Filter{}, all},
			{"topic exact", deadletter.Filter{Topic: "orders.paid"}, all[1:3]},
			{"topic wildcard", deadletter.Filter{Topic: "orders.*"}, all[:3]},
			{"underscore is literal", deadletter.Filter{Topic: "users_created"}, all[3:4]},
			{"star in the middle", deadletter.Filter{Topic: "users*created"}, all[3:]},
			{"key", deadletter.Filter{Key: "o-2"}, all[1:3]},
			{"sink kafka", deadletter.Filter{Sink: "kafka"}, all[2:3]},
			{"sink hook", deadletter.Filter{Sink: "hook"}, all[:2]},
			{"error substring, any case", deadletter.Filter{Error: "message TOO"}, all[2:3]},
			{"error with LIKE characters", deadletter.Filter{Error: "%"}, nil},
			{"since", deadletter.Filter{Since: now.Add(-90 * time.Minute)}, all[3:]},
			{"until", deadletter.Filter{Until: now.Add(-90 * time.Minute)}, all[:3]},
			{"since and until", deadletter.Filter{Since: now.Add(-150 * time.Minute), Until: now.Add(-30 * time.Minute)}, all[1:4]},
			{"older than", deadletter.Filter{OlderThan: 30 * time.Minute}, all[:4]},
			{"ids", deadletter.Filter{IDs: []string{e3.id, strings.ToUpper(e0.id)}}, []string{all[0], all[4]}},
			{"ids and topic", deadletter.Filter{IDs: []string{e3.id, e0.id}, Topic: "orders.*"}, all[:1]},
			{"ids and sink", deadletter.Filter{IDs: []string{e1.id}, Sink: "kafka"}, all[2:3]},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				got := names(tb.list(t, c.f, deadletter.ListOpts{}))
				if !slices.Equal(got, c.want) {
					t.Fatalf("got %v, want %v", got, c.want)
				}
				newest := names(tb.list(t, c.f, deadletter.ListOpts{Newest: true}))
				want := slices.Clone(c.want)
				slices.Reverse(want)
				if !slices.Equal(newest, want) {
					t.Fatalf("newest first: got %v, want %v", newest, want)
				}
				n, err := tb.store.Count(context.Background(), c.f)
				if err != nil || n != int64(len(c.want)) {
					t.Fatalf("Count = %d, %v; want %d", n, err, len(c.want))
				}
				for _, limit := range []int64{1, 2, 10} {
					n, more, err := tb.store.CountAtMost(context.Background(), c.f, limit)
					if want := min(int64(len(c.want)), limit); err != nil || n != want || more != (int64(len(c.want)) > limit) {
						t.Fatalf("CountAtMost(%d) = %d, %v, %v; want %d of %d", limit, n, more, err, want, len(c.want))
					}
				}
			})
		}
		// Pages end and resume between two dead letters of one event.
		got := tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Limit: 2})
		if !slices.Equal(names(got), all[:2]) {
			t.Fatalf("limit 2: %v", names(got))
		}
		next := names(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{AfterSeq: got[1].Seq, AfterSink: got[1].Sink}))
		if !slices.Equal(next, all[2:]) {
			t.Fatalf("after (seq, sink): %v", next)
		}
		if next := names(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{AfterSeq: e1.seq})); !slices.Equal(next, all[3:]) {
			t.Fatalf("after a seq (no sink: after every dead letter of the seq): %v", next)
		}
		if next := names(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{AfterSeq: e2.seq, AfterSink: ""})); !slices.Equal(next, all[4:]) {
			t.Fatalf("after a dead letter of the routing step: %v", next)
		}
		// From the newest, pages end and resume alike, and a page back is the
		// list the other way from the page's first dead letter.
		page1 := tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Limit: 3, Newest: true})
		if want := []string{all[4], all[3], all[2]}; !slices.Equal(names(page1), want) {
			t.Fatalf("newest, limit 3: %v, want %v", names(page1), want)
		}
		last := page1[2]
		page2 := tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Limit: 3, Newest: true, AfterSeq: last.Seq, AfterSink: last.Sink})
		if want := []string{all[1], all[0]}; !slices.Equal(names(page2), want) {
			t.Fatalf("newest, after (seq, sink): %v, want %v", names(page2), want)
		}
		back := tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Limit: 3, AfterSeq: page2[0].Seq, AfterSink: page2[0].Sink})
		slices.Reverse(back)
		if !slices.Equal(names(back), names(page1)) {
			t.Fatalf("a page back from page 2: %v, want page 1 %v", names(back), names(page1))
		}
		if next := names(tb.list(t, deadletter.Filter{}, deadletter.ListOpts{Newest: true, AfterSeq: e1.seq})); !slices.Equal(next, all[:1]) {
			t.Fatalf("newest, after a seq (no sink: after every dead letter of the seq): %v", next)
		}
		d := got[0]
		if d.Seq != e0.seq || d.Topic != "orders.created" || d.Key != "o-1" || d.Sink != "hook" || d.Attempts != 3 ||
			d.LastError != "HTTP 410 Gone" || !d.StopsKey || time.Since(d.DiedAt) < 3*time.Hour-time.Minute || d.CreatedAt.IsZero() {
			t.Fatalf("listed %+v", d)
		}
		b, _ := json.Marshal(tb.list(t, deadletter.Filter{IDs: []string{e2.id}}, deadletter.ListOpts{})[0])
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["sink"] != "" || m["stops_key"] != false || m["key"] != nil || m["died_at"] == nil {
			t.Fatalf("JSON of a routing-step dead letter: %s", b)
		}
	})
}

// TestFilterValidate: the checks are the store's, before any statement;
// PostgreSQL stands for both databases.
func TestFilterValidate(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for _, c := range []struct {
		f    deadletter.Filter
		want string
	}{
		{deadletter.Filter{IDs: []string{"nope"}}, `id: "nope" is not a UUID`},
		{deadletter.Filter{OlderThan: -time.Second}, "older_than: must not be negative"},
		{deadletter.Filter{Since: time.Now(), Until: time.Now().Add(-time.Hour)}, "until:"},
	} {
		err := tb.store.List(context.Background(), c.f, deadletter.ListOpts{}, func(deadletter.DeadLetter) error { return nil })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("List(%+v) = %v, want %q", c.f, err, c.want)
		}
		if _, err := tb.store.Replay(context.Background(), c.f, deadletter.ReplayOpts{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Replay(%+v) = %v, want %q", c.f, err, c.want)
		}
		if _, err := tb.store.Purge(context.Background(), c.f, deadletter.PurgeOpts{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Purge(%+v) = %v, want %q", c.f, err, c.want)
		}
	}
	// fn's error stops the walk and is returned.
	tb.dead(t, "a", "", "hook")
	tb.dead(t, "b", "", "hook")
	stop := errors.New("stop")
	calls := 0
	err := tb.store.List(context.Background(), deadletter.Filter{}, deadletter.ListOpts{}, func(deadletter.DeadLetter) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List returned %v after %d calls", err, calls)
	}
}

func TestShow(t *testing.T) {
	t.Parallel()
	forEachDB(t, func(t *testing.T, tb *testBundle) {
		ctx := context.Background()
		// head is due on kafka; e, behind it there, is dead on hook, stopping
		// its key.
		head := tb.newEvent(t, "orders.created", "o-1")
		tb.put(t, head, delivery{sink: "kafka", state: "ready", attempts: 2, lastError: "broker down"})
		e := tb.newEvent(t, "orders.created", "o-1")
		e.payload, e.headers, e.maxAttempts = `{"total":42,"items":[1,2]}`, `{"X-Tenant": "acme", "n": 5}`, 7
		tb.put(t, e, delivery{sink: "hook", attempts: 4, lastError: "HTTP 500", stops: true},
			delivery{sink: "kafka", state: "waiting"})

		got, err := tb.store.Show(ctx, e.id)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != e.id || got.Seq != e.seq || got.Topic != "orders.created" || got.Key != "o-1" || got.Status != "queued" || !got.PayloadJSON ||
			string(got.Payload) != `{"total":42,"items":[1,2]}` || got.Headers["X-Tenant"] != "acme" || got.Headers["n"] != "5" ||
			got.MaxAttempts != 7 || !got.AvailableAt.IsZero() || !got.FinishedAt.IsZero() || len(got.Deliveries) != 2 {
			t.Fatalf("Show = %+v", got)
		}
		if d := got.Deliveries["hook"]; d.State != "dead" || d.Attempts != 4 || d.Error != "HTTP 500" || !d.StopsKey ||
			d.DeadAt.IsZero() || d.QueuedAt.IsZero() || !d.NextAt.IsZero() || d.Head != nil {
			t.Fatalf("hook delivery = %+v", d)
		}
		if d := got.Deliveries["kafka"]; d.State != "waiting" || d.Head == nil || *d.Head != (deadletter.QueueHead{Seq: head.seq, ID: head.id, State: "ready"}) {
			t.Fatalf("kafka delivery = %+v (head %+v)", d, d.Head)
		}
		if d, _ := tb.store.Show(ctx, head.id); d.Deliveries["kafka"].NextAt.IsZero() || d.Deliveries["kafka"].Error != "broker down" {
			t.Fatalf("the head's delivery = %+v", d.Deliveries["kafka"])
		}
		var m map[string]any
		b, _ := json.Marshal(got)
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if p, ok := m["payload"].(map[string]any); !ok || p["total"] != 42.0 || m["id"] != e.id || m["payload_base64"] != nil ||
			m["deliveries"].(map[string]any)["kafka"].(map[string]any)["head"].(map[string]any)["id"] != head.id {
			t.Fatalf("JSON: %s", b)
		}

		// Only dead letters left: dead. Dead at the routing step: sink "".
		dead := tb.dead(t, "x", "", "")
		if got, err := tb.store.Show(ctx, dead.id); err != nil || got.Status != "dead" || got.Deliveries[""].State != "dead" {
			t.Fatalf("Show(dead) = %+v, %v", got, err)
		}

		// Pending in the outbox (binary), and done (kept by retention).
		binID := tb.outbox(t, outboxRow{topic: "bin", payloadBin: []byte{0, 0xff}, contentType: "application/octet-stream"})
		doneID := tb.outbox(t, outboxRow{topic: "t", done: true})
		got, err = tb.store.Show(ctx, binID)
		if err != nil || got.PayloadJSON || string(got.Payload) != "\x00\xff" || got.Status != "pending" || got.AvailableAt.IsZero() ||
			got.ContentType != "application/octet-stream" || len(got.Deliveries) != 0 {
			t.Fatalf("binary Show = %+v, %v", got, err)
		}
		b, _ = json.Marshal(got)
		if !strings.Contains(string(b), `"payload_base64":"AP8="`) || strings.Contains(string(b), `"payload":`) {
			t.Fatalf("binary JSON: %s", b)
		}
		if got, err := tb.store.Show(ctx, doneID); err != nil || got.Status != "done" || got.FinishedAt.IsZero() {
			t.Fatalf("Show(done) = %+v, %v", got, err)
		}

		if _, err := tb.store.Show(ctx, "0190a0b0-0000-7000-8000-000000000000"); !errors.Is(err, deadletter.ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}
		var ie *deadletter.InputError
		if _, err := tb.store.Show(ctx, "x"); !errors.As(err, &ie) || !strings.Contains(err.Error(), "not a UUID") {
			t.Fatalf("bad id: %v", err)
		}
	})
}

// TestHundredThousand lists, replays and purges 100,000 dead letters in
// batches, reporting progress after each. The dead letters were just
// written (the table is not analysed), so the page settings (pagePlanSQL)
// are what keep each page on the index; its time is logged, not asserted:
// a loaded machine takes several times as long.
func TestHundredThousand(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	const n = 100000
	start := time.Now()
	tb.exec(t, `INSERT INTO `+tb.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, created_at,
    state, stops_key, attempts, last_error, dead_at)
SELECT 'hook', s.seq, hashtext('k-' || (s.i % 1000)) & 63, gen_random_uuid(),
       CASE WHEN s.i % 2 = 0 THEN 'even.t' ELSE 'odd.t' END, 'k-' || (s.i % 1000), '{"i": 1}', now(),
       'dead', s.i <= 1000, 1, 'HTTP 500', now()
FROM (SELECT i, nextval(pg_get_serial_sequence($1, 'seq')) AS seq FROM generate_series(1, $2) AS i) s`, tb.tables.Outbox(), n)
	t.Logf("inserted %d dead letters in %s", n, time.Since(start))

	start = time.Now()
	count := 0
	var last int64
	err := tb.store.List(ctx, deadletter.Filter{}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		if d.Seq <= last {
			return fmt.Errorf("seq %d after %d", d.Seq, last)
		}
		last = d.Seq
		count++
		return nil
	})
	if err != nil || count != n {
		t.Fatalf("List: %d dead letters, %v", count, err)
	}
	t.Logf("listed %d in %s", count, time.Since(start))

	start = time.Now()
	var progress []int64
	res, err := tb.store.Replay(ctx, deadletter.Filter{Topic: "even.*"}, deadletter.ReplayOpts{Progress: func(done int64) { progress = append(progress, done) }})
	if err != nil || res.Count != n/2 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	if len(progress) != n/2/deadletter.DefaultBatchSize || progress[0] != deadletter.DefaultBatchSize || progress[len(progress)-1] != n/2 {
		t.Fatalf("progress calls: %d (first %v)", len(progress), progress[:min(3, len(progress))])
	}
	t.Logf("replayed %d in %s", res.Count, time.Since(start))
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("replaying %d dead letters took %s", n/2, took)
	}
	// Each of the 500 keys of even events has one head on hook: the
	// lowest of its replayed dead letters.
	tb.checkHeads(t)
	if heads := tb.count(t, tb.tables.Deliveries(), "state = 'ready'"); heads != 500 {
		t.Fatalf("%d heads after the replay, want 500", heads)
	}

	start = time.Now()
	progress = nil
	res, err = tb.store.Purge(ctx, deadletter.Filter{}, deadletter.PurgeOpts{Progress: func(done int64) { progress = append(progress, done) }})
	if err != nil || res.Count != n/2 || len(progress) != n/2/deadletter.DefaultBatchSize {
		t.Fatalf("Purge = %+v, %v, %d progress calls", res, err, len(progress))
	}
	t.Logf("purged %d in %s", res.Count, time.Since(start))
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("purging %d dead letters took %s", n/2, took)
	}
	if queued, deadLeft := tb.count(t, tb.tables.Deliveries(), "state <> 'dead'"), tb.count(t, tb.tables.Deliveries(), "state = 'dead'"); queued != n/2 || deadLeft != 0 {
		t.Fatalf("queued %d, dead %d", queued, deadLeft)
	}
	tb.checkHeads(t)
}

// TestListShowsTimesPastYear9999 covers a dead letter whose event was
// written with created_at after year 9999 (PostgreSQL stores it; RFC 3339
// and JSON cannot): listing and showing it once failed to encode, hiding
// every other dead letter. Such a time is shown as the last one JSON can
// carry, and the others are listed with it.
func TestListShowsTimesPastYear9999(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	far := tb.newEvent(t, "t", "k")
	tb.put(t, far, delivery{sink: "hook", lastError: "HTTP 400"})
	tb.exec(t, "UPDATE "+tb.tables.Deliveries()+" SET created_at = '12000-01-01', dead_at = 'infinity' WHERE seq = $1", far.seq)
	other := tb.dead(t, "t", "j", "hook")
	var got []deadletter.DeadLetter
	if err := tb.store.List(ctx, deadletter.Filter{}, deadletter.ListOpts{}, func(d deadletter.DeadLetter) error {
		got = append(got, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq != far.seq || got[1].Seq != other.seq {
		t.Fatalf("listed %+v, want both dead letters", got)
	}
	if _, err := json.Marshal(got); err != nil {
		t.Fatalf("the listing does not encode as JSON: %v", err)
	}
	if got[0].CreatedAt.Year() != 9999 || got[0].DiedAt.Year() != 9999 {
		t.Fatalf("times past year 9999 listed as %v and %v, want the last ones JSON can carry", got[0].CreatedAt, got[0].DiedAt)
	}
	e, err := tb.store.Show(ctx, far.id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := json.Marshal(e); err != nil {
		t.Fatalf("the event does not encode as JSON: %v", err)
	}
}

func TestCause(t *testing.T) {
	t.Parallel()
	const id = "0190a0b0-0000-7000-8000-000000000001"
	for text, want := range map[string]string{
		"publishing event " + id + " to billing: endpoint answered 400 Bad Request": "endpoint answered 400 Bad Request",
		"publishing event " + id + " to hook (max_body_bytes): event is 2 MiB":      "event is 2 MiB",
		"event " + id + ": destination is empty: not a stream name":                 "destination is empty: not a stream name",
		// Another event's id, or no prefix: the text as stored.
		"publishing event 0190a0b0-0000-7000-8000-000000000002 to billing: x": "publishing event 0190a0b0-0000-7000-8000-000000000002 to billing: x",
		"HTTP 500": "HTTP 500",
		"":         "",
	} {
		if got := deadletter.Cause(id, text); got != want {
			t.Errorf("Cause(%q) = %q, want %q", text, got, want)
		}
	}
	// Without an id, whatever event the prefix names.
	for text, want := range map[string]string{
		"publishing event 0190a0b0-0000-7000-8000-000000000002 to hook: endpoint answered 403 Forbidden": "endpoint answered 403 Forbidden",
		"event " + id + ": key too long":                                     "key too long",
		"publishing event not-a-uuid-at-all-but-thirty-six-chars to hook: x": "publishing event not-a-uuid-at-all-but-thirty-six-chars to hook: x",
		"dial tcp 127.0.0.1:9: connection refused":                           "dial tcp 127.0.0.1:9: connection refused",
	} {
		if got := deadletter.Cause("", text); got != want {
			t.Errorf("Cause(\"\", %q) = %q, want %q", text, got, want)
		}
	}
}
