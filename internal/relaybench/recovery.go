package relaybench

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RecoveryResult is what ModeRecovery measured: the same number of events
// delivered to the sink "hook" twice, once flowing (committed while it is
// up) and once queued (committed while it is down, drained after it came
// back).
type RecoveryResult struct {
	// AnswerAfterMS is how late hook's receiver answered each request;
	// Concurrency, the requests hook keeps in flight.
	AnswerAfterMS float64 `json:"answer_after_ms"`
	Concurrency   int     `json:"concurrency"`
	// PauseMaxSeconds is relay.Config.SinkPause.Max: the relay finds hook
	// back at its next probe, at most this long after it came back.
	PauseMaxSeconds float64 `json:"pause_max_s"`
	// EventsEach is the events of each phase.
	EventsEach int `json:"events_each"`
	// FlowingSeconds is the time from the first phase's commit until hook
	// and the run's sink "up" had every event and both tables were empty.
	FlowingSeconds         float64 `json:"flowing_s"`
	FlowingEventsPerSecond float64 `json:"flowing_events_per_s"`
	// QueueDepth is the deliveries waiting for hook when it came back.
	QueueDepth int64 `json:"queue_depth"`
	// QueuedSeconds is the time from hook's return until it had every
	// event of the second phase and both tables were empty.
	QueuedSeconds         float64 `json:"queued_s"`
	QueuedEventsPerSecond float64 `json:"queued_events_per_s"`
	// ProbeWaitSeconds is the time from hook's return until the first of
	// the queued events reached its receiver (the relay's next probe of the
	// paused sink); QueuedAfterProbeEventsPerSecond is the queued drain's
	// rate from then on.
	ProbeWaitSeconds                float64 `json:"probe_wait_s"`
	QueuedAfterProbeEventsPerSecond float64 `json:"queued_after_probe_events_per_s"`
	// Ratio is QueuedEventsPerSecond over FlowingEventsPerSecond.
	Ratio float64 `json:"ratio"`
	// FlowingFirstArrivalSeconds is the time from the first phase's commit
	// until its first event reached the receiver, and
	// FlowingAfterFirstEventsPerSecond the flowing drain's rate from then
	// on. DrainRatio is QueuedAfterProbeEventsPerSecond over it: the two
	// drains compared from their first arrival each, without the wait for
	// the probe that finds hook back (at most relay.sink_pause.max).
	FlowingFirstArrivalSeconds       float64 `json:"flowing_first_arrival_s"`
	FlowingAfterFirstEventsPerSecond float64 `json:"flowing_after_first_events_per_s"`
	DrainRatio                       float64 `json:"drain_ratio"`
	// FlowingBusy and QueuedAfterProbeBusy are the share of what hook may
	// have in flight (Concurrency requests for the phase's length) that
	// its receiver held: 1 is a sink kept at its concurrency all along,
	// which no drain can beat. The queued one counts from the first
	// queued arrival.
	FlowingBusy          float64 `json:"flowing_busy"`
	QueuedAfterProbeBusy float64 `json:"queued_after_probe_busy"`
	// PeakInFlight is the most requests hook's receiver held at once.
	PeakInFlight int64 `json:"peak_in_flight"`
}

