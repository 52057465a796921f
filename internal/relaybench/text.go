package relaybench

import (
	"fmt"
	"io"
	"time"
)

// WriteText writes the result for people: settings, throughput, latency,
// per-batch timings, CPU, memory and the verification line.
func (res *Result) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	sinkText := "sink " + res.Sink
	switch res.Mode {
	case ModeOutage, ModeIsolation:
		sinkText = fmt.Sprintf("sinks %s (%s) and %s (in-process, refusing every event during the outage)", SinkUp, res.Sink, SinkDown)
	case ModeSlow:
		sinkText = fmt.Sprintf("webhook sinks %s and %s (receivers in-process)", SinkFast, SinkSlow)
	case ModeRecovery:
		sinkText = fmt.Sprintf("sinks %s (%s) and %s (webhook, receiver in-process)", SinkUp, res.Sink, SinkHook)
	case ModeBinary:
		sinkText = "relay run with a discard sink"
	case ModeIdle:
		sinkText = "a discard sink, no events"
	}
	ew.printf("mode %s, %s, %d relay(s) × %d worker(s), batch size %d, %s, %d-byte payloads%s\n",
		res.Mode, sinkText, res.Relays, res.Workers, res.BatchSize, keysText(res.Keys), res.PayloadBytes, pollText(res.PollOnly))
	if res.History > 0 {
		ew.printf("after a history: %d events drained through the same relays, the tables analysed mid-drain; the backlog not analysed\n", res.History)
	}
	if !res.LanesSettled {
		ew.printf("note: the relays had not shared out the lanes when the measurement began\n")
	}
	if res.Idle != nil {
		writeIdle(ew, res)
		return ew.err
	}
	if h := res.HotKey; h != nil {
		writeHotKey(ew, h)
	}
	switch {
	case res.Outage != nil:
		writeOutage(ew, res.Events, res.Outage)
	case res.Recovery != nil:
		writeRecovery(ew, res.Recovery)
	case res.Binary != nil:
		b := res.Binary
		ew.printf("%d events in %.3fs from the process's start: %.0f events/s (admin /metrics up after %.3fs, %d scrapes)\n",
			res.Events, res.ElapsedSeconds, res.EventsPerSecond, b.MetricsUpSeconds, b.Scrapes)
		ew.printf("first event published %.3fs after the start; %.0f events/s from then on\n", b.FirstPublishedSeconds, b.DrainEventsPerSecond)
	default:
		ew.printf("%d events in %.3fs: %.0f events/s\n", res.Events, res.ElapsedSeconds, res.EventsPerSecond)
	}
	if p := res.Latency; p != nil {
		who := ""
		if res.Isolation != nil {
			who = " (sink up)"
		}
		if res.Slow != nil {
			who = " (sink fast)"
		}
		ew.printf("commit-to-publish latency%s: p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n", who, p.P50, p.P90, p.P99, p.Max)
	}
	if in := res.Insert; in != nil {
		if p := in.Latency; p != nil {
			ew.printf("an application's INSERT during the drain: %d, p50 %.2fms  p99 %.2fms  max %.2fms", p.Count, p.P50, p.P99, p.Max)
		} else {
			ew.printf("an application's INSERT during the drain: none completed")
		}
		ew.printf("; %d would have waited for a lock, %d failed otherwise\n", in.LockWaits, in.Errors)
	}
	if iso := res.Isolation; iso != nil {
		writeIsolation(ew, iso, res.Minutes)
	}
	if sl := res.Slow; sl != nil {
		writeSlow(ew, sl)
	}
	if sk := res.Skew; sk != nil {
		writeSkew(ew, sk)
	}
	if p := res.Producers; p != nil {
		perTx := "one event per transaction"
		if p.TxEvents > 1 {
			perTx = fmt.Sprintf("%d events per transaction", p.TxEvents)
		}
		ew.printf("producers: %d, %s, commit rate %.0f events/s", p.Producers, perTx, p.CommitRate)
		if p.BaselineCommitRate > 0 {
			ew.printf(" with relays vs %.0f events/s without (ratio %.2f)", p.BaselineCommitRate, p.Ratio)
		}
		if p.Errors > 0 {
			ew.printf(", %d failed commits", p.Errors)
		}
		ew.printf("\n")
	}
	if p := res.Claim; p != nil {
		ew.printf("claim:  %d batches (mean %.0f events), p50 %.2fms  p99 %.2fms  max %.2fms\n", p.Count, res.MeanBatch, p.P50, p.P99, p.Max)
	}
	if p := res.Publish; p != nil {
		ew.printf("publish: %d calls, p50 %.2fms  p99 %.2fms  max %.2fms\n", p.Count, p.P50, p.P99, p.Max)
	}
	if p := res.Record; p != nil {
		ew.printf("record: %d batches, p50 %.2fms  p99 %.2fms  max %.2fms\n", p.Count, p.P50, p.P99, p.Max)
	}
	if res.Failures > 0 {
		ew.printf("failed deliveries (to retry, paused or dead): %d\n", res.Failures)
	}
	ew.printf("cpu: %.2fs (%.2f cores) — %s\n", res.CPUSeconds, res.CPUCores, res.CPUScope)
	if res.DatabaseCPUSeconds > 0 && res.Events > 0 {
		ew.printf("database cpu: %.2fs (%.1f µs an event) — every process of the local PostgreSQL server\n",
			res.DatabaseCPUSeconds, res.DatabaseCPUSeconds*1e6/float64(res.Events))
	}
	if res.WriteDatabaseCPUSeconds > 0 && res.Events > 0 {
		ew.printf("database cpu writing the backlog: %.2fs (%.1f µs an event)\n",
			res.WriteDatabaseCPUSeconds, res.WriteDatabaseCPUSeconds*1e6/float64(res.Events))
	}
	ew.printf("peak RSS: %s over %s; the recorder holds %s of it at most\n", mib(res.PeakRSSBytes), res.RSSScope, mib(res.RecorderBytes))
	if res.RowsLeft != 0 {
		ew.printf("rows left in the outbox table: %d\n", res.RowsLeft)
	}
	if b := res.Binary; b != nil {
		// The relay ran out of process: its counter, not the recorder.
		ew.printf("counted by %s: %d of %d events; rows left %d (per-event order not checked out of process)\n",
			publishedMetric, b.Published, res.Events, res.RowsLeft)
		return ew.err
	}
	ew.printf("%s\n", res.Verification)
	for _, p := range res.Verification.Problems {
		ew.printf("  %s\n", p)
	}
	for _, s := range res.Sinks {
		ew.printf("  sink %s: %s\n", s.Name, s.Verification)
	}
	return ew.err
}

