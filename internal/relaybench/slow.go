package relaybench

import (
	"context"
	"fmt"
	"time"
)

// SlowResult is what ModeSlow measured besides the live run's figures
// (Result.Latency is the fast sink's commit-to-acknowledgement latency).
type SlowResult struct {
	// AnswerAfterMS is how late the slow sink's receiver answered each
	// request; Concurrency, the requests each sink keeps in flight.
	AnswerAfterMS float64 `json:"answer_after_ms"`
	Concurrency   int     `json:"concurrency"`
	// FastArrival is commit-to-arrival at the fast sink's receiver: from
	// the time tx.Commit returned until the receiver got the event's first
	// request.
	FastArrival *Percentiles `json:"fast_arrival_ms,omitempty"`
	// SlowArrival is the same at the slow sink's receiver.
	SlowArrival *Percentiles `json:"slow_arrival_ms,omitempty"`
	// SlowEvents is the events that reached the slow sink's receiver,
	// SlowSeconds the time from the producers' start until the last one
	// arrived, and SlowEventsPerSecond their ratio: the slow sink's
	// throughput while it had a backlog.
	SlowEvents          int     `json:"slow_events"`
	SlowSeconds         float64 `json:"slow_s"`
	SlowEventsPerSecond float64 `json:"slow_events_per_s"`
	// CapacityPerSecond is what the slow sink's concurrency allows:
	// Concurrency requests of one event each, every AnswerAfterMS.
	CapacityPerSecond float64 `json:"capacity_per_s"`
	// CapacityShare is SlowEventsPerSecond over CapacityPerSecond.
	CapacityShare float64 `json:"capacity_share"`
	// SlowPeakInFlight is the most requests the slow receiver held at once.
	SlowPeakInFlight int64 `json:"slow_peak_in_flight"`
	// HandedOff is the events batches stopped waiting for, over all sinks
	// (relay.Observer.SinkHandedOff).
	HandedOff int64 `json:"handed_off"`
}

// slow runs live producers to a fast and a slow webhook sink on one route,
// each posting to a receiver of the run's own.
func (r *run) slow(ctx context.Context) error {
	cfg := r.cfg
	capacity := cfg.liveCapacity()
	fast, err := r.startReceiver(0, capacity)
	if err != nil {
		return err
	}
	defer r.closeReceiver(ctx, fast)
	slow, err := r.startReceiver(cfg.AnswerAfter, capacity)
	if err != nil {
		return err
	}
	defer r.closeReceiver(ctx, slow)
	r.webhookSink(SinkFast, fast, capacity, nil)
	slowSink := r.webhookSink(SinkSlow, slow, capacity, nil)
	fmt.Fprintf(cfg.Progress, "sink %s answers at once, sink %s %s late; %d requests in flight each\n",
		SinkFast, SinkSlow, cfg.AnswerAfter, cfg.WebhookConcurrency)
	if err := r.live(ctx); err != nil {
		return err
	}

	res := &SlowResult{
		AnswerAfterMS:     float64(cfg.AnswerAfter) / 1e6,
		Concurrency:       cfg.WebhookConcurrency,
		FastArrival:       r.arrivalLatencies(fast),
		SlowArrival:       r.arrivalLatencies(slow),
		SlowEvents:        slowSink.rec.Unique(),
		CapacityPerSecond: float64(cfg.WebhookConcurrency) / cfg.AnswerAfter.Seconds(),
		SlowPeakInFlight:  slow.peak.Load(),
		HandedOff:         r.obs.handedOff.Load(),
	}
	var last int64
	for _, rec := range slowSink.rec.all() {
		last = max(last, rec.AckNanos)
	}
	if res.SlowSeconds = float64(last-r.producersStart) / 1e9; res.SlowSeconds > 0 {
		res.SlowEventsPerSecond = float64(res.SlowEvents) / res.SlowSeconds
		res.CapacityShare = res.SlowEventsPerSecond / res.CapacityPerSecond
	}
	r.res.Slow = res
	return nil
}

// arrivalLatencies is, for each committed event that reached rv, the time
// from its commit until its first request arrived.
func (r *run) arrivalLatencies(rv *receiver) *Percentiles {
	var ns []int64
	for i, c := range r.commitNanos {
		if c == 0 || i >= len(rv.arrivals) {
			continue
		}
		if a := rv.arrival(i); a != 0 {
			ns = append(ns, max(a-c, 0))
		}
	}
	return percentiles(ns)
}

func (r *run) closeReceiver(ctx context.Context, rv *receiver) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := rv.close(closeCtx); err != nil {
		r.log.Warn("relaybench: stopping a webhook receiver", "error", err)
	}
}
