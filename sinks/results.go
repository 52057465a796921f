package sinks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
)

// ErrNotSent is reported for an event a sink did not try because its call
// ended (the context's deadline, a cancel) before the event's turn came.
// Like ErrSkipped, the relay counts no attempt for it.
var ErrNotSent = errors.New("sinks: not sent: the call ended before the event's turn")

// errNoResult is what Results.Errors reports for an event its sink set no
// result for: a fault of the sink, retried like any failure.
var errNoResult = errors.New("sinks: the sink reported no result for this event")

// resultFuncKey is the context key of WithResultFunc's function.
type resultFuncKey struct{}

// WithResultFunc returns a context that asks a Publish call made with it to
// report each event's result to f as soon as the sink knows it, rather than
// only when the call returns: f(i, err) for events[i], nil when delivered.
// The relay uses it so that a slow event holds back only its own key: the
// other events' results are recorded while it is still in flight. Sinks
// report through Results (and PublishEach), so they need nothing else; a
// sink that does not report early is still correct, its results arrive
// when Publish returns. f may be called from several goroutines, at most
// once per event, and a result reported early is final: Publish returns the
// same one.
func WithResultFunc(ctx context.Context, f func(i int, err error)) context.Context {
	return context.WithValue(ctx, resultFuncKey{}, f)
}

// Results holds the per-event results of one Publish call and keeps the
// rules of the Sink contract for it, so that a sink keeps only its
// protocol:
//
//   - every event gets exactly one result, and the first one set is final;
//   - an event that must not be sent is not: Blocked says so, recording
//     why, before the sink sends an event — once an event of a key failed,
//     the key's later events in the call are skipped (ErrSkipped); once an
//     event failed as Unavailable (or Stop was called), no event is sent
//     any more; once the call's context ended, none either (ErrNotSent);
//   - each result is reported as soon as it is set, when the caller asked
//     for it (WithResultFunc);
//   - every error names the event and where it was going:
//     "publishing event ID to WHERE: cause".
//
// A sink makes one per call with NewResults, sets each event's result as it
// learns it (Delivered, Fail, FailRest) and returns Errors. One-at-a-time
// sinks hand the sending to PublishEach. Results is safe for concurrent
// use.
type Results struct {
	ctx    context.Context
	events []Event
	where  func(*Event) string
	report func(i int, err error)

	mu     sync.Mutex
	errs   []error
	known  []bool
	failed map[string]bool // keys with a failed event in this call
	stop   error           // why no event is to be sent any more
}

// NewResults returns the results of a Publish call of events made with ctx.
// where names an event's destination in errors (a sink that sends every
// event to one place may return its own name); nil means the event's
// Destination, quoted.
func NewResults(ctx context.Context, events []Event, where func(e *Event) string) *Results {
	r := &Results{ctx: ctx, events: events, where: where, errs: make([]error, len(events)), known: make([]bool, len(events))}
	r.report, _ = ctx.Value(resultFuncKey{}).(func(int, error))
	return r
}

// set records err as event i's result unless it has one, and reports it.
func (r *Results) set(i int, err error) {
	cause := err
	if err != nil {
		e := &r.events[i]
		where := strconv.Quote(e.Destination)
		if r.where != nil {
			where = r.where(e)
		}
		err = fmt.Errorf("publishing event %s to %s: %w", e.ID, where, err)
	}
	r.mu.Lock()
	if r.known[i] {
		r.mu.Unlock()
		return
	}
	r.known[i], r.errs[i] = true, err
	if err != nil {
		if key := r.events[i].Key; key != "" {
			if r.failed == nil {
				r.failed = map[string]bool{}
			}
			r.failed[key] = true
		}
		if r.stop == nil && IsUnavailable(cause) {
			r.stop = cause
		}
	}
	r.mu.Unlock()
	if r.report != nil {
		r.report(i, err)
	}
}

// Delivered records that the destination acknowledged event i.
func (r *Results) Delivered(i int) { r.set(i, nil) }

// Fail records err as event i's result: the later events of its key in
// this call are not to be sent, nor, when err is marked Unavailable, any
// event (see Blocked). A nil err is taken as a failure without a reason,
// never as a delivery.
func (r *Results) Fail(i int, err error) {
	if err == nil {
		err = errNoResult
	}
	r.set(i, err)
}

// FailRest records err as the result of every event that has none yet: a
// call that failed as a whole, with no event in flight (the connection
// could not be made, the sink is closed).
func (r *Results) FailRest(err error) {
	for i := range r.events {
		if !r.Known(i) {
			r.Fail(i, err)
		}
	}
}

// Stop records that no further event of the call is to be sent, because of
// err (a channel the broker closed, a confirm given up on): Blocked records
// err for the events asked about from now on. Events already sent keep
// their own results. A failure marked Unavailable stops the call by itself.
// The first stop is kept.
func (r *Results) Stop(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop == nil {
		r.stop = err
	}
}

