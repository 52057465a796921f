package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/sinks"
)

func TestPausedSinks(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down atomic.Bool
		down.Store(true)
		s := &testSink{name: "flaky", rec: b.rec, fail: func(sinks.Event) error {
			if down.Load() {
				return sinks.Unavailable(errors.New("dial tcp: connection refused"))
			}
			return nil
		}}
		cfg := b.config(t, s)
		r, err := b.db.newRelay(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		before := time.Now()
		b.insert(t, ev{topic: "t"})
		waitFor(t, time.Minute, "the sink to be paused", func() bool { return len(r.PausedSinks()) == 1 })
		since := r.PausedSinks()["flaky"]
		if since.Before(before) || since.After(time.Now()) {
			t.Fatalf("paused since %v, want after %v", since, before)
		}
		// Later failures keep the first pause time.
		tries := s.publishes()
		waitFor(t, time.Minute, "two more tries of the paused sink", func() bool { return s.publishes() >= tries+2 })
		if again := r.PausedSinks()["flaky"]; !again.Equal(since) {
			t.Fatalf("paused since moved from %v to %v", since, again)
		}
		if err := r.PauseErrors()["flaky"]; err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("PauseErrors()[flaky] = %v, want the sink's error", err)
		}
		down.Store(false)
		waitFor(t, time.Minute, "the sink to resume", func() bool { return len(r.PausedSinks()) == 0 })
		if errs := r.PauseErrors(); len(errs) != 0 {
			t.Fatalf("PauseErrors() after resuming = %v, want none", errs)
		}
	})
}

// TestPausedSinkIsProbedWhenItsPauseEnds: a paused sink's queue is
// claimed again (its probe) when the pause ends, and the rest of it as soon
// as the probe gets through, not at the workers' next poll: with a poll
// interval of an hour, the backlog of a sink that was down for a moment is
// delivered at once.
func TestPausedSinkIsProbedWhenItsPauseEnds(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var refused atomic.Int64
		s := &testSink{name: "flaky", rec: b.rec, fail: func(sinks.Event) error {
			if refused.Add(1) == 1 { // the first event, and so its call
				return sinks.Unavailable(errors.New("dial tcp: connection refused"))
			}
			return nil
		}}
		cfg := b.config(t, s)
		cfg.PollInterval = time.Hour
		cfg.SinkPause = Backoff{Initial: 100 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: -1}
		var evs []ev
		for i := range 20 {
			evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", i%4)})
		}
		seqs := b.insert(t, evs...)
		b.start(t, cfg)
		waitFor(t, time.Minute, "every event after the sink's pause", func() bool { return len(b.rec.forSink("flaky")) >= len(evs) })
		exactlyOnce(t, b.rec.all(), "flaky", seqs)
		checkKeyOrder(t, b.rec.all())
	})
}

// TestProbeResumesTheSinkAtItsFirstDelivery: a probe is one key's queue,
// sent as one call; the sink is back from the call's first delivery, and
// the other queues drain while the probe's call still runs. Each key's
// second event is held at the gate: every key's first arrives while the
// gate is shut. The pause is an hour on the relay's clock, which the test
// moves on: a relay that resumed the sink only when the probe's call
// ended would hold the other queues for that hour.
func TestProbeResumesTheSinkAtItsFirstDelivery(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down atomic.Bool
		down.Store(true)
		const keys = 4
		var evs []ev
		for i := range 3 * keys {
			evs = append(evs, ev{topic: "t", key: fmt.Sprintf("k%d", i%keys)})
		}
		seqs := b.insert(t, evs...)
		second := map[int64]bool{}
		for _, seq := range seqs[keys : 2*keys] {
			second[seq] = true
		}
		s := newGatedSink("flaky", b.rec, func(e *sinks.Event) bool { return second[e.Seq] })
		s.fail = func(*sinks.Event) error {
			if down.Load() {
				return sinks.Unavailable(errors.New("dial tcp: connection refused"))
			}
			return nil
		}
		clock := &testClock{}
		cfg := b.config(t, s)
		cfg.Clock = clock.now
		cfg.SinkPause = Backoff{Initial: time.Hour, Max: time.Hour, Jitter: -1}
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute // held until the gate opens
		var r *Relay
		b.start(t, cfg, func(started *Relay) { r = started })
		waitFor(t, time.Minute, "the sink to be paused with every event queued", func() bool {
			return len(r.PausedSinks()) == 1 && b.countDeliveries(t, "sink = 'flaky'") == len(seqs)
		})
		down.Store(false)
		clock.advance(time.Hour + time.Second)
		s.waitHeld(t, keys) // every key's first event delivered, its second at the gate
		if n := len(b.rec.forSink("flaky")); n != keys {
			t.Fatalf("%d events delivered with the gate shut, want each key's first (%d)", n, keys)
		}
		if paused := r.PausedSinks(); len(paused) != 0 {
			t.Fatalf("the sink is still paused after delivering: %v", paused)
		}
		s.open()
		waitFor(t, time.Minute, "every event delivered and the queue empty", func() bool {
			return len(b.rec.forSink("flaky")) >= len(seqs) && b.countDeliveries(t, "true") == 0
		})
		exactlyOnce(t, b.rec.all(), "flaky", seqs)
		checkKeyOrder(t, b.rec.all())
	})
}

