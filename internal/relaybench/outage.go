package relaybench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OutageResult is what ModeOutage measured.
type OutageResult struct {
	// OutageSeconds is how long the sink "down" refused events, from the
	// backlog's commit.
	OutageSeconds float64 `json:"outage_s"`
	// PauseMaxSeconds is relay.Config.SinkPause.Max.
	PauseMaxSeconds float64 `json:"pause_max_s"`
	// QueuedSeconds is the time from the commit until the sink "up" had
	// every event and the outbox was empty (every event delivered to "up"
	// or waiting for "down" in its queue); 0 when that was not so before
	// the outage ended.
	QueuedSeconds float64 `json:"queued_s"`
	// QueueDepth is the deliveries waiting for "down" when it came back.
	QueueDepth int64 `json:"queue_depth"`
	// Probes is the Publish calls "down" refused while it was down: the
	// first, and the relay's probes of the paused sink.
	Probes int64 `json:"probes"`
	// CatchUpSeconds is the time from the end of the outage until both the
	// outbox and the deliveries table were empty (every event delivered to
	// both sinks and recorded), polled every few milliseconds.
	CatchUpSeconds float64 `json:"catch_up_s"`
	// CatchUpEventsPerSecond is the events "down" acknowledged after it
	// came back (every event, when the outage outlasted the queueing;
	// otherwise also those still in the outbox then) over CatchUpSeconds.
	CatchUpEventsPerSecond float64 `json:"catch_up_events_per_s"`
	// Writes are the row writes the run cost.
	Writes Writes `json:"writes"`
	// HandedOff is the events batches stopped waiting for (a sink had not
	// answered within relay.hand_off_after): each costs its delivery's
	// INSERT and DELETE, and sometimes a promotion, on top of the outage's
	// own writes. 0 on a machine that keeps up.
	HandedOff int64 `json:"handed_off"`
}

// Writes are row writes counted by PostgreSQL's statistics
// (pg_stat_user_tables), from before the backlog's commit until the relays
// stopped, excluding the events' own INSERT into the outbox.
type Writes struct {
	Outbox     TableWrites `json:"outbox"`
	Deliveries TableWrites `json:"deliveries"`
	// Total is Outbox.Writes plus Deliveries.Writes.
	Total int64 `json:"total"`
	// PerEvent is Total over the events committed.
	PerEvent float64 `json:"per_event"`
}

// TableWrites are one table's row writes: n_tup_ins, n_tup_upd (HOT
// updates included) and n_tup_del, and their sum (for the outbox, less the
// events' own INSERT).
type TableWrites struct {
	Inserted int64 `json:"inserted"`
	Updated  int64 `json:"updated"`
	Deleted  int64 `json:"deleted"`
	Writes   int64 `json:"writes"`
}

func (w TableWrites) minus(base TableWrites) TableWrites {
	return TableWrites{Inserted: w.Inserted - base.Inserted, Updated: w.Updated - base.Updated, Deleted: w.Deleted - base.Deleted}
}

func (w *TableWrites) sum(excluded int64) {
	w.Writes = w.Inserted + w.Updated + w.Deleted - excluded
}

