// Package metrics exposes the relay's measurements in Prometheus format.
// Metrics implements relay.Observer: set it as relay.Config.Observer and
// serve its registry (the admin server does, on /metrics).
//
// Counters are labelled by sink and topic: keep topic names to a bounded set
// (they are event kinds, not ids), as every label pair is a time series.
//
// The backlog gauges come from the database; RefreshBacklog reads them with
// one cheap query every interval, never on a scrape.
package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// Metrics holds the relay's Prometheus collectors.
type Metrics struct {
	published    *prometheus.CounterVec
	failed       *prometheus.CounterVec
	retried      *prometheus.CounterVec
	deadOnSink   *prometheus.CounterVec
	deferred     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	claimed      prometheus.Counter

	claimSeconds    prometheus.Histogram
	recordSeconds   prometheus.Histogram
	publishSeconds  *prometheus.HistogramVec
	deliverySeconds *prometheus.HistogramVec

	paused *prometheus.GaugeVec

	pending, dead, oldestPending prometheus.Gauge
	backlogErrors                prometheus.Counter

	historyLength prometheus.Gauge
}

var _ relay.StoreObserver = (*Metrics)(nil)

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	sinkTopic := []string{"sink", "topic"}
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_published_total",
			Help: "Events a sink acknowledged.",
		}, sinkTopic),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_failed_total",
			Help: "Delivery attempts that failed (to be retried or dead-lettered).",
		}, sinkTopic),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_retried_total",
			Help: "Failed deliveries scheduled for another attempt.",
		}, sinkTopic),
		deadOnSink: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_dead_lettered_total",
			Help: "Deliveries that failed for good on a sink (permanent error or attempts exhausted).",
		}, sinkTopic),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_deferred_total",
			Help: "Deliveries put off because the sink was down (no attempt counted).",
		}, sinkTopic),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_dead_letters_total",
			Help: "Dead letters recorded: deliveries that failed for good, on a sink or at the routing step (no route, unreadable event).",
		}, []string{"topic"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_events_claimed_total",
			Help: "Events claimed from the outbox table.",
		}),
		claimSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "herald_claim_duration_seconds",
			Help:    "Time of one claim round trip.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		recordSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "herald_record_duration_seconds",
			Help:    "Time of one outcome-recording round trip.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		publishSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_publish_duration_seconds",
			Help:    "Time of one Publish call to a sink (a batch of events).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"sink"}),
		deliverySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_commit_to_publish_seconds",
			Help:    "Time from an event's created_at (its transaction's start) to the sink's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"sink"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "herald_sink_paused",
			Help: "1 while a sink is paused because it is down, else 0.",
		}, []string{"sink"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_pending_events",
			Help: "What is not delivered yet: events in the outbox not claimed yet plus deliveries queued for a sink (refreshed periodically).",
		}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_dead_events",
			Help: "Dead letters, one per event and sink, waiting for an operator (refreshed periodically).",
		}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_oldest_pending_age_seconds",
			Help: "Age of the oldest due event pending in the outbox or queued for a sink (events written with a delay count once due), 0 when none (refreshed periodically).",
		}),
		backlogErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_backlog_refresh_errors_total",
			Help: "Failed reads of the backlog gauges.",
		}),
		historyLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_mysql_history_list_length",
			Help: "InnoDB's history list length: undo records not yet purged, over which claims slow down; a long transaction on the server holds it up (MySQL and MariaDB; 0 on PostgreSQL or without the PROCESS privilege; read every 10s).",
		}),
	}
	for _, c := range []prometheus.Collector{m.published, m.failed, m.retried, m.deadOnSink, m.deferred,
		m.deadLettered, m.claimed, m.claimSeconds, m.recordSeconds, m.publishSeconds, m.deliverySeconds,
		m.paused, m.pending, m.dead, m.oldestPending, m.backlogErrors, m.historyLength} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Claimed implements relay.Observer.
func (m *Metrics) Claimed(events int, took time.Duration) {
	m.claimed.Add(float64(events))
	m.claimSeconds.Observe(took.Seconds())
}

// Published implements relay.Observer.
func (m *Metrics) Published(sink, topic string, latency time.Duration) {
	m.published.WithLabelValues(sink, topic).Inc()
	m.deliverySeconds.WithLabelValues(sink).Observe(max(latency, 0).Seconds())
}

// Failed implements relay.Observer.
func (m *Metrics) Failed(sink, topic, outcome string) {
	switch outcome {
	case "retry":
		m.failed.WithLabelValues(sink, topic).Inc()
		m.retried.WithLabelValues(sink, topic).Inc()
	case "dead":
		m.failed.WithLabelValues(sink, topic).Inc()
		m.deadOnSink.WithLabelValues(sink, topic).Inc()
	case "paused":
		m.deferred.WithLabelValues(sink, topic).Inc()
	}
}

// DeadLettered implements relay.Observer.
func (m *Metrics) DeadLettered(topic string) { m.deadLettered.WithLabelValues(topic).Inc() }

// SinkPaused implements relay.Observer.
func (m *Metrics) SinkPaused(sink string, paused bool) {
	v := 0.0
	if paused {
		v = 1
	}
	m.paused.WithLabelValues(sink).Set(v)
}

// Recorded implements relay.Observer.
func (m *Metrics) Recorded(_ int, took time.Duration) { m.recordSeconds.Observe(took.Seconds()) }

// SinkPublish implements relay.Observer.
func (m *Metrics) SinkPublish(sink string, _ int, took time.Duration) {
	m.publishSeconds.WithLabelValues(sink).Observe(took.Seconds())
}

// HistoryLength implements relay.StoreObserver: it sets
// herald_mysql_history_list_length.
func (m *Metrics) HistoryLength(n int64) { m.historyLength.Set(float64(n)) }

// SetBacklog sets the backlog gauges: herald_backlog_pending_events to
// what is not delivered yet (t.Undelivered: pending events plus queued
// deliveries), herald_backlog_oldest_pending_age_seconds to t.OldestAge and
// herald_backlog_dead_events to the dead letters.
func (m *Metrics) SetBacklog(t deadletter.Totals) {
	m.pending.Set(float64(t.Undelivered()))
	m.dead.Set(float64(t.Dead))
	m.oldestPending.Set(t.OldestAge.Seconds())
}

// BacklogFunc reads the backlog; (*deadletter.Store).Totals is one.
type BacklogFunc func(ctx context.Context) (deadletter.Totals, error)

// RefreshBacklog sets the backlog gauges from read at once and then every
// interval until ctx ends. Failures are counted and logged; the gauges keep
// their last values. A nil logger discards logs.
func (m *Metrics) RefreshBacklog(ctx context.Context, interval time.Duration, read BacklogFunc, logger *slog.Logger) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		readCtx, cancel := context.WithTimeout(ctx, interval)
		totals, err := read(readCtx)
		cancel()
		switch {
		case err == nil:
			m.SetBacklog(totals)
		case ctx.Err() == nil:
			m.backlogErrors.Inc()
			logger.WarnContext(ctx, "metrics: reading the backlog failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