func writeOutage(ew *errWriter, events int, o *OutageResult) {
	ew.printf("%d events committed; sink down refused them for %.1fs (sink pause at most %s): %d publish calls refused\n",
		events, o.OutageSeconds, seconds(o.PauseMaxSeconds), o.Probes)
	if o.QueuedSeconds > 0 {
		ew.printf("queued in %.3fs: every event on up, the outbox empty\n", o.QueuedSeconds)
	} else {
		ew.printf("not all queued when the outage ended\n")
	}
	ew.printf("%d deliveries waited for down when it came back", o.QueueDepth)
	if o.CatchUpSeconds > 0 {
		ew.printf("; it caught up in %.3fs (%.0f events/s to it), both tables empty", o.CatchUpSeconds, o.CatchUpEventsPerSecond)
	}
	ew.printf("\n")
	w := o.Writes
	ew.printf("row writes (pg_stat_user_tables, the events' own INSERT excluded):\n")
	for _, t := range []struct {
		name string
		w    TableWrites
	}{{"outbox", w.Outbox}, {"deliveries", w.Deliveries}} {
		ew.printf("  %-10s  %9d inserted  %9d updated  %9d deleted  = %9d\n", t.name, t.w.Inserted, t.w.Updated, t.w.Deleted, t.w.Writes)
	}
	ew.printf("  total %d: %.4f per event\n", w.Total, w.PerEvent)
}

func writeIsolation(ew *errWriter, iso *IsolationResult, minutes []Interval) {
	ew.printf("sink down refused every event from %.0fs to %.0fs (sink pause at most %s), %d publish calls\n",
		iso.OutageAfterSeconds, iso.OutageAfterSeconds+iso.OutageSeconds, seconds(iso.PauseMaxSeconds), iso.Probes)
	if iso.DownAnswerAfterMS > 0 {
		ew.printf("sink down is a webhook whose receiver answers %s late\n", seconds(iso.DownAnswerAfterMS/1e3))
	}
	ew.printf("its queue: %d deliveries when it came back (%d events behind), %d at most", iso.QueueAtHeal, iso.BacklogAtHeal, iso.PeakQueue)
	if iso.CatchUpSeconds > 0 {
		ew.printf(", empty %.1fs later", iso.CatchUpSeconds)
	} else {
		ew.printf(", not seen empty before the run ended")
	}
	ew.printf("; its backlog larger than at the report before in %d reports after the outage\n", iso.BacklogRises)
	for _, ph := range []struct {
		name string
		p    *Percentiles
	}{{"before", iso.Before}, {"during", iso.During}, {"after", iso.After}} {
		if ph.p != nil {
			ew.printf("sink up %s the outage: %d events, p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n",
				ph.name, ph.p.Count, ph.p.P50, ph.p.P90, ph.p.P99, ph.p.Max)
		}
	}
	if len(minutes) > 0 {
		ew.printf("per minute: sink up's p50 and p99 (and the p99 over the p99 before the outage), sink down's queue at the minute's end\n")
		for _, m := range minutes {
			queue := int64(-1)
			if m.DownQueue != nil {
				queue = *m.DownQueue
			}
			ew.printf("  %5.0fs  %-6s  p50 %7.2fms  p99 %7.2fms  ×%.2f  queue %d\n", m.AtSeconds, m.Phase, m.LatencyP50, m.LatencyP99, m.P99Ratio, queue)
		}
		ew.printf("worst minute from the outage on: p99 ×%.2f the p99 before it\n", iso.WorstMinuteP99Ratio)
	}
}

