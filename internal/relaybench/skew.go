package relaybench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
)

// SkewResult is what ModeSkew measured: the spacing of the retries of
// events whose first attempts failed, while the relays' clock was off.
type SkewResult struct {
	// ClockOffsetSeconds is what was added to the relays' clock.
	ClockOffsetSeconds float64 `json:"clock_offset_s"`
	// FailAttempts is the attempts of each event the sink failed.
	FailAttempts int `json:"fail_attempts"`
	// PollIntervalMS is relay.Config.PollInterval: the relay looks for
	// retries coming due this often, so a retry may come this much after
	// its time.
	PollIntervalMS float64 `json:"poll_interval_ms"`
	// Attempts is the Publish attempts the sink saw, over every event.
	Attempts int64 `json:"attempts"`
	// Retries are, for each failed attempt k (1 to FailAttempts), the
	// configured delay before attempt k+1 and the spacing observed.
	Retries []RetrySpacing `json:"retries"`
}

// RetrySpacing is the spacing of one retry of every event.
type RetrySpacing struct {
	// After is the failed attempt the retry follows (1: the first).
	After int `json:"after"`
	// ConfiguredMS is relay.Config.Backoff's delay after that attempt
	// (no jitter).
	ConfiguredMS float64 `json:"configured_ms"`
	// Observed is the time from the start of the failed attempt to the
	// start of the next, over the events.
	Observed *Percentiles `json:"observed_ms,omitempty"`
	// MinMS is the shortest spacing observed.
	MinMS float64 `json:"min_ms"`
	// Ratio is Observed.P50 over ConfiguredMS.
	Ratio float64 `json:"ratio"`
}

// errRetryLater is the retryable failure of ModeSkew's sink.
var errRetryLater = errors.New("relaybench: an early attempt fails (a simulated retryable error)")

// attempts makes a sink fail each event's first fail attempts and notes
// when every attempt began. It is safe for concurrent use.
type attempts struct {
	ids    idCodec
	origin time.Time
	fail   int

	mu sync.Mutex
	// at holds, for event index i, the start of its attempt k at
	// i*(fail+1)+k, for the first fail+1 attempts.
	at    []int64
	count []int32
	total int64
}

func newAttempts(ids idCodec, origin time.Time, events, fail int) *attempts {
	return &attempts{ids: ids, origin: origin, fail: fail, at: make([]int64, events*(fail+1)), count: make([]int32, events)}
}

// attempt notes an attempt of the event of index idx begun at, and reports
// whether it must fail.
func (a *attempts) attempt(idx, at int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total++
	if idx < 0 || idx >= int64(len(a.count)) {
		return false
	}
	k := int(a.count[idx])
	a.count[idx]++
	if k <= a.fail {
		a.at[int(idx)*(a.fail+1)+k] = at
	}
	return k < a.fail
}

// attemptSink fails each event's first attempts (retryable) and hands the
// others to the sink it wraps.
type attemptSink struct {
	sinks.Sink
	a *attempts
}

// Publish implements sinks.Sink. An event that fails makes the later events
// of its key in the call skipped (sinks.ErrSkipped), as the Sink contract
// asks, with no attempt noted.
func (s *attemptSink) Publish(ctx context.Context, events []sinks.Event) []error {
	at := time.Since(s.a.origin).Nanoseconds()
	results := make([]error, len(events))
	pass := make([]sinks.Event, 0, len(events))
	where := make([]int, 0, len(events))
	failedKeys := map[string]bool{}
	for i := range events {
		e := &events[i]
		switch {
		case e.Key != "" && failedKeys[e.Key]:
			results[i] = sinks.ErrSkipped
		case s.a.attempt(s.a.ids.index(e.ID), at):
			results[i] = errRetryLater
			if e.Key != "" {
				failedKeys[e.Key] = true
			}
		default:
			pass = append(pass, *e)
			where = append(where, i)
		}
	}
	if len(pass) == 0 {
		return results
	}
	inner := s.Sink.Publish(ctx, pass)
	if len(inner) != len(pass) {
		inner = sinks.Fill(len(pass), errors.New("relaybench: the wrapped sink returned a wrong number of results"))
	}
	for j, i := range where {
		results[i] = inner[j]
	}
	return results
}

// skewBackoff is relay.Config.Backoff in ModeSkew: growing, without jitter,
// so that each retry has one configured delay to compare with.
func (c Config) skewBackoff() relay.Backoff {
	return relay.Backoff{Initial: min(DefaultSkewBackoffInitial, c.BackoffMax), Max: c.BackoffMax, Multiplier: 2, Jitter: -1}
}

// skew commits Events events to a sink that fails each one's first
// FailAttempts attempts, with the relays' clock ClockOffset off, and waits
// until every event is delivered and both tables are empty.
func (r *run) skew(ctx context.Context) error {
	cfg := r.cfg
	a := newAttempts(r.ids, r.origin, cfg.Events, cfg.FailAttempts)
	r.addSink("bench", cfg.Events, func() (sinks.Sink, error) {
		return &attemptSink{Sink: sinks.NewDiscard("bench"), a: a}, nil
	}, nil, nil)
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()

	fmt.Fprintf(cfg.Progress, "inserting %d events over %s in schema %s; the relays' clock is %s off, each event's first %d attempts fail...\n",
		cfg.Events, keysText(cfg.Keys), r.tables.Schema, cfg.ClockOffset, cfg.FailAttempts)
	m := r.startMeasuring("the measured phase (VmHWM reset at its start); includes the recorder")
	r.target.Store(int64(cfg.Events))
	if err := r.commitEvents(ctx, 0, cfg.Events, "", true); err != nil {
		return err
	}
	m.start = time.Since(r.origin).Nanoseconds()
	stopReports := r.startReports(ctx, m.start, nil)
	end, err := r.waitEmpty(ctx, rs, nil, int64(cfg.Events), true, m.start+cfg.Timeout.Nanoseconds())
	stopReports()
	if err != nil {
		return err
	}
	if end == 0 {
		fmt.Fprintf(cfg.Progress, "timed out after %s: %s of %d events delivered\n", cfg.Timeout, r.uniqueText(), cfg.Events)
		end = time.Since(r.origin).Nanoseconds()
	}
	cpu := cpuTime() - m.cpu0
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	stop()

	committed := make([]bool, cfg.Events)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, end-m.start, cpu, cpuScopeDrain)
	r.res.Skew = a.result(cfg)
	return nil
}

// result summarises the attempts once delivery stopped.
func (a *attempts) result(cfg Config) *SkewResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	res := &SkewResult{ClockOffsetSeconds: cfg.ClockOffset.Seconds(), FailAttempts: a.fail,
		PollIntervalMS: float64(cfg.PollInterval) / 1e6, Attempts: a.total}
	b := cfg.skewBackoff()
	for k := 1; k <= a.fail; k++ {
		var gaps []int64
		for i := range a.count {
			if int(a.count[i]) <= k {
				continue // attempt k+1 never began
			}
			base := i * (a.fail + 1)
			gaps = append(gaps, a.at[base+k]-a.at[base+k-1])
		}
		rs := RetrySpacing{After: k, ConfiguredMS: float64(b.Delay(k)) / 1e6, Observed: percentiles(gaps)}
		if len(gaps) > 0 { // sorted by percentiles
			rs.MinMS = float64(gaps[0]) / 1e6
			rs.Ratio = rs.Observed.P50 / rs.ConfiguredMS
		}
		res.Retries = append(res.Retries, rs)
	}
	return res
}