// TestDeliveryFromBeforeThePauseDoesNotResume: an event sent before the
// sink was found down, and answered after, says nothing of whether it is
// back: the sink stays paused until its probe. Before, such late answers
// resumed a sink that was down, which the next batch found down again,
// over and over, each time restarting its pause at the shortest.
func TestDeliveryFromBeforeThePauseDoesNotResume(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down atomic.Bool
		s := newGatedSink("flaky", b.rec, func(e *sinks.Event) bool { return e.Key == "early" })
		s.fail = func(e *sinks.Event) error {
			if down.Load() && e.Key != "early" { // the early one got through before
				return sinks.Unavailable(errors.New("dial tcp: connection refused"))
			}
			return nil
		}
		clock, obs := &testClock{}, &outcomeCounter{}
		cfg := b.config(t, s)
		cfg.Clock, cfg.Observer = clock.now, obs
		cfg.HandOffAfter = 20 * time.Millisecond
		cfg.SinkPause = Backoff{Initial: time.Hour, Max: time.Hour, Jitter: -1}
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute // held until the gate opens
		var r *Relay
		b.start(t, cfg, func(started *Relay) { r = started })
		early := b.insert(t, ev{topic: "t", key: "early"})
		s.waitHeld(t, 1) // sent while the sink is up, not answered yet
		down.Store(true)
		late := b.insert(t, ev{topic: "t", key: "late"})
		waitFor(t, time.Minute, "the sink to be paused with the later event queued", func() bool {
			return len(r.PausedSinks()) == 1 && b.countDeliveries(t, fmt.Sprintf("seq = %d", late[0])) == 1
		})
		s.open() // the early event is answered now: delivered
		waitFor(t, time.Minute, "the early event's result recorded", func() bool {
			return len(b.rec.forSink("flaky")) == 1 && b.countDeliveries(t, fmt.Sprintf("seq = %d", early[0])) == 0
		})
		// A sink is resumed as the result that shows it back is reported,
		// before the result is recorded.
		if n := obs.resumes.Load(); n != 0 || len(r.PausedSinks()) != 1 {
			t.Fatalf("a delivery sent before the sink went down resumed it (%d resumes)", n)
		}
		down.Store(false)
		clock.advance(time.Hour + time.Second)
		waitFor(t, time.Minute, "the probe to deliver the later event", func() bool {
			return len(b.rec.forSink("flaky")) == 2 && b.countDeliveries(t, "true") == 0 && len(r.PausedSinks()) == 0
		})
		exactlyOnce(t, b.rec.all(), "flaky", append(early, late...))
	})
}