// outage commits the backlog while the sink "down" refuses every event,
// keeps it down for cfg.Outage, brings it back, and measures the row writes
// and the time until both tables are empty.
func (r *run) outage(ctx context.Context) error {
	cfg := r.cfg
	down := r.sink(SinkDown)
	down.fault.down.Store(true)
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()
	out := &OutageResult{PauseMaxSeconds: cfg.PauseMax.Seconds()}
	r.res.Outage = out

	base, err := r.tableWrites(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Progress, "inserting %d events over %s in schema %s, sink down refusing them...\n", cfg.Events, keysText(cfg.Keys), r.tables.Schema)
	m := r.startMeasuring("the measured phase (VmHWM reset at its start): the outage and the catch-up; includes the recorders")
	r.target.Store(int64(cfg.Events))
	if err := r.commitEvents(ctx, 0, cfg.Events, "", true); err != nil {
		return err
	}
	m.start = time.Since(r.origin).Nanoseconds()
	heal := m.start + cfg.Outage.Nanoseconds()
	r.outageFrom.Store(m.start)
	r.outageTo.Store(heal)
	stopReports := r.startReports(ctx, m.start, nil)
	fmt.Fprintf(cfg.Progress, "committed; sink down is down for %s (sink pause at most %s)...\n", cfg.Outage, cfg.PauseMax)

	// The backlog fans out: "up" takes every event, "down" gets a delivery.
	if at, err := r.waitEmpty(ctx, rs, r.sink(SinkUp), int64(cfg.Events), false, heal); err != nil {
		stopReports()
		return err
	} else if at > 0 {
		out.QueuedSeconds = float64(at-m.start) / 1e9
		fmt.Fprintf(cfg.Progress, "queued in %.3fs: every event on up, the outbox empty\n", out.QueuedSeconds)
	}
	if !sleep(ctx, time.Duration(heal-time.Since(r.origin).Nanoseconds())) {
		stopReports()
		return ctx.Err()
	}
	if out.QueueDepth, err = r.queueDepth(ctx, SinkDown); err != nil {
		stopReports()
		return fmt.Errorf("counting the deliveries waiting for sink down: %w", err)
	}
	down.fault.down.Store(false)
	healed := time.Since(r.origin).Nanoseconds()
	ackedBefore := down.rec.Unique()
	out.OutageSeconds = float64(healed-m.start) / 1e9
	out.Probes = down.fault.refused.Load()
	out.HandedOff = r.obs.handedOff.Load()
	fmt.Fprintf(cfg.Progress, "sink down is back, %d deliveries waiting for it; catching up...\n", out.QueueDepth)

	end, err := r.waitEmpty(ctx, rs, nil, int64(cfg.Events), true, healed+cfg.Timeout.Nanoseconds())
	stopReports()
	if err != nil {
		return err
	}
	if end == 0 {
		fmt.Fprintf(cfg.Progress, "timed out after %s: %s of %d events delivered\n", cfg.Timeout, r.uniqueText(), cfg.Events)
		end = time.Since(r.origin).Nanoseconds()
	} else {
		out.CatchUpSeconds = float64(end-healed) / 1e9
		if out.CatchUpSeconds > 0 {
			out.CatchUpEventsPerSecond = float64(cfg.Events-ackedBefore) / out.CatchUpSeconds
		}
	}
	cpu := cpuTime() - m.cpu0
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	stop()

	after, err := r.settledTableWrites(ctx)
	if err != nil {
		return err
	}
	w := &out.Writes
	w.Outbox, w.Deliveries = after.Outbox.minus(base.Outbox), after.Deliveries.minus(base.Deliveries)
	w.Outbox.sum(int64(cfg.Events))
	w.Deliveries.sum(0)
	w.Total = w.Outbox.Writes + w.Deliveries.Writes
	w.PerEvent = float64(w.Total) / float64(cfg.Events)

	committed := make([]bool, cfg.Events)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, end-m.start, cpu, cpuScopeDrain)
	return nil
}

