package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/sinks"
)

// targetStatus is what happens to one event on one sink in one batch.
type targetStatus uint8

const (
	tSend   targetStatus = iota // handed to the sink
	tJoin                       // not sent: it waits behind an earlier event of its key
	tPaused                     // not sent: the sink is paused
	tDone                       // delivered (or, on the routing step, routed)
	tRetry                      // failed; tried again at next
	tDown                       // not delivered: the sink is down (no attempt counted)
	tDead                       // failed for good
)

// target is one event on one sink, or on the routing step, in one batch.
type target struct {
	item   *item
	sink   *sinkState // nil for the routing step
	name   string     // the sink's name; "" for the routing step
	status targetStatus
	next   time.Time // tRetry: when to try again
	err    error     // tRetry, tDown, tPaused, tDead: why
	tries  int       // attempts on this sink, this batch's included
	stops  bool      // tDead: the dead letter stops its key
	// fresh: the event has no delivery on this sink yet (an outbox row, or
	// a routing-step delivery on a sink); a failure inserts one.
	fresh   bool
	batched int // tSend: index in the sink's batch
}

type keySink struct{ key, sink string }

// sinkBatch is the events one sink receives in one Publish call.
type sinkBatch struct {
	sink    *sinkState
	events  []sinks.Event
	targets []int // targets[i] is the index in batch.targets of events[i]
	results []error
	spans   []trace.Span // spans[i] traces events[i]; nil when tracing is off
}

// sinkState is a sink shared by a relay's workers: Publish calls are
// serialised (a sink never sees two at once), and whether it is paused
// because it is down.
type sinkState struct {
	sinks.Sink
	name string
	// concurrent sinks (sinks.ConcurrentPublisher) are called by several
	// workers at once; the others take turns under publishMu.
	concurrent bool
	publishMu  sync.Mutex

	mu          sync.Mutex // guards failures and pausedUntil
	failures    int
	pausedUntil time.Time
}

// pausedTill returns until when the sink is paused (zero when it is not).
func (s *sinkState) pausedTill() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pausedUntil
}

// probing reports whether the sink was found down and its pause is over:
// the next publish finds out whether it is back.
func (s *sinkState) probing(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures > 0 && !s.pausedUntil.After(now)
}

// batch carries one claimed batch through plan, publish and settle.
type batch struct {
	r      *Relay
	w      *worker
	now    time.Time
	fresh  []item // outbox rows, in seq order
	queued []item // deliveries, queue by queue, each head first
	// targets are every event on every sink (and on the routing step when
	// that writes something), in plan order: for one key on one sink, in
	// seq order. What a failure means for a key's later events is applied
	// over them, once (outcome).
	targets []target
	// blocked holds the keys on sinks to which nothing more is sent in
	// this batch (made on first use: nothing is blocked on the happy path).
	blocked map[keySink]bool
	sinks   map[*sinkState]*sinkBatch
	order   []*sinkBatch
	counts  struct{ done, retried, dead, waiting, paused int }
}

func (w *worker) newBatch(fresh, queued []item, now time.Time) *batch {
	n := (len(fresh) + len(queued)) * (w.r.fanOut + 1)
	return &batch{r: w.r, w: w, now: now, fresh: fresh, queued: queued,
		targets: make([]target, 0, n), sinks: map[*sinkState]*sinkBatch{}}
}

// add appends a target and returns it; it stays valid until the next add.
func (b *batch) add(t target) *target {
	b.targets = append(b.targets, t)
	return &b.targets[len(b.targets)-1]
}

// isBlocked reports whether nothing more of key goes to sink in this batch.
func (b *batch) isBlocked(sink, key string) bool {
	return key != "" && b.blocked[keySink{key, sink}]
}

// block sends nothing more of key to sink in this batch.
func (b *batch) block(sink, key string) {
	if key == "" {
		return
	}
	if b.blocked == nil {
		b.blocked = map[keySink]bool{}
	}
	b.blocked[keySink{key, sink}] = true
}

