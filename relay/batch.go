package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/sinks"
)

// targetStatus is what happens to one event on one sink in one batch.
type targetStatus uint8

const (
	tSend     targetStatus = iota // handed to the sink
	tJoin                         // not sent: it waits behind an earlier event of its key
	tPaused                       // not sent: the sink is paused
	tBusy                         // not sent: the sink has as much in flight as it may
	tDone                         // delivered (or, on the routing step, routed)
	tRetry                        // failed; tried again after its delay
	tDown                         // not delivered: the sink is down (no attempt counted)
	tDead                         // failed for good
	tInFlight                     // sent, not answered when the batch stopped waiting
	tHeld                         // not sent: its route no longer names its sink; kept, looked at again later
)

// target is one event on one sink, or on the routing step, in one batch.
type target struct {
	item   *item
	sink   *sinkState // nil for the routing step
	name   string     // the sink's name; "" for the routing step
	status targetStatus
	delay  time.Duration // tRetry: how long until the next attempt
	err    error         // tRetry, tDown, tPaused, tDead: why
	tries  int           // attempts on this sink, this batch's included
	stops  bool          // tDead: the dead letter stops its key
	// fresh: the event has no delivery on this sink yet (an outbox row, or
	// a routing-step delivery on a sink); a failure inserts one.
	fresh bool
	// leased: the delivery is a head in flight, due only when its call
	// must have ended (see flight): whatever its outcome, it is written.
	leased bool
	// call and at: tSend, the call the event went out in and its index
	// there.
	call *sinkCall
	at   int
}

type keySink struct{ key, sink string }

// batch carries one claimed batch through plan, publish, settle and the
// outcome its record writes.
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
	// late are the targets of flights of earlier batches whose results
	// have all arrived, settled in this batch's record, before its own.
	late []target
	// blocked holds the keys on sinks to which nothing more is sent in
	// this batch (made on first use: nothing is blocked on the happy path).
	blocked map[keySink]bool
	calls   map[*sinkState]*sinkCall
	order   []*sinkCall
	counts  struct{ done, retried, dead, waiting, paused, busy, inFlight int }
}