// commitEvents commits the events of index lo to hi-1 (over cfg.Keys keys,
// or all of key) in one transaction of a connection of its own, under the
// run's application name, then closes it: its counters reach the statistics
// when it exits. With analyze, the statistics of the outbox and deliveries
// tables are refreshed before the commit: the outbox's as autovacuum would
// have for a backlog, the deliveries table's as the relay's own vacuum
// (VACUUM (ANALYZE) of both tables) leaves them, so that a run starts from
// the statistics a long-running relay has rather than a new table's.
func (r *run) commitEvents(ctx context.Context, lo, hi int, key string, analyze bool) error {
	pool, err := newPool(ctx, r.cfg.DatabaseURL, 1, func(pc *pgxpool.Config) {
		pc.ConnConfig.RuntimeParams["application_name"] = r.appName
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inserting events: %w", err)
	}
	defer tx.Rollback(ctx)
	if err := r.insertEvents(ctx, tx, lo, hi, key); err != nil {
		return err
	}
	if analyze {
		if _, err := tx.Exec(ctx, "ANALYZE "+r.tables.Outbox()+", "+r.tables.Deliveries()); err != nil {
			return fmt.Errorf("analyzing the outbox and deliveries tables: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", r.tables.Channel()); err != nil {
		return fmt.Errorf("notifying the relays: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing events %d to %d: %w", lo, hi-1, err)
	}
	return nil
}

// waitEmpty waits until sink (every sink when nil) acknowledged n distinct
// events of the run and the outbox (with deliveries, the deliveries table
// too) holds no row, or until deadline (nanoseconds since origin). It
// returns when the tables were found empty, or 0 at the deadline.
func (r *run) waitEmpty(ctx context.Context, rs *relays, sink *benchSink, n int64, deliveries bool, deadline int64) (int64, error) {
	q := `SELECT NOT EXISTS (SELECT 1 FROM ` + r.tables.Outbox() + `)`
	if deliveries {
		q += ` AND NOT EXISTS (SELECT 1 FROM ` + r.tables.Deliveries() + `)`
	}
	for {
		if err := rs.failed(); err != nil {
			return 0, err
		}
		now := time.Since(r.origin).Nanoseconds()
		if now >= deadline {
			return 0, nil
		}
		acked := r.delivered(n)
		if sink != nil {
			acked = int64(sink.rec.Unique()) >= n
		}
		if acked {
			var empty bool
			if err := r.admin.QueryRow(ctx, q).Scan(&empty); err != nil {
				return 0, fmt.Errorf("looking for rows left: %w", err)
			}
			if empty {
				return now, nil
			}
		}
		if !sleep(ctx, 5*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

// tableCounts are the cumulative writes of the outbox and deliveries
// tables.
type tableCounts struct{ Outbox, Deliveries TableWrites }

// tableWrites reads the outbox's and the deliveries table's counters, after
// asking this session's pending counters to be flushed.
func (r *run) tableWrites(ctx context.Context) (tableCounts, error) {
	var c tableCounts
	conn, err := r.admin.Acquire(ctx)
	if err != nil {
		return c, fmt.Errorf("reading table statistics: %w", err)
	}
	defer conn.Release()
	// PostgreSQL 15 and later; the counters read below are those of other
	// sessions, so an older server's error changes nothing.
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		r.log.Debug("relaybench: pg_stat_force_next_flush", "error", err)
	}
	rows, err := conn.Query(ctx, `SELECT relid = $1::regclass, n_tup_ins, n_tup_upd, n_tup_del
FROM pg_stat_user_tables WHERE relid IN ($1::regclass, $2::regclass)`, r.tables.Outbox(), r.tables.Deliveries())
	if err != nil {
		return c, fmt.Errorf("reading table statistics: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			outbox bool
			w      TableWrites
		)
		if err := rows.Scan(&outbox, &w.Inserted, &w.Updated, &w.Deleted); err != nil {
			return c, fmt.Errorf("reading table statistics: %w", err)
		}
		if outbox {
			c.Outbox = w
		} else {
			c.Deliveries = w
		}
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("reading table statistics: %w", err)
	}
	return c, nil
}

// settledTableWrites reads the counters once every session that wrote the
// tables is gone (a backend flushes its counters before it leaves
// pg_stat_activity) and two reads in a row agree.
func (r *run) settledTableWrites(ctx context.Context) (tableCounts, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := r.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, r.appName).Scan(&n); err != nil {
			return tableCounts{}, fmt.Errorf("waiting for the relays' sessions to end: %w", err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return tableCounts{}, errors.New("waiting for the relays' sessions to end: still there after 30s")
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return tableCounts{}, ctx.Err()
		}
	}
	prev, err := r.tableWrites(ctx)
	if err != nil {
		return prev, err
	}
	for range 50 {
		if !sleep(ctx, 100*time.Millisecond) {
			return prev, ctx.Err()
		}
		c, err := r.tableWrites(ctx)
		if err != nil || c == prev {
			return c, err
		}
		prev = c
	}
	return prev, errors.New("reading table statistics: the counters kept changing for 5s after the relays stopped")
}
