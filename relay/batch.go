package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/sinks"
)

// forever marks a hold or a parked event waiting for an operator (the key
// was stopped by a dead letter). It is stored as PostgreSQL 'infinity'.
var forever = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// targetStatus is what happens to one event on one sink in one batch.
type targetStatus uint8

const (
	tSend        targetStatus = iota // handed to the sink
	tAlreadyDone                     // delivered in an earlier attempt
	tAlreadyDead                     // failed for good in an earlier attempt
	tParked                          // waits behind an earlier event of its key
	tWaiting                         // waits for its own retry time on this sink
	tPaused                          // the sink is down
	tDone                            // delivered now
	tRetry                           // failed now, will be retried
	tDead                            // failed now for good
)

type target struct {
	sink    *sinkState
	status  targetStatus
	until   time.Time // tParked, tWaiting, tPaused, tRetry: when to look again
	err     error     // the failure, for tRetry, tDead, tPaused
	tries   int       // attempts on this sink after this batch
	batched int       // index in the sink's batch, for tSend
}

// rowPlan is one claimed row's work: its targets, or why it is dead at once.
type rowPlan struct {
	targets []target
	deadErr error
}

type keySink struct{ key, sink string }

// sinkBatch is the events one sink receives in one Publish call.
type sinkBatch struct {
	sink    *sinkState
	events  []sinks.Event
	rows    []int // rows[i] is the row index of events[i]
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

// batch carries one claimed batch through plan, publish and settle.
type batch struct {
	r      *Relay
	w      *worker
	now    time.Time
	rows   []row
	plans  []rowPlan
	sinks  map[*sinkState]*sinkBatch
	order  []*sinkBatch
	counts struct{ done, retried, dead, parked, paused int }
}

func (w *worker) newBatch(rows []row, now time.Time) *batch {
	return &batch{r: w.r, w: w, now: now, rows: rows, plans: make([]rowPlan, len(rows)), sinks: map[*sinkState]*sinkBatch{}}
}

// plan decides, in seq order, which sink gets which event now. An event is
// parked on a sink while an earlier event of its key waits on that sink —
// a hold from an earlier batch whose event is not in this one, or an
// earlier event in this batch that is itself parked or whose sink is down.
func (b *batch) plan() {
	inBatch := make(map[int64]bool, len(b.rows))
	for i := range b.rows {
		inBatch[b.rows[i].seq] = true
	}
	blocked := map[keySink]time.Time{}
	for i := range b.rows {
		rw := &b.rows[i]
		p := &b.plans[i]
		if rw.decodeErr != nil {
			p.deadErr = fmt.Errorf("event %s cannot be read: %w", rw.id, rw.decodeErr)
			continue
		}
		route := b.r.route(rw.topic)
		if route == nil {
			p.deadErr = fmt.Errorf("no route matches topic %q", rw.topic)
			continue
		}
		p.targets = make([]target, len(route.targets))
		for j, rt := range route.targets {
			t := &p.targets[j]
			t.sink = rt.state
			prev := rw.deliveries[rt.state.name]
			t.tries = prev.Attempts
			switch prev.State {
			case stateDone:
				t.status = tAlreadyDone
				continue
			case stateDead:
				t.status = tAlreadyDead
				continue
			}
			ks := keySink{rw.key, rt.state.name}
			if rw.key != "" {
				if until, ok := blocked[ks]; ok {
					t.status, t.until = tParked, until
					continue
				}
				if until, ok := heldOutside(rw.holds, rt.state.name, inBatch); ok {
					// A hold already due means its event is due too but not
					// in this batch: look again at once. Parking at now keeps
					// this event ahead of any of its key inserted later.
					until = maxTime(until, b.now)
					t.status, t.until = tParked, until
					blocked[ks] = until
					continue
				}
			}
			if prev.State == stateRetry && prev.Next.After(b.now) {
				// The row came due through another sink; this one keeps its
				// own retry time (and its hold, so the key stays in order).
				t.status, t.until = tWaiting, prev.Next
				if rw.key != "" {
					blocked[ks] = prev.Next
				}
				continue
			}
			if until := rt.state.pausedTill(); until.After(b.now) {
				t.status, t.until = tPaused, until
				t.err = fmt.Errorf("sink %s is paused after failing as a whole", rt.state.name)
				if rw.key != "" {
					blocked[ks] = t.until
				}
				continue
			}
			ev := b.event(rw, prev.Attempts+1)
			dest, err := rt.destination(&ev)
			if err != nil {
				t.status, t.err = tDead, sinks.Permanent(err)
				t.tries++
				if b.r.cfg.StopKeyOnDeadLetter && rw.key != "" {
					blocked[ks] = forever // as a dead letter from the sink would
				}
				continue
			}
			ev.Destination = dest
			sb := b.sinks[rt.state]
			if sb == nil {
				sb = &sinkBatch{sink: rt.state}
				b.sinks[rt.state] = sb
				b.order = append(b.order, sb)
			}
			t.status, t.batched = tSend, len(sb.events)
			if b.r.tracer != nil {
				sb.spans = append(sb.spans, b.r.startPublishSpan(&ev, rt.state.name))
			}
			sb.events = append(sb.events, ev)
			sb.rows = append(sb.rows, i)
		}
	}
}

// heldOutside returns the latest time among holds on sink whose event is not
// in this batch (those in the batch are decided by the batch itself).
func heldOutside(holds []hold, sink string, inBatch map[int64]bool) (time.Time, bool) {
	var until time.Time
	found := false
	for _, h := range holds {
		if h.sink == sink && !inBatch[h.seq] {
			if !found || h.until.After(until) {
				until = h.until
			}
			found = true
		}
	}
	return until, found
}

func (b *batch) event(rw *row, attempt int) sinks.Event {
	return sinks.Event{ID: rw.id, Seq: rw.seq, Topic: rw.topic, Key: rw.key, Payload: rw.payload,
		ContentType: rw.contentType, Headers: rw.headers, CreatedAt: rw.createdAt, Attempt: attempt}
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

// retryAfter is implemented by errors that carry the destination's own
// retry delay (an HTTP Retry-After).
type retryAfter interface{ RetryAfter() time.Duration }

// settle applies the sinks' results to the plans, in seq order, so that a
// failed event of a key parks the later events of that key on that sink.
func (b *batch) settle() {
	failedHead := map[keySink]time.Time{}
	for _, sb := range b.order {
		var down error
		delivered := false
		for _, err := range sb.results {
			if sinks.IsUnavailable(err) && down == nil {
				down = err
			}
			delivered = delivered || err == nil
		}
		switch {
		case down != nil:
			b.r.pause(sb.sink, down)
		case delivered:
			b.r.resume(sb.sink)
		}
		endPublishSpans(sb)
	}
	for i := range b.rows {
		rw := &b.rows[i]
		p := &b.plans[i]
		for j := range p.targets {
			t := &p.targets[j]
			if t.status != tSend {
				continue
			}
			err := b.sinks[t.sink].results[t.batched]
			ks := keySink{rw.key, t.sink.name}
			if err == nil {
				t.status = tDone
				b.r.cfg.Observer.Published(t.sink.name, rw.topic, b.now.Sub(rw.createdAt))
				b.w.countPublished(t.sink.name, rw.topic, b.now)
				continue
			}
			if until, ok := failedHead[ks]; ok && rw.key != "" {
				// An earlier event of this key failed on this sink in this
				// call; this one waits for it without spending an attempt.
				t.status, t.until = tParked, until
				continue
			}
			switch {
			case sinks.IsUnavailable(err):
				t.status, t.until, t.err = tPaused, t.sink.pausedTill(), err
			case errors.Is(err, sinks.ErrSkipped):
				t.status, t.until = tParked, b.now
			case sinks.IsPermanent(err):
				t.status, t.err = tDead, err
				t.tries++
			default:
				t.tries++
				t.err = err
				if t.tries >= b.r.maxAttempts(rw) {
					t.status = tDead
				} else {
					t.status, t.until = tRetry, b.now.Add(b.r.retryDelay(err, t.tries))
				}
			}
			if rw.key != "" {
				switch t.status {
				case tDead:
					if b.r.cfg.StopKeyOnDeadLetter {
						failedHead[ks] = forever
					} else {
						failedHead[ks] = b.now
					}
				default:
					failedHead[ks] = t.until
				}
			}
		}
	}
}

// outcome turns the settled plans into the rows and holds to write.
func (b *batch) outcome() *outcome {
	o := &outcome{}
	for i := range b.rows {
		rw := &b.rows[i]
		p := &b.plans[i]
		if p.deadErr != nil {
			b.counts.dead++
			b.r.logEvent(rw, "", "relay: event dead-lettered", p.deadErr)
			b.r.cfg.Observer.DeadLettered(rw.topic)
			for sink, d := range rw.deliveries {
				if holds(d) && rw.key != "" {
					o.free(rw.key, sink, rw.seq)
				}
			}
			o.update(rw.seq, stateDead, rw.attempts, b.now, p.deadErr.Error(), encodeDeliveries(rw.deliveries))
			continue
		}
		b.settleRow(rw, p, o)
	}
	return o
}

func (b *batch) settleRow(rw *row, p *rowPlan, o *outcome) {
	var (
		finished  = true
		anyDead   = false
		changed   = false
		next      time.Time
		errs      []string
		deadErrs  []string
		attempts  = rw.attempts
		newStates = map[string]delivery{}
	)
	for j := range p.targets {
		t := &p.targets[j]
		name := t.sink.name
		prev := rw.deliveries[name]
		switch t.status {
		case tAlreadyDone:
			continue
		case tAlreadyDead:
			anyDead = true
			deadErrs = append(deadErrs, name+": "+prev.Error)
			continue
		case tDone:
			newStates[name] = delivery{State: stateDone, Attempts: t.tries + 1, At: b.now}
			changed = true
		case tDead:
			anyDead, changed = true, true
			msg := t.err.Error()
			newStates[name] = delivery{State: stateDead, Attempts: t.tries, Error: msg, At: b.now}
			deadErrs = append(deadErrs, name+": "+msg)
			b.r.cfg.Observer.Failed(name, rw.topic, "dead")
			b.r.logEvent(rw, name, "relay: delivery failed for good", t.err)
		case tRetry, tPaused:
			finished, changed = false, true
			msg := t.err.Error()
			newStates[name] = delivery{State: stateRetry, Attempts: t.tries, Error: msg, At: b.now, Next: t.until}
			errs = append(errs, name+": "+msg)
			if t.status == tRetry {
				b.counts.retried++
				b.r.cfg.Observer.Failed(name, rw.topic, "retry")
				b.r.logEvent(rw, name, "relay: delivery failed, will retry", t.err, "retry_at", t.until)
			} else {
				b.counts.paused++
				b.r.cfg.Observer.Failed(name, rw.topic, "paused")
			}
			if rw.key != "" {
				o.take(rw.key, name, rw.seq, t.until)
			}
		case tParked:
			// It holds the sink too, so that events of its key written later
			// wait for it even after the event it waits behind is delivered.
			finished, changed = false, true
			b.counts.parked++
			state := stateWait
			if prev.State == stateRetry {
				state = stateRetry
			}
			newStates[name] = delivery{State: state, Attempts: prev.Attempts, Error: prev.Error, At: b.now, Next: t.until}
			if rw.key != "" {
				o.take(rw.key, name, rw.seq, t.until)
			}
		case tWaiting:
			finished = false
		}
		if t.status == tParked || t.status == tWaiting || t.status == tRetry || t.status == tPaused {
			if next.IsZero() || t.until.Before(next) {
				next = t.until
			}
		}
		attempts = max(attempts, t.tries)
		// A hold this event had on the sink ends when it is settled there.
		if holds(prev) && rw.key != "" && (t.status == tDone || t.status == tDead) {
			if t.status == tDead && b.r.cfg.StopKeyOnDeadLetter {
				o.take(rw.key, name, rw.seq, forever)
			} else {
				o.free(rw.key, name, rw.seq)
			}
		}
	}
	if finished && !anyDead {
		b.counts.done++
		o.done = append(o.done, rw.seq)
		return
	}
	deliveries := rw.deliveries
	if changed {
		deliveries = make(map[string]delivery, len(rw.deliveries)+len(newStates))
		for k, v := range rw.deliveries {
			deliveries[k] = v
		}
		for k, v := range newStates {
			deliveries[k] = v
		}
	}
	if finished {
		b.counts.dead++
		b.r.cfg.Observer.DeadLettered(rw.topic)
		if b.r.cfg.StopKeyOnDeadLetter && rw.key != "" {
			for name, d := range newStates {
				if d.State == stateDead {
					o.take(rw.key, name, rw.seq, forever)
				}
			}
		}
		o.update(rw.seq, stateDead, attempts, b.now, strings.Join(deadErrs, "; "), encodeDeliveries(deliveries))
		return
	}
	lastErr := strings.Join(errs, "; ")
	if lastErr == "" {
		lastErr = strings.Join(deadErrs, "; ")
	}
	o.update(rw.seq, "pending", attempts, next, lastErr, encodeDeliveries(deliveries))
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

func encodeDeliveries(d map[string]delivery) []byte {
	if len(d) == 0 {
		return []byte("{}")
	}
	b, err := json.Marshal(d)
	if err != nil {
		// A map of plain structs always marshals.
		return []byte("{}")
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// holds reports whether an event in this delivery state holds its sink.
func holds(d delivery) bool { return d.State == stateRetry || d.State == stateWait }
