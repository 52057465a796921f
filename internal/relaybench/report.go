package relaybench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// startReports writes an Interval every cfg.ReportEvery until the returned
// function is called. committed, when not nil, counts the producers'
// commits. Latencies are reported for live runs (commit times known).
func (r *run) startReports(ctx context.Context, startNanos int64, committed func() int64) (stop func()) {
	return r.startIntervals(ctx, r.cfg.ReportEvery, startNanos, committed, &r.res.Intervals, "")
}

// startIntervals appends an Interval to out, and writes its line (after
// label) to Progress, every `every` until the returned function is called.
// every <= 0 reports nothing.
func (r *run) startIntervals(ctx context.Context, every time.Duration, startNanos int64, committed func() int64,
	out *[]Interval, label string) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	down := r.sink(SinkDown)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		var (
			pos, claimPos, lastUnique, lastDown int
			lastCommitted                       int64
			last                                = time.Since(r.origin).Nanoseconds()
		)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			now := time.Since(r.origin).Nanoseconds()
			secs := float64(now-last) / 1e9
			var recs []Record
			recs, pos = r.rec.since(pos)
			unique := r.rec.Unique()
			iv := Interval{
				AtSeconds:       float64(now-startNanos) / 1e9,
				EventsPerSecond: float64(unique-lastUnique) / secs,
				Phase:           r.phase(last, now),
			}
			last, lastUnique = now, unique
			var claims []time.Duration
			if claims, claimPos = r.obs.claimsSince(claimPos); len(claims) > 0 {
				p := durations(claims)
				iv.ClaimP50, iv.ClaimP99 = p.P50, p.P99
			}
			if committed != nil {
				c := committed()
				iv.CommitRate = float64(c-lastCommitted) / secs
				lastCommitted = c
				if p := r.intervalLatencies(recs); p != nil {
					iv.LatencyP50, iv.LatencyP99 = p.P50, p.P99
				}
			}
			if err := r.tableStats(ctx, &iv); err != nil {
				r.log.Warn("relaybench: reading table statistics", "error", err)
			}
			if down != nil {
				u := down.rec.Unique()
				iv.DownEventsPerSecond = float64(u-lastDown) / secs
				lastDown = u
				if n, err := r.queueDepth(ctx, SinkDown); err != nil {
					r.log.Warn("relaybench: reading the queue of the sink down", "error", err)
				} else {
					iv.DownQueue = &n
				}
				if committed != nil {
					backlog := max(lastCommitted-int64(u), 0)
					iv.DownBacklog = &backlog
				}
			}
			*out = append(*out, iv)
			fmt.Fprintln(r.cfg.Progress, label+iv.String())
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// phase places the span from..to (nanoseconds since origin) against the
// outage: "" when the run has none. A span overlapping the outage's start
// or end by less than a fiftieth of its length (a report's timer firing a
// little late) is not "mixed".
func (r *run) phase(from, to int64) string {
	begin, end := r.outageFrom.Load(), r.outageTo.Load()
	slack := (to - from) / 50
	from, to = from+slack, to-slack
	switch {
	case begin == 0:
		return ""
	case to <= begin:
		return "before"
	case end != 0 && from >= end:
		return "after"
	case from >= begin && (end == 0 || to <= end):
		return "during"
	}
	return "mixed"
}

// queueDepth counts the deliveries waiting for sink (dead letters
// included; the bench makes none).
func (r *run) queueDepth(ctx context.Context, sink string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int64
	err := r.admin.QueryRow(ctx, `SELECT count(*) FROM `+r.tables.Deliveries()+` WHERE sink = $1`, sink).Scan(&n)
	return n, err
}

// intervalLatencies is ack minus commit for the records of one interval
// (re-deliveries included).
func (r *run) intervalLatencies(recs []Record) *Percentiles {
	ns := make([]int64, 0, len(recs))
	for _, rec := range recs {
		if rec.Index < 0 || rec.Index >= int64(len(r.commitNanos)) {
			continue
		}
		if c := atomic.LoadInt64(&r.commitNanos[rec.Index]); c != 0 {
			ns = append(ns, max(rec.AckNanos-c, 0))
		}
	}
	return percentiles(ns)
}

// tableStats reads the backlog, the outbox table's size with its indexes
// and TOAST, and its dead tuples.
func (r *run) tableStats(ctx context.Context, iv *Interval) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r.my != nil {
		return r.my.tableStats(ctx, iv)
	}
	return r.admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+r.tables.Outbox()+` WHERE status = 'pending'),
       pg_total_relation_size($1::regclass),
       coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $2 AND relname = $3), 0)`,
		r.tables.Outbox(), r.tables.Schema, r.tables.Table).Scan(&iv.Backlog, &iv.TableBytes, &iv.DeadTuples)
}

// String is the interval's report line.
func (iv Interval) String() string {
	s := fmt.Sprintf("%8.1fs  %9.0f ev/s", iv.AtSeconds, iv.EventsPerSecond)
	if iv.CommitRate > 0 || iv.LatencyP50 > 0 {
		s += fmt.Sprintf("  p50 %7.2fms  p99 %7.2fms  commits %7.0f/s", iv.LatencyP50, iv.LatencyP99, iv.CommitRate)
	}
	if iv.ClaimP50 > 0 {
		s += fmt.Sprintf("  claim p50 %6.2fms p99 %6.2fms", iv.ClaimP50, iv.ClaimP99)
	}
	s += fmt.Sprintf("  backlog %8d  table %s", iv.Backlog, mib(iv.TableBytes))
	if iv.HistoryLength != nil {
		s += fmt.Sprintf("  history list %d", *iv.HistoryLength)
	} else {
		s += fmt.Sprintf("  dead tuples %d", iv.DeadTuples)
	}
	if iv.DownQueue != nil {
		s += fmt.Sprintf("  down: queue %d, %.0f ev/s", *iv.DownQueue, iv.DownEventsPerSecond)
	}
	if iv.DownBacklog != nil {
		s += fmt.Sprintf(", %d behind", *iv.DownBacklog)
	}
	if iv.Phase != "" {
		s += "  (" + iv.Phase + ")"
	}
	return s
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
