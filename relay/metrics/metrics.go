// Package metrics exposes the relay's measurements in Prometheus format.
// Metrics implements relay.Observer: set it as relay.Config.Observer and
// serve its registry (the admin server does, on /metrics).
//
// Counters are labelled by sink and topic: keep topic names to a bounded set
// (they are event kinds, not ids), as every label pair is a time series.
// Each meaning has one name: a failed delivery attempt is counted once, in
// herald_delivery_attempts_failed_total, labelled with what followed it
// (outcome retry or dead); a dead letter once, in herald_dead_letters_total
// (on a sink or at the routing step); an event put off while its sink is
// down, which is no attempt, in herald_events_deferred_total.
//
// The backlog gauges come from the database; RefreshBacklog reads them with
// one cheap query every interval, never on a scrape.
package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldhq/herald/internal/buildinfo"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// Outcomes of a failed attempt (relay.Observer's Failed), the outcome
// label of herald_delivery_attempts_failed_total.
const (
	// outcomeRetry: the delivery is tried again later.
	outcomeRetry = "retry"
	// outcomeDead: the delivery is a dead letter (a permanent error, or
	// its last attempt).
	outcomeDead = "dead"
)

// Config says what the metrics describe. The zero Config is a relay on
// PostgreSQL.
type Config struct {
	// MySQL adds the gauge only MySQL and MariaDB have,
	// herald_mysql_history_list_length. Defaults to false: on PostgreSQL
	// the gauge is not exported.
	MySQL bool
	// CaptureWAL adds the gauges of a relay reading the write-ahead log
	// (database.capture: wal): herald_capture_lag_seconds,
	// herald_capture_slot_retained_bytes and
	// herald_capture_slot_behind_bytes.
	CaptureWAL bool
	// Version labels herald_build_info in place of the version the Go
	// build recorded of Herald's module (the relay binary's -ldflags
	// version). Defaults to the recorded one.
	Version string
}

// Metrics holds the relay's Prometheus collectors.
type Metrics struct {
	relay.NopObserver
	mysql bool

	published      *prometheus.CounterVec
	attemptsFailed *prometheus.CounterVec
	deferred       *prometheus.CounterVec
	deadLettered   *prometheus.CounterVec
	claimed        prometheus.Counter

	claimSeconds    prometheus.Histogram
	recordSeconds   prometheus.Histogram
	publishSeconds  *prometheus.HistogramVec
	deliverySeconds *prometheus.HistogramVec

	paused       *prometheus.GaugeVec
	inFlight     *prometheus.GaugeVec
	handed       *prometheus.CounterVec
	fenced       prometheus.Counter
	unconfigured *prometheus.GaugeVec

	pending, dead, oldestPending prometheus.Gauge
	backlogErrors                prometheus.Counter

	historyLength                        prometheus.Gauge
	captureLag, slotRetained, slotBehind prometheus.Gauge
}

