package relaybench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// IsolationResult is what ModeIsolation measured besides the live run's
// figures (Result.Latency is the sink "up"'s over the whole run).
type IsolationResult struct {
	// OutageAfterSeconds and OutageSeconds place the outage of the sink
	// "down" from the producers' start.
	OutageAfterSeconds float64 `json:"outage_after_s"`
	OutageSeconds      float64 `json:"outage_s"`
	// PauseMaxSeconds is relay.Config.SinkPause.Max.
	PauseMaxSeconds float64 `json:"pause_max_s"`
	// Before, During and After are the commit-to-publish latency of the
	// healthy sink "up", of the events it acknowledged before, during and
	// after the outage (after: until the producers stopped).
	Before *Percentiles `json:"before_ms,omitempty"`
	During *Percentiles `json:"during_ms,omitempty"`
	After  *Percentiles `json:"after_ms,omitempty"`
	// WorstMinuteP99Ratio is the highest p99 ratio (Interval.P99Ratio) of
	// the minutes not wholly before the outage.
	WorstMinuteP99Ratio float64 `json:"worst_minute_p99_ratio"`
	// QueueAtHeal is the deliveries waiting for "down" when it came back;
	// PeakQueue the most seen from then on (the relay finds out that the
	// sink is back at its next probe).
	QueueAtHeal int64 `json:"queue_at_heal"`
	PeakQueue   int64 `json:"peak_queue"`
	// BacklogAtHeal is the events committed that "down" had not received
	// when it came back (see Interval.DownBacklog).
	BacklogAtHeal int64 `json:"backlog_at_heal"`
	// CatchUpSeconds is the time from the end of the outage until no
	// delivery waited for "down" (polled every 250ms); 0 when that did not
	// happen before every event was delivered to both sinks.
	CatchUpSeconds float64 `json:"catch_up_s"`
	// Probes is the Publish calls "down" refused while it was down.
	Probes int64 `json:"probes"`
	// DownAnswerAfterMS is how late the receiver of "down" answers (0:
	// "down" is in process, answering at once).
	DownAnswerAfterMS float64 `json:"down_answer_after_ms,omitempty"`
	// BacklogRises counts the reports after the outage, until "down"'s
	// queue was first seen empty (CatchUpSeconds), whose backlog
	// (Interval.DownBacklog) was larger than at the report before: 0 is a
	// backlog that fell at every report, as that of a sink whose capacity
	// exceeds the producers' rate must. The reports are
	// Config.ReportEvery's when set, else the minutes'.
	BacklogRises int `json:"backlog_rises"`
}

// isolation runs the outage of ModeIsolation and its per-minute reports.
type isolation struct {
	r           *run
	committed   func() int64
	res         *IsolationResult
	start       int64 // the producers' start, nanoseconds since origin
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	stopMinutes func()
}

// startIsolation schedules the outage of the sink "down" from start
// (nanoseconds since origin) and starts the per-minute reports.
func (r *run) startIsolation(ctx context.Context, start int64, committed func() int64) *isolation {
	cfg := r.cfg
	iso := &isolation{r: r, start: start, committed: committed, res: &IsolationResult{
		OutageAfterSeconds: cfg.OutageAfter.Seconds(), OutageSeconds: cfg.Outage.Seconds(), PauseMaxSeconds: cfg.PauseMax.Seconds(),
		DownAnswerAfterMS: float64(cfg.AnswerAfter) / 1e6}}
	from := start + cfg.OutageAfter.Nanoseconds()
	to := from + cfg.Outage.Nanoseconds()
	r.outageFrom.Store(from)
	r.outageTo.Store(to)
	iso.stopMinutes = r.startIntervals(ctx, time.Minute, start, committed, &r.res.Minutes, "minute: ")
	ctx, iso.cancel = context.WithCancel(ctx)
	iso.wg.Add(1)
	go func() {
		defer iso.wg.Done()
		iso.run(ctx, from, to)
	}()
	return iso
}

