package relaybench

import (
	"fmt"
	"io"
)

// WriteText writes the result for people: settings, throughput, latency,
// per-batch timings, CPU, memory and the verification line.
func (res *Result) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("mode %s, sink %s, %d relay(s) × %d worker(s), batch size %d, %s, %d-byte payloads%s\n",
		res.Mode, res.Sink, res.Relays, res.Workers, res.BatchSize, keysText(res.Keys), res.PayloadBytes, pollText(res.PollOnly))
	if !res.LanesSettled {
		ew.printf("note: the relays had not shared out the lanes when the measurement began\n")
	}
	ew.printf("%d events in %.3fs: %.0f events/s\n", res.Events, res.ElapsedSeconds, res.EventsPerSecond)
	if p := res.Latency; p != nil {
		ew.printf("commit-to-publish latency: p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms\n", p.P50, p.P90, p.P99, p.Max)
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
		ew.printf("failed deliveries (retried): %d\n", res.Failures)
	}
	ew.printf("cpu: %.2fs (%.2f cores) — %s\n", res.CPUSeconds, res.CPUCores, res.CPUScope)
	ew.printf("peak RSS: %s over %s; the recorder holds %s of it at most\n", mib(res.PeakRSSBytes), res.RSSScope, mib(res.RecorderBytes))
	if res.RowsLeft != 0 {
		ew.printf("rows left in the outbox table: %d\n", res.RowsLeft)
	}
	ew.printf("%s\n", res.Verification)
	for _, p := range res.Verification.Problems {
		ew.printf("  %s\n", p)
	}
	return ew.err
}

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