// TestPausedSinkGetsOneProbeAPause: a probe that takes long to fail (a
// DNS lookup timing out) is the sink's only call until it answers or the
// pause ends again, while the relay's other sink gets batch after batch:
// a sink that is down is not sent a probe a batch.
func TestPausedSinkGetsOneProbeAPause(t *testing.T) {
	t.Parallel()
	eachStoreAndCapture(t, func(t *testing.T, b *testBundle) {
		var down, holding atomic.Bool
		down.Store(true)
		flaky := newGatedSink("flaky", b.rec, func(*sinks.Event) bool { return holding.Load() })
		flaky.fail = func(*sinks.Event) error {
			if down.Load() {
				return sinks.Unavailable(errors.New("lookup hook.example: i/o timeout"))
			}
			return nil
		}
		good := &testSink{name: "good", rec: b.rec}
		clock := &testClock{}
		cfg := b.config(t)
		cfg.Routes = []Route{{Topics: []string{"d"}, Targets: []Target{{Sink: flaky}}}, {Topics: []string{"g"}, Targets: []Target{{Sink: good}}}}
		cfg.Workers = 1 // one claim loop, so that one probe is all a pause allows
		cfg.Clock = clock.now
		cfg.SinkPause = Backoff{Initial: time.Hour, Max: time.Hour, Jitter: -1}
		cfg.Lease, cfg.PublishTimeout = 2*time.Minute, time.Minute // held until the gate opens
		const keys = 8
		var evs []ev
		for i := range 2 * keys {
			evs = append(evs, ev{topic: "d", key: fmt.Sprintf("k%d", i%keys)})
		}
		seqs := b.insert(t, evs...)
		var r *Relay
		b.start(t, cfg, func(started *Relay) { r = started })
		waitFor(t, time.Minute, "the sink to be paused with every event queued", func() bool {
			return len(r.PausedSinks()) == 1 && b.countDeliveries(t, "sink = 'flaky'") == len(seqs)
		})
		calls := len(flaky.callKeys())
		holding.Store(true)
		clock.advance(time.Hour + time.Second)
		flaky.waitHeld(t, 1) // the probe, taking its time to fail
		var goodSeqs []int64
		for i := range 5 {
			goodSeqs = append(goodSeqs, b.insert(t, ev{topic: "g", key: fmt.Sprintf("g%d", i)})...)
			waitFor(t, time.Minute, "the good sink to get the batch", func() bool { return len(b.rec.forSink("good")) == len(goodSeqs) })
		}
		if got := len(flaky.callKeys()) - calls; got != 1 {
			t.Fatalf("%d calls to the paused sink during one pause, want its one probe", got)
		}
		// The probe fails; the sink is paused again, probed once more an
		// hour later, and back.
		flaky.open()
		// Recorded: its head is no longer leased for the call (due a
		// minute and more later) but due again.
		leased := "sink = 'flaky' AND state = 'ready' AND next_at > " + b.db.now() + " + INTERVAL '30' SECOND"
		waitFor(t, time.Minute, "the probe to fail and be recorded", func() bool {
			return flaky.held.Load() == 0 && b.countDeliveries(t, leased) == 0
		})
		if got := len(flaky.callKeys()) - calls; got != 1 {
			t.Fatalf("%d calls to the paused sink during one pause, want its one probe", got)
		}
		down.Store(false)
		clock.advance(time.Hour + time.Second)
		waitFor(t, time.Minute, "every event delivered and the queue empty", func() bool {
			return len(b.rec.forSink("flaky")) >= len(seqs) && b.countDeliveries(t, "true") == 0
		})
		exactlyOnce(t, b.rec.all(), "flaky", seqs)
		exactlyOnce(t, b.rec.all(), "good", goodSeqs)
		checkKeyOrder(t, b.rec.all())
	})
}

// countingObserver counts SinkPublish calls and the events they carried.
type countingObserver struct {
	NopObserver
	mu     sync.Mutex
	events map[string]int
}

func (o *countingObserver) SinkPublish(sink string, events int, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if took <= 0 {
		events = -1000 // a duration must be measured
	}
	o.events[sink] += events
}

// TestPublishedCountsAreFlushed: counts reach the stats table by the end of
// Run (and every few seconds before), and rows older than a day go.
//
// PostgreSQL only: it reads the stats table with PostgreSQL's SQL.
func TestPublishedCountsAreFlushed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+b.tables.Stats()+" (minute, sink, topic, published) VALUES (now() - interval '25 hours', 'a', 't', 5), (now() - interval '23 hours', 'a', 't', 6)"); err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{events: map[string]int{}}
	cfg := b.config(t, &testSink{name: "a", rec: b.rec}, &testSink{name: "b", rec: b.rec})
	cfg.Observer = obs
	cfg.MetricsTopics = []string{"t0", "t1", "t2"}
	var evs []ev
	for i := range 30 {
		evs = append(evs, ev{topic: fmt.Sprintf("t%d", i%3)})
	}
	b.insert(t, evs...)
	stop := b.start(t, cfg)
	waitFor(t, time.Minute, "all delivered", func() bool { return len(b.rec.all()) == 60 })
	stop()
	rows, err := b.pool.Query(ctx, "SELECT sink, topic, sum(published) FROM "+b.tables.Stats()+" WHERE minute > now() - interval '1 hour' GROUP BY 1, 2 ORDER BY 1, 2")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for rows.Next() {
		var sink, topic string
		var n int64
		if err := rows.Scan(&sink, &topic, &n); err != nil {
			t.Fatal(err)
		}
		got[sink+"/"+topic] = n
	}
	want := map[string]int64{"a/t0": 10, "a/t1": 10, "a/t2": 10, "b/t0": 10, "b/t1": 10, "b/t2": 10}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stats = %v, want %v", got, want)
	}
	var old int64
	if err := b.pool.QueryRow(ctx, "SELECT coalesce(sum(published), 0) FROM "+b.tables.Stats()+" WHERE minute < now() - interval '1 hour'").Scan(&old); err != nil || old != 6 {
		t.Fatalf("older rows: %d (%v), want only the 23-hour-old 6", old, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.events["a"] != 30 || obs.events["b"] != 30 {
		t.Fatalf("SinkPublish saw %v", obs.events)
	}
}

// headerSink records the headers each event arrives with.
type headerSink struct {
	mu      sync.Mutex
	headers []map[string]string
}

func (s *headerSink) Name() string { return "hdr" }
func (s *headerSink) Publish(_ context.Context, events []sinks.Event) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range events {
		s.headers = append(s.headers, e.Headers)
	}
	return make([]error, len(events))
}
func (s *headerSink) Close(context.Context) error { return nil }