// plan decides which sink gets which event now. Queued deliveries come
// first, each queue head first; then outbox rows in seq order. For a key on
// a sink, once an event is not sent (it waits, its sink is paused, or it
// died stopping its key), the later ones are not sent either.
func (b *batch) plan() {
	for i := range b.queued {
		it := &b.queued[i]
		if it.sink == "" {
			b.planFresh(it)
		} else {
			b.planQueued(it)
		}
	}
	for i := range b.fresh {
		b.planFresh(&b.fresh[i])
	}
}

// planQueued plans a delivery claimed from a sink's queue.
func (b *batch) planQueued(it *item) {
	t := b.add(target{item: it, name: it.sink, sink: b.r.sinkStates[it.sink], tries: it.attempts})
	if b.isBlocked(it.sink, it.key) {
		t.status = tJoin
		return
	}
	if it.decodeErr != nil {
		b.kill(t, fmt.Errorf("event %s cannot be read: %w", it.id, it.decodeErr), b.stopsKey(it))
		return
	}
	// Filters see only the event's own data, so the same route applies as
	// when the event was routed, unless the configuration changed.
	route, _ := b.r.route(it)
	switch {
	case route == nil || !route.has(it.sink):
		// Its sink was removed from the event's route: the event will not
		// go there, and the key's later events (which do not either) are
		// not held back by it.
		b.kill(t, fmt.Errorf("sink no longer routed: the route of topic %q does not name sink %s", it.topic, it.sink), false)
	default:
		b.planSend(t, route.target(it.sink))
	}
}

// planFresh plans an event not yet routed: an outbox row, or a delivery of
// the routing step (replayed, or waiting behind one). A routed outbox row
// writes nothing for the routing step, so it has no target there.
func (b *batch) planFresh(it *item) {
	routing := func(status targetStatus) *target {
		return b.add(target{item: it, name: "", fresh: !it.delivery, status: status})
	}
	if b.isBlocked("", it.key) || (!it.delivery && slices.Contains(it.queued, "")) {
		routing(tJoin)
		b.block("", it.key)
		return
	}
	if it.decodeErr != nil {
		b.kill(routing(tDead), fmt.Errorf("event %s cannot be read: %w", it.id, it.decodeErr), b.stopsKey(it))
		return
	}
	route, err := b.r.route(it)
	if route == nil {
		b.kill(routing(tDead), err, b.stopsKey(it))
		return
	}
	if it.delivery {
		routing(tDone) // its row on the routing step goes
	}
	for i := range route.targets {
		rtg := &route.targets[i]
		name := rtg.state.name
		if slices.Contains(it.elsewhere, name) {
			continue // the event waits, or died, there already
		}
		t := b.add(target{item: it, sink: rtg.state, name: name, fresh: true})
		if b.isBlocked(name, it.key) || slices.Contains(it.queued, name) {
			t.status = tJoin
			b.block(name, it.key)
			continue
		}
		b.planSend(t, rtg)
	}
}

// planSend hands t's event to its sink, unless the sink is paused or the
// destination cannot be rendered.
func (b *batch) planSend(t *target, rt *routeTarget) {
	if until := t.sink.pausedTill(); until.After(b.now) {
		t.status = tPaused
		t.err = fmt.Errorf("sink %s is paused after failing as a whole", t.name)
		b.block(t.name, t.item.key)
		return
	}
	ev := b.event(t.item, t.tries+1)
	dest, err := rt.destination(&ev)
	if err != nil {
		t.tries++
		b.kill(t, sinks.Permanent(err), b.stopsKey(t.item))
		return
	}
	ev.Destination = dest
	sb := b.sinks[t.sink]
	if sb == nil {
		sb = &sinkBatch{sink: t.sink}
		b.sinks[t.sink] = sb
		b.order = append(b.order, sb)
	}
	t.status = tSend
	if b.r.tracer != nil {
		sb.spans = append(sb.spans, b.r.startPublishSpan(&ev, t.name))
	}
	sb.events = append(sb.events, ev)
	sb.targets = append(sb.targets, len(b.targets)-1)
}

// kill makes t a dead letter before it is sent; one that stops its key
// holds back the key's later events on t's sink.
func (b *batch) kill(t *target, err error, stops bool) {
	t.status, t.err, t.stops = tDead, err, stops
	if stops {
		b.block(t.name, t.item.key)
	}
}

