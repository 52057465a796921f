package relaybench

import (
	"context"
	"fmt"
	"time"
)

// HotKeyResult is what ModeHotKey measured besides the drain (Result's
// events/s) and the claims (Result.Claim).
type HotKeyResult struct {
	// Key is the hot key ("k" and the number after the other keys').
	Key string `json:"key"`
	// HotEvents is the events of Key waiting behind its failing head when
	// the measured phase began; 0 for the run to compare with.
	HotEvents int `json:"hot_events"`
	// BackoffMaxSeconds is relay.Config.Backoff.Max: the head is retried
	// at least this often.
	BackoffMaxSeconds float64 `json:"backoff_max_s"`
	// QueuedSeconds is the time from the hot events' commit until the
	// outbox was empty and every one of them waited in the deliveries
	// table (not measured).
	QueuedSeconds float64 `json:"queued_s,omitempty"`
	// HeadAttempts is how often the sink refused the head during the
	// measured phase (each time the relay claimed its queue with it).
	HeadAttempts int64 `json:"head_attempts"`
	// HealSeconds is the time from the key's healing, after the measured
	// phase, until its queue was delivered and both tables were empty.
	HealSeconds float64 `json:"heal_s,omitempty"`
}

// hotKeyNumber is the number of the hot key: the first after the other events'.
func hotKeyNumber(cfg Config) int64 {
	if cfg.Keys > 0 {
		return int64(cfg.Keys)
	}
	return int64(cfg.Events)
}

// hotKey queues cfg.HotEvents events of the hot key behind a head its sink
// keeps failing, then times the drain of cfg.Events events of the other
// keys; then it heals the key and waits for its events.
func (r *run) hotKey(ctx context.Context) error {
	cfg := r.cfg
	s := r.sinks[0]
	s.fault.keyFails.Store(true)
	hot := &HotKeyResult{Key: s.fault.key, HotEvents: cfg.HotEvents, BackoffMaxSeconds: cfg.BackoffMax.Seconds()}
	r.res.HotKey = hot
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()

	if cfg.HotEvents > 0 {
		fmt.Fprintf(cfg.Progress, "queueing %d events of key %s behind a head that keeps failing, in schema %s...\n",
			cfg.HotEvents, hot.Key, r.tables.Schema)
		start := time.Now()
		if err := r.commitEvents(ctx, cfg.Events, cfg.Events+cfg.HotEvents, hot.Key, false); err != nil {
			return err
		}
		if err := r.waitQueued(ctx, rs, int64(cfg.HotEvents), start.Add(cfg.Timeout)); err != nil {
			return err
		}
		hot.QueuedSeconds = time.Since(start).Seconds()
	}

	fmt.Fprintf(cfg.Progress, "inserting %d events over %s...\n", cfg.Events, keysText(cfg.Keys))
	r.obs.reset()
	attempts0 := s.fault.keyRefused.Load()
	m := r.startMeasuring("the measured phase (VmHWM reset at its start); includes the recorder")
	r.target.Store(int64(cfg.Events))
	if err := r.commitEvents(ctx, 0, cfg.Events, "", true); err != nil {
		return err
	}
	m.start = time.Since(r.origin).Nanoseconds()
	fmt.Fprintf(cfg.Progress, "committed; draining with %d relay(s)...\n", cfg.Relays)
	stopReports := r.startReports(ctx, m.start, nil)
	// The hot events cannot be acknowledged: the other events are all
	// delivered when the sink has acknowledged cfg.Events distinct ones.
	end, err := r.waitEmpty(ctx, rs, s, int64(cfg.Events), false, m.start+cfg.Timeout.Nanoseconds())
	stopReports()
	if err != nil {
		return err
	}
	if end == 0 {
		fmt.Fprintf(cfg.Progress, "timed out after %s: %d of %d events delivered\n", cfg.Timeout, r.rec.Unique(), cfg.Events)
		end = time.Since(r.origin).Nanoseconds()
	}
	cpu := cpuTime() - m.cpu0
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	hot.HeadAttempts = s.fault.keyRefused.Load() - attempts0
	claim, publish, record, meanBatch := r.obs.summary()
	failures := r.obs.failed.Load()

	total := cfg.Events + cfg.HotEvents
	if cfg.HotEvents > 0 {
		s.fault.keyFails.Store(false)
		healed := time.Since(r.origin).Nanoseconds()
		fmt.Fprintf(cfg.Progress, "drained; key %s heals, waiting for its %d events...\n", hot.Key, cfg.HotEvents)
		at, err := r.waitEmpty(ctx, rs, nil, int64(total), true, healed+cfg.Timeout.Nanoseconds())
		if err != nil {
			return err
		}
		if at == 0 {
			fmt.Fprintf(cfg.Progress, "timed out after %s: %d of %d events delivered\n", cfg.Timeout, r.rec.Unique(), total)
		} else {
			hot.HealSeconds = float64(at-healed) / 1e9
		}
	}
	stop()

	committed := make([]bool, total)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, end-m.start, cpu, cpuScopeDrain)
	// The figures are the measured phase's, not the healing's.
	r.res.Events = cfg.Events
	if r.res.ElapsedSeconds > 0 {
		r.res.EventsPerSecond = float64(cfg.Events) / r.res.ElapsedSeconds
	}
	r.res.Claim, r.res.Publish, r.res.Record, r.res.MeanBatch = claim, publish, record, meanBatch
	r.res.Failures = failures
	return nil
}

// waitQueued waits until the outbox is empty and the deliveries table holds
// n rows, or until deadline.
func (r *run) waitQueued(ctx context.Context, rs *relays, n int64, deadline time.Time) error {
	q := `SELECT NOT EXISTS (SELECT 1 FROM ` + r.tables.Outbox() + `), (SELECT count(*) FROM ` + r.tables.Deliveries() + `)`
	for {
		if err := rs.failed(); err != nil {
			return err
		}
		var (
			empty  bool
			queued int64
		)
		if err := r.admin.QueryRow(ctx, q).Scan(&empty, &queued); err != nil {
			return fmt.Errorf("counting queued deliveries: %w", err)
		}
		if empty && queued == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queueing events: %d of %d queued after --timeout %s", queued, n, r.cfg.Timeout)
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
}
