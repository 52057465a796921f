package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/sinks"
)

// sinkState is a sink shared by a relay's workers: whether it is paused
// because it is down, and what it has in flight.
type sinkState struct {
	sinks.Sink
	name string
	// turn serialises the Publish calls of a sink that is not a
	// sinks.ConcurrentPublisher (nil for one that is): a call takes it
	// before publishing, or gives up, sending nothing, when its context
	// ends first.
	turn chan struct{}

	// inFlight and inFlightBytes count the events (and their payload bytes)
	// handed to Publish calls that have not answered them yet. A sink at
	// maxInFlight or maxInFlightBytes is busy: it is handed no more events
	// (they join its queue, without an attempt) until some are answered.
	// This bounds what a slow sink holds in memory, and how long its
	// events wait inside the relay rather than in its queue.
	inFlight, inFlightBytes       atomic.Int64
	maxInFlight, maxInFlightBytes int64
	// busy is set when an event found the sink at its bound; the answer
	// that makes room clears it and wakes the workers to claim its queue.
	busy atomic.Bool
	// answerTime is a moving average of how long the sink takes to answer
	// an event, from its call's start, in nanoseconds (0 before the first
	// answer): see Relay.handOffAfter.
	answerTime atomic.Int64
	// chainTime is a moving average of how long the sink takes to deliver
	// one event of a key's chain claimed from its queue (its answer time
	// over its place in the chain), in nanoseconds (0 before the first):
	// a sink that sends a key's events one after another delivers a chain
	// of n in about n of it, so a queue claim brings no longer a chain a
	// head than it delivers in half a publish (Relay.queueSinks). A longer
	// one would run into the call's deadline, and the event cut short
	// there would be sent again.
	chainTime atomic.Int64

	mu          sync.Mutex // guards failures and pausedUntil
	failures    int
	pausedUntil time.Time
	// down is set while failures > 0: the sink was found down and has
	// not delivered since. A result reads it without the lock. pauses
	// counts the times it was paused.
	down   atomic.Bool
	pauses atomic.Int64
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

// room is how many more events the sink may be handed now (0 when busy).
func (s *sinkState) room() int {
	if s.inFlightBytes.Load() >= s.maxInFlightBytes {
		return 0
	}
	return int(max(s.maxInFlight-s.inFlight.Load(), 0))
}

// take counts an event of size bytes as in flight if the sink has room
// for it (an event alone always fits), and reports whether it had.
func (s *sinkState) take(size int64) bool {
	n, b := s.inFlight.Load(), s.inFlightBytes.Load()
	if n > 0 && (n >= s.maxInFlight || b+size > s.maxInFlightBytes) {
		s.busy.Store(true)
		return false
	}
	s.inFlight.Add(1)
	s.inFlightBytes.Add(size)
	return true
}

// movingAverage adds sample to the moving average in avg (a sixteenth of
// it each; the first sample is the average).
func movingAverage(avg *atomic.Int64, sample time.Duration) {
	for {
		old := avg.Load()
		next := int64(sample)
		if old != 0 {
			next = old + (int64(sample)-old)/16
		}
		if avg.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// answered counts an event of size bytes as no longer in flight, and
// reports whether that ended a time the sink was busy.
func (s *sinkState) answered(size int64) (freed bool) {
	s.inFlight.Add(-1)
	s.inFlightBytes.Add(-size)
	return s.busy.Load() && s.room() > 0 && s.busy.CompareAndSwap(true, false)
}

// sinkCall is one Publish call: one sink's events of one batch, published
// in a goroutine of its own. Results arrive event by event (sinks report
// them early through sinks.WithResultFunc), or all when Publish returns. A
// call may outlive its batch: the events it has not answered when the
// batch's wait runs out are handed to the sink's queue, in flight, and
// settled as deliveries when their results arrive (see flight).
type sinkCall struct {
	w       *worker
	sink    *sinkState
	events  []sinks.Event
	targets []int        // targets[i] is the index in its batch's targets of events[i]
	spans   []trace.Span // spans[i] traces events[i]; nil when tracing is off
	// chainAt[i] is events[i]'s place in the chain of its key claimed
	// from the sink's queue (1: the head), 0 for an event not claimed
	// from it; nil when the call has none.
	chainAt []int32
	// deadline is when the call ends, answered or not; started when it
	// started, and pauses the sink's pauses then.
	deadline, started time.Time
	pauses            int64

	mu      sync.Mutex
	results []error
	known   []bool
	unknown int // events without a result
	// foundDown: a result of the call said the sink is down; it paused the
	// sink, and no later result of the call resumes it.
	foundDown bool
}

// add appends an event to the call, for the batch's target at index t, at
// place chainAt of a chain claimed from the sink's queue (0: none).
func (c *sinkCall) add(ev sinks.Event, t int, span trace.Span, chainAt int32) {
	if chainAt > 0 && c.chainAt == nil {
		c.chainAt = make([]int32, len(c.events), cap(c.events))
	}
	if c.chainAt != nil {
		c.chainAt = append(c.chainAt, chainAt)
	}
	c.events = append(c.events, ev)
	c.targets = append(c.targets, t)
	if span != nil {
		c.spans = append(c.spans, span)
	}
}

// start publishes the call's events in a goroutine until they are all
// answered or ctx's deadline passes.
func (c *sinkCall) start(ctx context.Context, deadline time.Time) {
	c.results = make([]error, len(c.events))
	c.known = make([]bool, len(c.events))
	c.unknown = len(c.events)
	c.deadline, c.started, c.pauses = deadline, time.Now(), c.sink.pauses.Load()
	c.w.calls.Add(1)
	go func() {
		defer c.w.calls.Done()
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		start := time.Now()
		for i, err := range c.publish(ctx) {
			c.report(i, err)
		}
		c.mu.Lock()
		results := c.results // final: every event reported
		c.mu.Unlock()
		r := c.w.r
		r.cfg.Observer.SinkPublish(c.sink.name, len(c.events), time.Since(start))
		r.cfg.Observer.SinkInFlight(c.sink.name, int(c.sink.inFlight.Load()))
		c.endSpans(results)
	}()
}

// publish calls Publish (after taking the sink's turn when it must),
// turning a panic or a wrong result count into retryable errors for every
// event not answered yet: nothing is lost to a faulty sink.
func (c *sinkCall) publish(ctx context.Context) (results []error) {
	defer func() {
		if p := recover(); p != nil {
			results = sinks.Fill(len(c.events), fmt.Errorf("sink %s panicked: %v", c.sink.name, p))
		}
	}()
	if c.sink.turn != nil {
		select {
		case c.sink.turn <- struct{}{}:
			defer func() { <-c.sink.turn }()
		case <-ctx.Done():
			return sinks.Fill(len(c.events), fmt.Errorf("sink %s: %w (waiting for its previous call: %w)", c.sink.name, sinks.ErrNotSent, ctx.Err()))
		}
	}
	results = c.sink.Publish(sinks.WithResultFunc(ctx, c.report), c.events)
	if len(results) != len(c.events) {
		return sinks.Fill(len(c.events), fmt.Errorf("sink %s returned %d results for %d events", c.sink.name, len(results), len(c.events)))
	}
	return results
}

// report records event i's result, unless it has one: the first result
// reported is final. It is the sink's sinks.WithResultFunc, and may be
// called from any goroutine.
func (c *sinkCall) report(i int, err error) {
	if i < 0 || i >= len(c.events) {
		return // a faulty sink's index; its events get results when it returns
	}
	c.mu.Lock()
	if c.known[i] {
		c.mu.Unlock()
		return
	}
	c.judgeSink(err)
	c.known[i], c.results[i] = true, err
	c.unknown--
	c.mu.Unlock()
	took := time.Since(c.started)
	movingAverage(&c.sink.answerTime, took)
	if err == nil && c.chainAt != nil && c.chainAt[i] > 0 {
		movingAverage(&c.sink.chainTime, took/time.Duration(c.chainAt[i]))
	}
	if c.sink.answered(int64(len(c.events[i].Payload))) {
		c.w.r.sinkFreed()
	}
	c.w.resultArrived()
}

// result returns event i's result and whether it has one yet.
func (c *sinkCall) result(i int) (error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.results[i], c.known[i]
}

// answered reports whether every event of the call has a result.
func (c *sinkCall) answered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unknown == 0
}

// endSpans ends the spans of the call's events with each event's result.
func (c *sinkCall) endSpans(results []error) {
	for i, span := range c.spans {
		if err := results[i]; err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// judgeSink changes the sink's state by one result of the call, before
// the result is seen (c.mu is held), so that a worker that sees it claims
// by the new state: the call's first result saying the sink is down pauses
// it, and a delivery resumes a paused sink, from that delivery on rather
// than from the end of its call (a probe may be a long chain of one key's
// events), unless the call found the sink down or started before its
// latest pause (an event sent before the sink went down says nothing of
// whether it is back).
func (c *sinkCall) judgeSink(err error) {
	switch {
	case err == nil:
		if !c.foundDown && c.sink.down.Load() && c.sink.pauses.Load() == c.pauses {
			c.w.r.resume(c.sink)
		}
	case !c.foundDown && sinks.IsUnavailable(err):
		c.foundDown = true
		c.w.r.pause(c.sink, err)
	}
}

// notAttempted reports whether err says a sink did not try the event (it
// was behind a failed one of its key, or its call ended before its turn):
// no attempt is counted for it.
func notAttempted(err error) bool {
	return errors.Is(err, sinks.ErrSkipped) || errors.Is(err, sinks.ErrNotSent)
}