// stopsKey reports whether a dead letter of it stops its key.
func (b *batch) stopsKey(it *item) bool { return b.r.cfg.StopKeyOnDeadLetter && it.key != "" }

func (b *batch) event(it *item, attempt int) sinks.Event {
	return sinks.Event{ID: it.id, Seq: it.seq, Topic: it.topic, Key: it.key, Payload: it.payload,
		ContentType: it.contentType, Headers: it.headers, CreatedAt: it.createdAt, Attempt: attempt}
}

// publish hands each sink its events, all sinks at once, and waits.
func (b *batch) publish(ctx context.Context) {
	var wg sync.WaitGroup
	for _, sb := range b.order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			sb.results = publishSafely(ctx, sb.sink, sb.events)
			b.r.cfg.Observer.SinkPublish(sb.sink.name, len(sb.events), time.Since(start))
		}()
	}
	wg.Wait()
}

// publishSafely calls Publish, turning a panic or a wrong result count into
// retryable errors for every event: nothing is lost to a faulty sink.
func publishSafely(ctx context.Context, s *sinkState, events []sinks.Event) (results []error) {
	defer func() {
		if p := recover(); p != nil {
			results = sinks.Fill(len(events), fmt.Errorf("sink %s panicked: %v", s.name, p))
		}
	}()
	if !s.concurrent {
		s.publishMu.Lock()
		defer s.publishMu.Unlock()
	}
	results = s.Publish(ctx, events)
	if len(results) != len(events) {
		return sinks.Fill(len(events), fmt.Errorf("sink %s returned %d results for %d events", s.name, len(results), len(events)))
	}
	return results
}

// settle applies the sinks' results to their targets and pauses or resumes
// each sink.
func (b *batch) settle() {
	for _, sb := range b.order {
		var down error
		delivered := false
		for i, err := range sb.results {
			t := &b.targets[sb.targets[i]]
			switch {
			case err == nil:
				t.status = tDone
				delivered = true
			case sinks.IsUnavailable(err):
				t.status, t.err = tDown, err
				if down == nil {
					down = err
				}
			case errors.Is(err, sinks.ErrSkipped):
				t.status, t.err = tJoin, err
			case sinks.IsPermanent(err):
				t.tries++
				t.status, t.err, t.stops = tDead, err, b.stopsKey(t.item)
			default:
				t.tries++
				t.err = err
				if t.tries >= b.r.maxAttempts(t.item) {
					t.status, t.stops = tDead, b.stopsKey(t.item)
				} else {
					t.status, t.next = tRetry, b.now.Add(b.r.retryDelay(err, t.tries))
				}
			}
		}
		switch {
		case down != nil:
			b.r.pause(sb.sink, down)
		case delivered:
			b.r.resume(sb.sink)
		}
		endPublishSpans(sb)
	}
}

// outcome walks every group in order and turns its targets into the writes
// of the record. Once a target of a group is not delivered, it is the head
// of its key's queue on that sink, and every later target of the group
// waits behind it, whatever the sink reported for it (a sink that sent it
// anyway sends it again, after the head).
func (b *batch) outcome() *outcome {
	o := &outcome{keyOf: b.keyOf}
	o.OutboxSeqs, o.OutboxKeys = make([]int64, len(b.fresh)), make([]string, len(b.fresh))
	for i := range b.fresh {
		o.OutboxSeqs[i], o.OutboxKeys[i] = b.fresh[i].seq, b.fresh[i].key
	}
	var (
		waiting map[keySink]bool // an earlier target of the key on the sink is not delivered
		wrote   map[keySink]bool // queues written, whose head may have changed
	)
	for i := range b.targets {
		t := &b.targets[i]
		ks := keySink{t.item.key, t.name}
		status := t.status
		if t.item.key != "" && status != tJoin && waiting[ks] {
			status = tJoin
		}
		if b.settleTarget(o, t, status) && t.item.key != "" && !wrote[ks] {
			if wrote == nil {
				wrote = map[keySink]bool{}
			}
			wrote[ks] = true
			o.PromoteKeys = append(o.PromoteKeys, ks.key)
			o.PromoteSinks = append(o.PromoteSinks, ks.sink)
		}
		if status == tJoin || status == tPaused || status == tDown || status == tRetry || (status == tDead && t.stops) {
			if waiting == nil {
				waiting = map[keySink]bool{}
			}
			waiting[ks] = true
		}
	}
	return o
}