// Blocked reports whether event i must not be sent, and records why when
// it has no result yet: an earlier event of its key failed in this call
// (ErrSkipped), the call was stopped (the error that stopped it), or the
// call's context ended (ErrNotSent). An event that has a result already is
// blocked too. A sink asks just before it sends each event.
func (r *Results) Blocked(i int) bool {
	r.mu.Lock()
	known, stop := r.known[i], r.stop
	key := r.events[i].Key
	keyFailed := key != "" && r.failed[key]
	r.mu.Unlock()
	switch {
	case known:
	case keyFailed:
		r.Fail(i, ErrSkipped)
	case stop != nil:
		r.Fail(i, stop)
	case r.ctx.Err() != nil:
		r.Fail(i, notSent(r.ctx.Err()))
	default:
		return false
	}
	return true
}

// Ended reports whether the call's context has ended, and then records
// ErrNotSent for every event that has no result: a sink asks before it
// connects, so that a call that ended sends nothing and reports no failure
// of the destination.
func (r *Results) Ended() bool {
	err := r.ctx.Err()
	if err != nil {
		r.FailRest(notSent(err))
	}
	return err != nil
}

// Connect begins a Publish call that sends over a connection (a client, a
// channel): it returns what connect returns, and true, when the call has
// events to send, its context has not ended and connect succeeded.
// Otherwise it returns false and the call sends nothing: a call with no
// events, or whose context ended (see Ended), never connects, and
// connect's error becomes the result of every event. Either way the sink
// returns r.Errors() when it is done.
func Connect[C any](r *Results, connect func(context.Context) (C, error)) (C, bool) {
	var none C
	if len(r.events) == 0 || r.Ended() {
		return none, false
	}
	conn, err := connect(r.ctx)
	if err != nil {
		r.FailRest(err)
		return none, false
	}
	return conn, true
}

// notSent is ErrNotSent with the reason the call ended.
func notSent(cause error) error { return fmt.Errorf("%w (%w)", ErrNotSent, cause) }

// Known reports whether event i has a result.
func (r *Results) Known(i int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.known[i]
}

// Errors returns one result per event, in order: nil for a delivered event.
// An event the sink set no result for fails, as a fault of the sink.
func (r *Results) Errors() []error {
	r.FailRest(errNoResult)
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// Limiter bounds how many sends (events, or requests of several) a sink
// has in flight at once over all its Publish calls. A sink shares one
// between its calls, so that the relay may call it concurrently
// (ConcurrentPublisher) without raising its load on the destination past
// its setting.
type Limiter struct{ slots chan struct{} }

// NewLimiter returns a Limiter of n sends at once (at least 1).
func NewLimiter(n int) *Limiter { return &Limiter{slots: make(chan struct{}, max(n, 1))} }

// Acquire takes a slot, waiting for one, or returns ctx's error when it
// ends first. Release gives the slot back.
func (l *Limiter) Acquire(ctx context.Context) error {
	// A call that ended sends nothing, even when a slot is free.
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release gives back a slot Acquire took.
func (l *Limiter) Release() { <-l.slots }

// PublishEach publishes the call's events one at a time with send and
// returns Errors. A key's events are sent one after another, in order;
// events of different keys, and events without a key, are sent at once, as
// many at a time as limit allows over all the calls sharing it. Before each
// event, Blocked decides whether it is still to be sent (its key failed,
// the destination was found unavailable, the call ended). send's error is
// the event's result, reported as soon as send returns (see WithResultFunc).
func (r *Results) PublishEach(limit *Limiter, send func(ctx context.Context, e *Event) error) []error {
	// A queue is the indices of one key's events, or one keyless event.
	var queues [][]int
	byKey := map[string]int{}
	for i, e := range r.events {
		if e.Key == "" {
			queues = append(queues, []int{i})
			continue
		}
		q, ok := byKey[e.Key]
		if !ok {
			q = len(queues)
			byKey[e.Key] = q
			queues = append(queues, nil)
		}
		queues[q] = append(queues[q], i)
	}
	next := make(chan []int, len(queues))
	for _, q := range queues {
		next <- q
	}
	close(next)
	var wg sync.WaitGroup
	for range min(cap(limit.slots), len(queues)) {
		wg.Go(func() {
			for q := range next {
				r.publishQueue(q, limit, send)
			}
		})
	}
	wg.Wait()
	return r.Errors()
}

// publishQueue sends one key's events in order, as long as Blocked lets
// it.
func (r *Results) publishQueue(queue []int, limit *Limiter, send func(context.Context, *Event) error) {
	for _, i := range queue {
		if r.Blocked(i) {
			continue
		}
		if err := limit.Acquire(r.ctx); err != nil {
			r.Fail(i, notSent(err))
			continue
		}
		// The wait for a slot may have outlasted the call or the
		// destination.
		if r.Blocked(i) {
			limit.Release()
			continue
		}
		err := send(r.ctx, &r.events[i])
		limit.Release()
		if err != nil {
			r.Fail(i, err)
		} else {
			r.Delivered(i)
		}
	}
}