var _ relay.Observer = (*Metrics)(nil)

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer, cfg Config) (*Metrics, error) {
	sinkTopic := []string{"sink", "topic"}
	build := buildinfo.Read()
	if cfg.Version != "" {
		build.Version = cfg.Version
	}
	m := &Metrics{
		mysql: cfg.MySQL,
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_published_total",
			Help: "Events a sink acknowledged, per sink: an event sent to two sinks counts once on each.",
		}, sinkTopic),
		attemptsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_delivery_attempts_failed_total",
			Help: "Delivery attempts a sink failed, whether the event is tried again or becomes a dead letter (herald_dead_letters_total counts those).",
		}, sinkTopic),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_deferred_total",
			Help: "Deliveries put off because the sink was down (no attempt counted).",
		}, sinkTopic),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_dead_letters_total",
			Help: "Dead letters recorded, per sink; sink is empty for those set aside at the routing step (no route matched, the event could not be read).",
		}, sinkTopic),
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
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "herald_sink_in_flight_events",
			Help: "Events a sink has in flight: handed to its Publish calls and not answered yet (at most relay.max_in_flight).",
		}, []string{"sink"}),
		handed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_events_handed_off_total",
			Help: "Events a sink had not answered when their batch stopped waiting (relay.hand_off_after): kept in flight in its queue, their results recorded when they came. A sink that is often slower than hand_off_after shows here.",
		}, []string{"sink"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_records_fenced_total",
			Help: "Records that found lanes of their work held by another lease (they changed hands since the claim): nothing of those lanes was written, their owner sends the events again.",
		}),
		unconfigured: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "herald_unconfigured_sink_deliveries",
			Help: "Deliveries waiting for a sink the relay's configuration does not name: kept until it is configured again (its queue then resumes) or an operator drops them (relay queue drop); counted every 10s.",
		}, []string{"sink"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_pending_events",
			Help: "What is not delivered yet: events in the outbox not claimed yet plus deliveries queued for a sink (counted every minute, the first a minute after start: the count reads the whole backlog).",
		}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_dead_events",
			Help: "Dead letters, one per event and sink, waiting for an operator (counted every minute, the first a minute after start).",
		}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_backlog_oldest_pending_age_seconds",
			Help: "Age of the oldest due event pending in the outbox or queued for a sink (events written with a delay count once due), 0 when none (read every minute, the first a minute after start).",
		}),
		backlogErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_backlog_refresh_errors_total",
			Help: "Failed reads of the backlog gauges.",
		}),
		historyLength: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_mysql_history_list_length",
			Help: "InnoDB's history list length: undo records not yet purged, over which claims slow down; a long transaction on the server holds it up (0 without the PROCESS privilege; read every 10s).",
		}),
		captureLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_capture_lag_seconds",
			Help: "Capture wal: how long the oldest event read from the slot and not yet settled has waited since its commit, 0 when none (read every 10s, by the relay reading the slot).",
		}),
		slotRetained: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_capture_slot_retained_bytes",
			Help: "Capture wal: the WAL the replication slot keeps on the server's disk (read every 10s).",
		}),
		slotBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "herald_capture_slot_behind_bytes",
			Help: "Capture wal: how far the slot's confirmed position is behind the WAL's end (read every 10s).",
		}),
	}
	collectors := []prometheus.Collector{m.published, m.attemptsFailed, m.deferred,
		m.deadLettered, m.claimed, m.claimSeconds, m.recordSeconds, m.publishSeconds, m.deliverySeconds,
		m.paused, m.inFlight, m.handed, m.fenced, m.unconfigured, m.pending, m.dead, m.oldestPending, m.backlogErrors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "herald_build_info",
			Help: "Always 1, labelled with Herald's version (devel when the build recorded none), the commit it was built from (empty when unknown) and the Go version.",
			ConstLabels: prometheus.Labels{"version": build.VersionOrDevel(), "revision": build.Revision,
				"go_version": build.GoVersion},
		}, func() float64 { return 1 })}
	if cfg.MySQL {
		collectors = append(collectors, m.historyLength)
	}
	if cfg.CaptureWAL {
		collectors = append(collectors, m.captureLag, m.slotRetained, m.slotBehind)
	}
	for _, c := range collectors {
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

// Failed implements relay.Observer: a failed attempt (outcome retry or
// dead) counts in herald_delivery_attempts_failed_total, a delivery put
// off while its sink is down (outcome paused) in
// herald_events_deferred_total.
func (m *Metrics) Failed(sink, topic, outcome string) {
	switch outcome {
	case outcomeRetry, outcomeDead:
		m.attemptsFailed.WithLabelValues(sink, topic).Inc()
	case "paused":
		m.deferred.WithLabelValues(sink, topic).Inc()
	}
}

// DeadLettered implements relay.Observer.
func (m *Metrics) DeadLettered(sink, topic string) { m.deadLettered.WithLabelValues(sink, topic).Inc() }

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

// SinkHandedOff implements relay.Observer.
func (m *Metrics) SinkHandedOff(sink string, events int) {
	m.handed.WithLabelValues(sink).Add(float64(events))
}

// SinkInFlight implements relay.Observer.
func (m *Metrics) SinkInFlight(sink string, events int) {
	m.inFlight.WithLabelValues(sink).Set(float64(events))
}

// SinkUnconfigured implements relay.Observer.
func (m *Metrics) SinkUnconfigured(sink string, deliveries int64) {
	if deliveries == 0 {
		m.unconfigured.DeleteLabelValues(sink)
		return
	}
	m.unconfigured.WithLabelValues(sink).Set(float64(deliveries))
}

// RecordFenced implements relay.Observer.
func (m *Metrics) RecordFenced(int) { m.fenced.Inc() }

// HistoryLength implements relay.Observer: it sets
// herald_mysql_history_list_length, exported only with Config.MySQL (a
// relay on PostgreSQL reports 0, which is no measurement).
func (m *Metrics) HistoryLength(n int64) {
	if m.mysql {
		m.historyLength.Set(float64(n))
	}
}

// CaptureLag implements relay.Observer: it sets the herald_capture_*
// gauges, exported only with Config.CaptureWAL.
func (m *Metrics) CaptureLag(behind time.Duration, retained, behindBytes int64) {
	m.captureLag.Set(behind.Seconds())
	m.slotRetained.Set(float64(retained))
	m.slotBehind.Set(float64(behindBytes))
}

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

// RefreshBacklog sets the backlog gauges from read every interval, the
// first time one interval after it starts, until ctx ends: counting the
// backlog reads all of it, and a relay started on a backlog has better
// uses for the database in its first seconds. Failures are counted and
// logged; the gauges keep their last values. A nil logger discards logs.
func (m *Metrics) RefreshBacklog(ctx context.Context, interval time.Duration, read BacklogFunc, logger *slog.Logger) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
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
	}
}