// keyOf returns the key of the batch's event seq.
func (b *batch) keyOf(seq int64) string {
	for _, items := range [][]item{b.fresh, b.queued} {
		for i := range items {
			if items[i].seq == seq {
				return items[i].key
			}
		}
	}
	return ""
}

// settleTarget adds the writes of one target whose status is final, and
// reports whether it wrote anything.
func (b *batch) settleTarget(o *outcome, t *target, status targetStatus) bool {
	it := t.item
	switch status {
	case tDone:
		switch {
		case t.sink != nil:
			b.counts.done++
			label := b.r.label(it.topic)
			b.r.cfg.Observer.Published(t.name, label, b.now.Sub(it.createdAt))
			b.w.countPublished(t.name, label, b.now)
		case !it.delivery:
			return false // routed: the outbox row goes with the batch
		}
		if t.fresh {
			return false
		}
		o.Delete(t.name, it.seq)
		return true

	case tJoin:
		// Not attempted as far as its key's order goes, whatever the sink
		// did: no attempt is counted.
		b.counts.waiting++
		if t.fresh {
			o.insert(it, t.name, store.Waiting, false, 0, time.Time{}, nil)
			return true
		}
		return false // it waits already, untouched

	case tPaused, tDown:
		b.counts.paused++
		b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "paused")
		switch {
		case t.fresh:
			o.insert(it, t.name, store.Ready, false, t.tries, time.Time{}, t.err)
		case it.head:
			return false // the head stays due; nothing to write while its sink is down
		default:
			addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, time.Time{}, t.err)
		}
		return true

	case tRetry:
		b.counts.retried++
		b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "retry")
		b.r.logEvent(it, t.name, "relay: delivery failed, will retry", t.err, "retry_at", t.next)
		if t.fresh {
			o.insert(it, t.name, store.Ready, false, t.tries, t.next, t.err)
		} else {
			addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, t.next, t.err)
		}
		return true

	case tDead:
		b.counts.dead++
		if t.sink != nil {
			b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "dead")
		}
		b.r.cfg.Observer.DeadLettered(b.r.label(it.topic))
		b.r.logEvent(it, t.name, "relay: event dead-lettered", t.err, "stops_key", t.stops)
		switch {
		case t.fresh:
			o.insert(it, t.name, store.Dead, t.stops, t.tries, time.Time{}, t.err)
		case t.stops:
			addDelivery(&o.Heads, it.seq, t.name, store.Dead, true, t.tries, time.Time{}, t.err)
		default:
			addDelivery(&o.Demote, it.seq, t.name, store.Dead, false, t.tries, time.Time{}, t.err)
		}
		return true
	}
	return false
}

// startPublishSpan starts the span of one event on one sink, as a child of
// the producer's trace context carried in the event's headers, and gives the
// event a copy of its headers carrying the new span's context instead.
func (r *Relay) startPublishSpan(ev *sinks.Event, sink string) trace.Span {
	parent := r.cfg.Propagator.Extract(context.Background(), propagation.MapCarrier(ev.Headers))
	ctx, span := r.tracer.Start(parent, "publish "+ev.Destination,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.message.id", ev.ID),
			attribute.String("messaging.destination.name", ev.Destination),
			attribute.String("herald.sink", sink),
			attribute.String("herald.topic", ev.Topic),
			attribute.Int("herald.attempt", ev.Attempt),
		))
	headers := make(map[string]string, len(ev.Headers)+2)
	for k, v := range ev.Headers {
		if k != "traceparent" && k != "tracestate" {
			headers[k] = v
		}
	}
	r.cfg.Propagator.Inject(ctx, propagation.MapCarrier(headers))
	ev.Headers = headers
	return span
}

// endPublishSpans ends the spans of a sink's batch with each event's result.
func endPublishSpans(sb *sinkBatch) {
	for i, span := range sb.spans {
		if err := sb.results[i]; err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