func (w *worker) newBatch(fresh, queued []item, now time.Time) *batch {
	n := (len(fresh) + len(queued)) * (w.r.fanOut + 1)
	return &batch{r: w.r, w: w, now: now, fresh: fresh, queued: queued,
		targets: make([]target, 0, n), calls: map[*sinkState]*sinkCall{}}
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
		// Its sink was removed from the event's route (a configuration
		// that lost a line, or a route changed on purpose): the delivery
		// is kept, its key's queue waiting behind it, and looked at again
		// once in a while: a configuration that routes it again sends it,
		// in order, and only an operator drops it.
		t.status, t.delay = tHeld, heldPolls*b.r.cfg.PollInterval
		t.err = fmt.Errorf("kept: the route of topic %q no longer names sink %s (it resumes if a route names it again; 'relay queue drop --sink' removes it)", it.topic, it.sink)
		b.block(it.sink, it.key)
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

// planSend hands t's event to its sink, unless the sink is paused or busy,
// or the destination cannot be rendered.
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
	if !t.sink.take(int64(len(ev.Payload))) {
		t.status = tBusy
		b.block(t.name, t.item.key)
		return
	}
	ev.Destination = dest
	c := b.calls[t.sink]
	if c == nil {
		c = &sinkCall{w: b.w, sink: t.sink}
		b.calls[t.sink] = c
		b.order = append(b.order, c)
	}
	t.status, t.call, t.at = tSend, c, len(c.events)
	var span trace.Span
	if b.r.tracer != nil {
		span = b.r.startPublishSpan(&ev, t.name)
	}
	var chainAt int32
	if t.item.delivery && t.item.sink == t.name {
		chainAt = t.item.chainAt
	}
	c.add(ev, len(b.targets)-1, span, chainAt)
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

// publish starts each sink's call, all at once, and waits until every
// event has its result, or wait has passed: a sink's latency then delays
// only its own events, which stay in flight (see flight), and never the
// other sinks', nor the next batch. The calls end by deadline.
func (b *batch) publish(ctx context.Context, deadline time.Time, wait time.Duration) {
	for _, c := range b.order {
		b.r.probeStarted(c.sink)
		c.start(ctx, deadline)
	}
	if b.answered() {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-b.w.results:
			if b.answered() {
				return
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// answered reports whether every call of the batch has every result.
func (b *batch) answered() bool {
	for _, c := range b.order {
		if !c.answered() {
			return false
		}
	}
	return true
}

// settle gives each sent target its result, or tInFlight while it has
// none.
func (b *batch) settle() {
	for i := range b.targets {
		t := &b.targets[i]
		if t.status != tSend {
			continue
		}
		err, ok := t.call.result(t.at)
		if !ok {
			t.status = tInFlight
			continue
		}
		b.r.judge(t, err)
	}
}

// judge sets t's status from its sink's result err (nil: delivered).
func (r *Relay) judge(t *target, err error) {
	switch {
	case err == nil:
		t.status = tDone
	case sinks.IsUnavailable(err):
		t.status, t.err = tDown, err
	case errors.Is(err, sinks.ErrNotSent):
		t.status, t.err = tBusy, err
	case errors.Is(err, sinks.ErrSkipped):
		t.status, t.err = tJoin, err
	case sinks.IsPermanent(err):
		t.tries++
		t.status, t.err, t.stops = tDead, err, r.cfg.StopKeyOnDeadLetter && t.item.key != ""
	default:
		t.tries++
		t.err = err
		if t.tries >= r.maxAttempts(t.item) {
			t.status, t.stops = tDead, r.cfg.StopKeyOnDeadLetter && t.item.key != ""
		} else {
			t.status, t.delay = tRetry, r.retryDelay(err, t.tries)
		}
	}
}

// outcome walks every group in order (the late targets first) and turns
// its targets into the writes of the record. Once a target of a group is
// not delivered, it is the head of its key's queue on that sink, and every
// later target of the group waits behind it, whatever the sink reported for
// it (a sink that sent it anyway sends it again, after the head). A head
// still in flight starts a flight, which takes the group's later targets
// sent in the same call: it returns the flights the record hands off.
func (b *batch) outcome() (*outcome, []*flight) {
	o := &outcome{keyOf: b.keyOf}
	o.OutboxSeqs, o.OutboxKeys = make([]int64, 0, len(b.fresh)), make([]string, 0, len(b.fresh))
	for i := range b.fresh {
		if b.fresh[i].logged == nil { // an event read from the log has no row
			o.OutboxSeqs, o.OutboxKeys = append(o.OutboxSeqs, b.fresh[i].seq), append(o.OutboxKeys, b.fresh[i].key)
		}
	}
	var (
		waiting map[keySink]bool    // an earlier target of the key on the sink is not delivered
		wrote   map[keySink]bool    // queues written, whose head may have changed
		open    map[keySink]*flight // the flight of the key on the sink, taking its call's later targets
		flights []*flight
	)
	walk := func(t *target) {
		ks := keySink{t.item.key, t.name}
		status := t.status
		if f := open[ks]; f != nil {
			if t.call == f.call {
				f.add(t)
			} else {
				delete(open, ks) // a flight takes its call's targets only
			}
		}
		if t.item.key != "" && status != tJoin && waiting[ks] {
			status = tJoin
		}
		if status == tInFlight {
			f := b.w.newFlight(t)
			flights = append(flights, f)
			if t.item.key != "" {
				if open == nil {
					open = map[keySink]*flight{}
				}
				open[ks] = f
			}
		}
		if b.settleTarget(o, t, status) && t.item.key != "" && !wrote[ks] {
			if wrote == nil {
				wrote = map[keySink]bool{}
			}
			wrote[ks] = true
			o.PromoteKeys = append(o.PromoteKeys, ks.key)
			o.PromoteSinks = append(o.PromoteSinks, ks.sink)
		}
		if holdsKey(status, t.stops) {
			if waiting == nil {
				waiting = map[keySink]bool{}
			}
			waiting[ks] = true
		}
	}
	for i := range b.late {
		walk(&b.late[i])
	}
	for i := range b.targets {
		walk(&b.targets[i])
	}
	return o, flights
}

// heldPolls is how many poll intervals a delivery whose route no longer
// names its sink waits before the relay looks at it again: a configuration
// that routes it again resumes its queue within that, and a key held so
// costs one row written per look.
const heldPolls = 10

// holdsKey reports whether a target of this status holds back the later
// events of its key on its sink.
func holdsKey(status targetStatus, stops bool) bool {
	switch status {
	case tJoin, tPaused, tBusy, tDown, tRetry, tInFlight, tHeld:
		return true
	case tDead:
		return stops
	}
	return false
}

// lanes is the mask of the lanes of the batch's events, its late ones
// included: the lanes its record writes in.
func (b *batch) lanes() uint64 {
	var mask uint64
	for _, items := range [][]item{b.fresh, b.queued} {
		for i := range items {
			mask |= 1 << uint(items[i].lane)
		}
	}
	for i := range b.late {
		mask |= 1 << uint(b.late[i].item.lane)
	}
	return mask
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
	for i := range b.late {
		if b.late[i].item.seq == seq {
			return b.late[i].item.key
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
			b.r.cfg.Observer.Published(t.name, label, b.w.age(it.createdAt, b.now))
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
			o.insert(it, t.name, store.Waiting, false, 0, 0, nil)
			return true
		}
		return false // it waits already (or stays in flight), untouched

	case tPaused, tDown, tBusy:
		if status == tBusy {
			b.counts.busy++
		} else {
			b.counts.paused++
			b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "paused")
		}
		switch {
		case t.fresh:
			o.insert(it, t.name, store.Ready, false, t.tries, 0, t.err)
		case it.head && !t.leased:
			return false // the head stays due; nothing to write while its sink cannot take it
		default:
			addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, 0, t.err)
		}
		return true

	case tRetry:
		b.counts.retried++
		b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "retry")
		b.r.logEvent(it, t.name, "relay: delivery failed, will retry", t.err, "retry_in", t.delay)
		if t.fresh {
			o.insert(it, t.name, store.Ready, false, t.tries, t.delay, t.err)
		} else {
			addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, t.delay, t.err)
		}
		return true

	case tDead:
		b.counts.dead++
		sink := "" // the routing step's
		if t.sink != nil {
			sink = t.name
			b.r.cfg.Observer.Failed(t.name, b.r.label(it.topic), "dead")
		}
		b.r.cfg.Observer.DeadLettered(sink, b.r.label(it.topic))
		b.r.logEvent(it, t.name, "relay: event dead-lettered", t.err, "stops_key", t.stops)
		switch {
		case t.fresh:
			o.insert(it, t.name, store.Dead, t.stops, t.tries, 0, t.err)
		case t.stops:
			addDelivery(&o.Heads, it.seq, t.name, store.Dead, true, t.tries, 0, t.err)
		default:
			addDelivery(&o.Demote, it.seq, t.name, store.Dead, false, t.tries, 0, t.err)
		}
		return true

	case tHeld:
		b.counts.waiting++
		addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, t.delay, t.err)
		return true

	case tInFlight:
		// Handed to the sink's queue as its key's head, due only once
		// its call must have ended: the queue claims of this relay leave
		// it alone meanwhile, and another relay that takes the lane over
		// sends it again only then. No attempt is counted yet.
		b.counts.inFlight++
		lease := b.w.flightLease(t.call)
		if t.fresh {
			o.insert(it, t.name, store.Ready, false, t.tries, lease, nil)
		} else {
			addDelivery(&o.Heads, it.seq, t.name, store.Ready, false, t.tries, lease, nil)
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