// recovery delivers Events events to a webhook sink answering AnswerAfter
// late while it is up, then as many again queued while it is down, and
// times both drains.
func (r *run) recovery(ctx context.Context) error {
	cfg := r.cfg
	n := cfg.Events
	rv, err := r.startReceiver(cfg.AnswerAfter, 2*n)
	if err != nil {
		return err
	}
	defer r.closeReceiver(ctx, rv)
	r.runSink(SinkUp, 2*n, nil)
	hook := r.webhookSink(SinkHook, rv, 2*n, &fault{})
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()
	out := &RecoveryResult{AnswerAfterMS: float64(cfg.AnswerAfter) / 1e6, Concurrency: cfg.WebhookConcurrency,
		PauseMaxSeconds: cfg.PauseMax.Seconds(), EventsEach: n}
	r.res.Recovery = out
	m := r.startMeasuring("both phases (VmHWM reset at the first's start); includes the recorders")

	fmt.Fprintf(cfg.Progress, "flowing: %d events over %s in schema %s, sink hook up (answering %s late)...\n",
		n, keysText(cfg.Keys), r.tables.Schema, cfg.AnswerAfter)
	if err := r.commitEvents(ctx, 0, n, "", true); err != nil {
		return err
	}
	start := time.Since(r.origin).Nanoseconds()
	m.start = start
	busy0 := rv.busy.Load()
	end, err := r.waitEmpty(ctx, rs, nil, int64(n), true, start+cfg.Timeout.Nanoseconds())
	if err != nil {
		return err
	}
	if end == 0 {
		return fmt.Errorf("flowing phase: %s of %d events delivered after --timeout %s", r.uniqueText(), n, cfg.Timeout)
	}
	flowingEnd := end
	out.FlowingSeconds = float64(end-start) / 1e9
	out.FlowingBusy = float64(rv.busy.Load()-busy0) / float64(int64(cfg.WebhookConcurrency)*(end-start))
	fmt.Fprintf(cfg.Progress, "flowing: delivered in %.3fs\n", out.FlowingSeconds)

	hook.fault.down.Store(true)
	fmt.Fprintf(cfg.Progress, "queued: sink hook down, %d more events...\n", n)
	queueStart := time.Now()
	if err := r.commitEvents(ctx, n, 2*n, "", true); err != nil {
		return err
	}
	if err := r.waitQueued(ctx, rs, int64(n), queueStart.Add(cfg.Timeout)); err != nil {
		return err
	}
	if out.QueueDepth, err = r.queueDepth(ctx, SinkHook); err != nil {
		return fmt.Errorf("counting the deliveries waiting for sink hook: %w", err)
	}
	busy1 := rv.busy.Load() // while hook was down, nothing reached its receiver
	hook.fault.down.Store(false)
	healed := time.Since(r.origin).Nanoseconds()
	fmt.Fprintf(cfg.Progress, "queued: sink hook back, %d deliveries waiting for it...\n", out.QueueDepth)
	end, err = r.waitEmpty(ctx, rs, nil, int64(2*n), true, healed+cfg.Timeout.Nanoseconds())
	if err != nil {
		return err
	}
	if end == 0 {
		return fmt.Errorf("queued phase: %s of %d events delivered after --timeout %s", r.uniqueText(), 2*n, cfg.Timeout)
	}
	cpu := cpuTime() - m.cpu0
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	stop()

	out.QueuedSeconds = float64(end-healed) / 1e9
	firstFlowing, first := rv.firstArrival(0, n), rv.firstArrival(n, 2*n)
	if firstFlowing == 0 || first == 0 {
		return errors.New("no event of a phase reached the receiver")
	}
	out.ProbeWaitSeconds = float64(max(first-healed, 0)) / 1e9
	out.FlowingEventsPerSecond = float64(n) / out.FlowingSeconds
	out.QueuedEventsPerSecond = float64(n) / out.QueuedSeconds
	if d := float64(end-first) / 1e9; d > 0 {
		out.QueuedAfterProbeEventsPerSecond = float64(n) / d
		out.QueuedAfterProbeBusy = float64(rv.busy.Load()-busy1) / (float64(cfg.WebhookConcurrency) * float64(end-first))
	}
	out.Ratio = out.QueuedEventsPerSecond / out.FlowingEventsPerSecond
	out.FlowingFirstArrivalSeconds = float64(max(firstFlowing-start, 0)) / 1e9
	if d := float64(flowingEnd-firstFlowing) / 1e9; d > 0 {
		out.FlowingAfterFirstEventsPerSecond = float64(n) / d
		out.DrainRatio = out.QueuedAfterProbeEventsPerSecond / out.FlowingAfterFirstEventsPerSecond
	}
	out.PeakInFlight = rv.peak.Load()
	fmt.Fprintf(cfg.Progress, "queued: drained in %.3fs\n", out.QueuedSeconds)

	r.target.Store(int64(2 * n))
	committed := make([]bool, 2*n)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, end-start, cpu, cpuScopeDrain)
	return nil
}