// run takes "down" down at from and back at to, then watches its queue
// until it is empty.
func (iso *isolation) run(ctx context.Context, from, to int64) {
	r := iso.r
	down := r.sink(SinkDown)
	until := func(at int64) bool { return sleep(ctx, time.Duration(at-time.Since(r.origin).Nanoseconds())) }
	if !until(from) {
		return
	}
	down.fault.down.Store(true)
	fmt.Fprintf(r.cfg.Progress, "sink down is down for %s\n", r.cfg.Outage)
	if !until(to) {
		down.fault.down.Store(false)
		return
	}
	depth, err := r.queueDepth(ctx, SinkDown)
	backlog := iso.committed() - int64(down.rec.Unique())
	down.fault.down.Store(false)
	healed := time.Since(r.origin).Nanoseconds()
	iso.res.Probes = down.fault.refused.Load()
	if err != nil {
		r.log.Warn("relaybench: counting the deliveries waiting for sink down", "error", err)
	}
	iso.res.QueueAtHeal, iso.res.PeakQueue, iso.res.BacklogAtHeal = depth, depth, backlog
	fmt.Fprintf(r.cfg.Progress, "sink down is back, %d deliveries waiting for it\n", depth)
	for depth > 0 || err != nil {
		if !sleep(ctx, 250*time.Millisecond) {
			return
		}
		if depth, err = r.queueDepth(ctx, SinkDown); err == nil {
			iso.res.PeakQueue = max(iso.res.PeakQueue, depth)
		}
	}
	now := time.Since(r.origin).Nanoseconds()
	iso.res.CatchUpSeconds = float64(now-healed) / 1e9
	fmt.Fprintf(r.cfg.Progress, "sink down caught up in %.1fs\n", iso.res.CatchUpSeconds)
}

// producersStopped ends the per-minute reports.
func (iso *isolation) producersStopped() { iso.stopMinutes() }

// stop stops watching the outage. It may be called more than once.
func (iso *isolation) stop() {
	iso.cancel()
	iso.wg.Wait()
}

// finish stops watching the outage and fills the result: the healthy
// sink's latencies by phase (the producers stopped at end, nanoseconds
// since origin) and each report's p99 ratio.
func (iso *isolation) finish(end int64) {
	iso.stop()
	r := iso.r
	from, to := r.outageFrom.Load(), r.outageTo.Load()
	records := r.rec.all()
	iso.res.Before = r.latenciesBetween(records, iso.start, from)
	iso.res.During = r.latenciesBetween(records, from, to)
	iso.res.After = r.latenciesBetween(records, to, end)
	if iso.res.Before != nil && iso.res.Before.P99 > 0 {
		before := iso.res.Before.P99
		for _, ivs := range [][]Interval{r.res.Minutes, r.res.Intervals} {
			for i := range ivs {
				ivs[i].P99Ratio = ivs[i].LatencyP99 / before
			}
		}
		for _, iv := range r.res.Minutes {
			if iv.Phase != "before" {
				iso.res.WorstMinuteP99Ratio = max(iso.res.WorstMinuteP99Ratio, iv.P99Ratio)
			}
		}
	}
	reports := r.res.Intervals
	if len(reports) == 0 {
		reports = r.res.Minutes
	}
	healedAt := iso.res.OutageAfterSeconds + iso.res.OutageSeconds
	until := math.Inf(1)
	if iso.res.CatchUpSeconds > 0 {
		until = healedAt + iso.res.CatchUpSeconds
	}
	iso.res.BacklogRises = backlogRises(reports, healedAt, until, iso.res.BacklogAtHeal)
	r.res.Isolation = iso.res
}

// backlogRises counts the reports from the first after healedAt to the
// first at or after until (seconds from the producers' start) whose
// backlog of "down" is larger than at the report before; the first is
// compared with atHeal, the backlog when the outage ended.
func backlogRises(reports []Interval, healedAt, until float64, atHeal int64) int {
	rises, last := 0, atHeal
	for _, iv := range reports {
		if iv.AtSeconds <= healedAt || iv.DownBacklog == nil {
			continue
		}
		if *iv.DownBacklog > last {
			rises++
		}
		if iv.AtSeconds >= until {
			break
		}
		last = *iv.DownBacklog
	}
	return rises
}

// latenciesBetween is ack minus commit of the first delivery of each event
// acknowledged from from to to (nanoseconds since origin).
func (r *run) latenciesBetween(records []Record, from, to int64) *Percentiles {
	seen := make([]bool, len(r.commitNanos))
	var ns []int64
	for _, rec := range records {
		if rec.Index < 0 || rec.Index >= int64(len(seen)) || seen[rec.Index] {
			continue
		}
		seen[rec.Index] = true
		c := atomic.LoadInt64(&r.commitNanos[rec.Index])
		if c == 0 || rec.AckNanos < from || rec.AckNanos >= to {
			continue
		}
		ns = append(ns, max(rec.AckNanos-c, 0))
	}
	return percentiles(ns)
}