func writeSlow(ew *errWriter, s *SlowResult) {
	if p := s.FastArrival; p != nil {
		ew.printf("commit-to-arrival at sink fast's receiver: p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n", p.P50, p.P90, p.P99, p.Max)
	}
	if p := s.SlowArrival; p != nil {
		ew.printf("commit-to-arrival at sink slow's receiver: p50 %.2fms  p99 %.2fms  max %.2fms\n", p.P50, p.P99, p.Max)
	}
	ew.printf("sink slow: %d events in %.3fs from the producers' start: %.1f events/s, %.0f%% of the %.1f/s its concurrency allows (%d in flight × 1/%s); at most %d requests at once\n",
		s.SlowEvents, s.SlowSeconds, s.SlowEventsPerSecond, 100*s.CapacityShare, s.CapacityPerSecond, s.Concurrency,
		seconds(s.AnswerAfterMS/1e3), s.SlowPeakInFlight)
	ew.printf("events handed off (a batch stopped waiting for them): %d\n", s.HandedOff)
}

func writeRecovery(ew *errWriter, rc *RecoveryResult) {
	ew.printf("sink hook answers %s late, %d requests in flight; sink pause at most %s\n",
		seconds(rc.AnswerAfterMS/1e3), rc.Concurrency, seconds(rc.PauseMaxSeconds))
	ew.printf("flowing: %d events in %.3fs: %.0f events/s\n", rc.EventsEach, rc.FlowingSeconds, rc.FlowingEventsPerSecond)
	ew.printf("queued:  %d deliveries waiting when hook came back, drained in %.3fs: %.0f events/s (ratio to flowing %.2f); first arrival after %.3fs, %.0f events/s from then on\n",
		rc.QueueDepth, rc.QueuedSeconds, rc.QueuedEventsPerSecond, rc.Ratio, rc.ProbeWaitSeconds, rc.QueuedAfterProbeEventsPerSecond)
	ew.printf("from each phase's first arrival: flowing %.0f events/s (first arrival %.3fs after the commit), queued %.0f events/s: drain ratio %.2f\n",
		rc.FlowingAfterFirstEventsPerSecond, rc.FlowingFirstArrivalSeconds, rc.QueuedAfterProbeEventsPerSecond, rc.DrainRatio)
	ew.printf("at most %d requests at hook's receiver at once; it held %.0f %% of what hook may have in flight flowing, %.0f %% queued (from the first arrival)\n",
		rc.PeakInFlight, 100*rc.FlowingBusy, 100*rc.QueuedAfterProbeBusy)
}

func writeSkew(ew *errWriter, s *SkewResult) {
	ew.printf("relays' clock %s off; each event's first %d attempts fail; %d attempts in all; retries looked for every %s\n",
		seconds(s.ClockOffsetSeconds), s.FailAttempts, s.Attempts, seconds(s.PollIntervalMS/1e3))
	for _, rs := range s.Retries {
		if p := rs.Observed; p != nil {
			ew.printf("  after attempt %d: configured %.0fms, observed min %.1fms  p50 %.1fms  p99 %.1fms  max %.1fms (p50 ×%.2f)\n",
				rs.After, rs.ConfiguredMS, rs.MinMS, p.P50, p.P99, p.Max, rs.Ratio)
		} else {
			ew.printf("  after attempt %d: configured %.0fms, no retry observed\n", rs.After, rs.ConfiguredMS)
		}
	}
}

func writeHotKey(ew *errWriter, h *HotKeyResult) {
	if h.HotEvents == 0 {
		ew.printf("no hot key (the run to compare with)\n")
		return
	}
	ew.printf("hot key %s: %d events queued behind a head that keeps failing (retries at most %s apart), refused %d times during the measured phase",
		h.Key, h.HotEvents, seconds(h.BackoffMaxSeconds), h.HeadAttempts)
	if h.HealSeconds > 0 {
		ew.printf("; healed afterwards, its queue delivered in %.3fs", h.HealSeconds)
	}
	ew.printf("\n")
}

// seconds formats a number of seconds as a duration ("1s", "250ms").
func seconds(s float64) string { return time.Duration(s * float64(time.Second)).String() }

func pollText(pollOnly bool) string {
	if pollOnly {
		return ", poll only"
	}
	return ""
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