func (s *headerSink) got() []map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]string(nil), s.headers...)
}

// PostgreSQL only: it inserts headers with PostgreSQL's SQL; carrying them
// is the engine's work, not the store's.
func TestPublishSpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	hs := &headerSink{}
	cfg := b.config(t, hs)
	cfg.TracerProvider = tp
	const producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := b.pool.Exec(context.Background(), "INSERT INTO "+b.tables.Outbox()+` (topic, headers) VALUES
  ('traced', '{"traceparent": "`+producer+`", "tracestate": "vendor=x", "x-tenant": "acme"}'),
  ('untraced', '{}')`); err != nil {
		t.Fatal(err)
	}
	b.start(t, cfg)
	waitFor(t, time.Minute, "both delivered", func() bool { return len(hs.got()) == 2 })
	// A span ends after Publish returns, so after the sink has the event.
	waitFor(t, time.Minute, "both spans ended", func() bool { return len(exp.GetSpans()) >= 2 })
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	traced, ok := byName["publish traced"]
	if !ok || traced.SpanKind != trace.SpanKindProducer {
		t.Fatalf("spans: %v", byName)
	}
	if traced.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || traced.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("publish span is not the producer's child: trace %s parent %s", traced.SpanContext.TraceID(), traced.Parent.SpanID())
	}
	for _, h := range hs.got() {
		if h["x-tenant"] == "acme" {
			want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + traced.SpanContext.SpanID().String() + "-01"
			if h["traceparent"] != want || h["tracestate"] != "vendor=x" {
				t.Fatalf("sink got traceparent %q tracestate %q, want %q", h["traceparent"], h["tracestate"], want)
			}
		} else if root := byName["publish untraced"]; h["traceparent"] != "00-"+root.SpanContext.TraceID().String()+"-"+root.SpanContext.SpanID().String()+"-01" || root.Parent.IsValid() {
			t.Fatalf("untraced event: headers %v, span %+v", h, root.SpanContext)
		}
	}
}

func TestNoTracingLeavesHeadersAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hs := &headerSink{}
	if _, err := b.pool.Exec(context.Background(), "INSERT INTO "+b.tables.Outbox()+` (topic, headers) VALUES ('x', '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'), ('y', '{}')`); err != nil {
		t.Fatal(err)
	}
	b.start(t, b.config(t, hs))
	waitFor(t, time.Minute, "both delivered", func() bool { return len(hs.got()) == 2 })
	for _, h := range hs.got() {
		if len(h) == 1 && h["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
			continue
		}
		if len(h) != 0 {
			t.Fatalf("headers changed without tracing: %v", h)
		}
	}
}

// labelObserver records the topic labels it is given.
type labelObserver struct {
	NopObserver
	mu     sync.Mutex
	labels map[string]int
}

func (o *labelObserver) Published(_, topic string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.labels[topic]++
}

// TestTopicLabelsAreBounded covers 100,000 distinct topics, which grew the
// relay's memory from 35 to 218 MB for good and /metrics to 12 MB: the
// observer and the published counts see each event's topic label, the first
// of relay.metrics_topics its topic matches, or relay.OtherTopics.
//
// PostgreSQL only: it reads the stats table with PostgreSQL's SQL.
func TestTopicLabelsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &labelObserver{labels: map[string]int{}}
	cfg := b.config(t, &testSink{name: "mem", rec: b.rec})
	cfg.MetricsTopics = []string{"orders.*"}
	cfg.Observer = obs
	var evs []ev
	for i := range 1000 {
		evs = append(evs, ev{topic: fmt.Sprintf("tenant-%d.created", i)})
	}
	evs = append(evs, ev{topic: "orders.paid"}, ev{topic: "orders.created"})
	b.insert(t, evs...)
	b.start(t, cfg)
	// The observer hears of an event after the sink has it: wait on the
	// observer's own count.
	var got string
	waitFor(t, time.Minute, "every event observed", func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		n := 0
		for _, c := range obs.labels {
			n += c
		}
		got = fmt.Sprint(obs.labels)
		return n >= len(evs)
	})
	if got != "map[(other):1000 orders.*:2]" {
		t.Fatalf("labels %s, want orders.* twice and other for the rest", got)
	}
	waitFor(t, time.Minute, "the published counts flushed, under the labels", func() bool {
		var topics []string
		rows, err := b.pool.Query(context.Background(), "SELECT DISTINCT topic FROM "+b.tables.Stats()+" ORDER BY topic")
		if err != nil {
			t.Fatal(err)
		}
		if topics, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(topics) == "[(other) orders.*]"
	})
}
