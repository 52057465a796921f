package deadletter

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Backlog counts what waits in one place: a topic, a sink, or everything.
// Pending counts events; Queued and Dead count deliveries (one per event
// and sink: an event waiting for two sinks is queued twice).
type Backlog struct {
	// Pending counts events in the outbox not claimed yet (due now, or
	// later for events written with a delay). For a sink, they are the
	// pending events whose route names the sink, known only when Status
	// is given the routes.
	Pending int64 `json:"pending"`
	// Queued counts deliveries waiting in a sink's queue: retrying, held
	// back while their sink is down, or waiting behind an earlier event of
	// their key.
	Queued int64 `json:"queued"`
	// Dead counts dead letters, waiting for an operator (relay dlq).
	Dead int64 `json:"dead"`
	// OldestPendingAgeSeconds is the age (since created_at) of the oldest
	// pending event that is due (not written with a delay still running),
	// in seconds; zero when there is none.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// OldestQueuedAgeSeconds is the age (since its event's created_at) of
	// the oldest queued delivery, in seconds; zero when there is none.
	OldestQueuedAgeSeconds float64 `json:"oldest_queued_age_seconds"`
}

// TopicStatus is the backlog of one topic.
type TopicStatus struct {
	Topic string `json:"topic"`
	Backlog
}

// Sink states, as SinkStatus.State reports them: what the database holds
// of the sink's last minute, most urgent first.
const (
	// SinkPaused: a live relay holds the sink paused because it is down;
	// its deliveries wait without spending attempts.
	SinkPaused = "paused"
	// SinkFailing: deliveries to the sink fail and none was delivered in
	// the last minute: dead letters were recorded in the last minute, or
	// deliveries wait to be tried again after a failed attempt.
	SinkFailing = "failing"
	// SinkRetrying: deliveries wait to be tried again after a failed
	// attempt, while others get through.
	SinkRetrying = "retrying"
	// SinkRefusing: dead letters were recorded in the last minute (a
	// permanent error, or the last attempt), while others get through.
	SinkRefusing = "refusing"
	// SinkFlowing: nothing failed in the last minute and nothing waits to
	// be tried again.
	SinkFlowing = "flowing"
	// SinkUnconfigured: the relays' configuration does not name the sink
	// (Status does not know it; the caller that has the configuration,
	// relay status with --config and the console, sets it). Its deliveries
	// are kept until it is configured again or an operator drops them.
	SinkUnconfigured = "unconfigured"
)

// SinkStatus is one sink: its backlog, its last minute and its state.
// Sink "" (RoutingStep) is the routing step: events replayed to every
// sink, or dead before any sink.
type SinkStatus struct {
	Sink string `json:"sink"`
	// State is one of the Sink states (SinkFlowing, SinkFailing, ...).
	State string `json:"state"`
	Backlog
	// DeliveredLastMinute estimates the events the sink acknowledged in
	// the last 60 seconds, from the per-minute counts relays write every
	// few seconds.
	DeliveredLastMinute int64 `json:"delivered_last_minute"`
	// DeadLastMinute counts the dead letters recorded on the sink in the
	// last 60 seconds: refused for good, or out of attempts.
	DeadLastMinute int64 `json:"dead_last_minute"`
	// Retrying counts the deliveries waiting to be tried again after a
	// failed attempt (each the head of its key's queue).
	Retrying int64 `json:"retrying"`
}

// PatternStatus is the deliveries of the last minute under one topic
// pattern: the relays count what they deliver by the pattern of
// relay.metrics_topics an event's topic matches (relay.OtherTopics for none),
// not by topic.
type PatternStatus struct {
	Pattern string `json:"topic_pattern"`
	// DeliveredLastMinute estimates the deliveries (an event delivered to
	// two sinks counts twice) in the last 60 seconds.
	DeliveredLastMinute int64 `json:"delivered_last_minute"`
}

// Status is the state of the outbox and its queues as `relay status` shows
// it. Its JSON fields are at, total, delivered_last_minute, topics, sinks,
// topic_patterns and relays.
type Status struct {
	// At is the database's time when the status was read.
	At time.Time `json:"at"`
	// Total is the backlog of the whole outbox.
	Total Backlog `json:"total"`
	// DeliveredLastMinute estimates the deliveries in the last 60
	// seconds, every sink's: an event delivered to two sinks counts twice.
	DeliveredLastMinute int64 `json:"delivered_last_minute"`
	// Topics has one entry per topic with pending, queued or dead events,
	// sorted by topic.
	Topics []TopicStatus `json:"topics"`
	// Sinks has one entry per sink with queued or dead deliveries or
	// recent deliveries (and, given the routes, per sink routed pending
	// events), sorted by name.
	Sinks []SinkStatus `json:"sinks"`
	// Patterns has one entry per topic pattern with deliveries in the
	// last minute, sorted.
	Patterns []PatternStatus `json:"topic_patterns"`
	// Relays has one entry per live relay, sorted by name.
	Relays []RelayStatus `json:"relays"`
}

// RelayStatus is one live relay.
type RelayStatus struct {
	// Relay is its name (relay.owner).
	Relay string `json:"relay"`
	// Workers counts its claim loops.
	Workers int `json:"workers"`
	// StartedAt is when its first claim loop announced itself.
	StartedAt time.Time `json:"started_at"`
	// Config is the fingerprint of its routes and sinks, and ConfigSince
	// since when that configuration has been live.
	Config      string    `json:"config"`
	ConfigSince time.Time `json:"config_since"`
	// Claiming is false while a relay with a newer configuration is live:
	// this one then claims nothing.
	Claiming bool `json:"claiming"`
	// PausedSinks are the sinks it holds paused because they are down.
	PausedSinks []string `json:"paused_sinks"`
	// Lanes are the lanes its claim loops hold (leases not expired), in
	// order.
	Lanes []int16 `json:"lanes"`
}

// RouteFunc returns the sinks the route of a topic sends to (none when no
// route matches).
type RouteFunc func(topic string) []string

// Status reads the backlog per topic and per sink, the deliveries of the
// last minute per sink and per topic pattern, each sink's state and the
// live relays. routes may be nil; with it, each sink's Pending counts the
// pending events routed to it.
func (s *Store) Status(ctx context.Context, routes RouteFunc) (*Status, error) {
	rows, err := s.db.StatusRows(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", s.outbox, err)
	}
	st := &Status{At: rows.At, Topics: []TopicStatus{}, Sinks: []SinkStatus{}, Patterns: []PatternStatus{}, Relays: mergeRelays(rows.Relays)}
	topics := map[string]*TopicStatus{}
	sinkMap := map[string]*SinkStatus{}
	patterns := map[string]*PatternStatus{}
	topic := func(name string) *TopicStatus {
		if t, ok := topics[name]; ok {
			return t
		}
		t := &TopicStatus{Topic: name}
		topics[name] = t
		return t
	}
	sink := func(name string) *SinkStatus {
		if x, ok := sinkMap[name]; ok {
			return x
		}
		x := &SinkStatus{Sink: name}
		sinkMap[name] = x
		return x
	}
	// Oldest times; ages are computed once all are known.
	type oldest struct{ pending, queued time.Time }
	oldestOf := map[*Backlog]*oldest{}
	older := func(b *Backlog, pending, queued time.Time) {
		o := oldestOf[b]
		if o == nil {
			o = &oldest{}
			oldestOf[b] = o
		}
		if !pending.IsZero() && (o.pending.IsZero() || pending.Before(o.pending)) {
			o.pending = pending
		}
		if !queued.IsZero() && (o.queued.IsZero() || queued.Before(o.queued)) {
			o.queued = queued
		}
	}
	var none time.Time

	// Pending events per topic, and per sink from the routes.
	for _, r := range rows.Pending {
		t := topic(r.Topic)
		t.Pending += r.N
		older(&t.Backlog, r.Oldest, none)
		st.Total.Pending += r.N
		older(&st.Total, r.Oldest, none)
		if routes != nil {
			for _, sk := range routes(r.Topic) {
				x := sink(sk)
				x.Pending += r.N
				older(&x.Backlog, r.Oldest, none)
			}
		}
	}
	// The queues and dead letters per sink and topic.
	for _, r := range rows.Queues {
		x := sink(r.Sink)
		x.DeadLastMinute += r.DeadLastMinute
		x.Retrying += r.Retrying
		for _, b := range []*Backlog{&x.Backlog, &topic(r.Topic).Backlog, &st.Total} {
			b.Queued += r.Queued
			b.Dead += r.Dead
			older(b, none, r.Oldest)
		}
	}
	// Delivered in the last minute, per sink and per topic pattern.
	for _, r := range rows.Published {
		n := int64(math.Round(r.N))
		sink(r.Sink).DeliveredLastMinute += n
		p := patterns[r.Topic]
		if p == nil {
			p = &PatternStatus{Pattern: r.Topic}
			patterns[r.Topic] = p
		}
		p.DeliveredLastMinute += n
		st.DeliveredLastMinute += n
	}
	for b, o := range oldestOf {
		if !o.pending.IsZero() {
			b.OldestPendingAgeSeconds = age(st.At, o.pending)
		}
		if !o.queued.IsZero() {
			b.OldestQueuedAgeSeconds = age(st.At, o.queued)
		}
	}
	paused := map[string]bool{}
	for _, r := range st.Relays {
		for _, p := range r.PausedSinks {
			paused[p] = true
		}
	}
	for name := range paused {
		sink(name)
	}
	for _, t := range topics {
		st.Topics = append(st.Topics, *t)
	}
	for _, x := range sinkMap {
		x.State = sinkState(*x, paused[x.Sink])
		st.Sinks = append(st.Sinks, *x)
	}
	for _, p := range patterns {
		st.Patterns = append(st.Patterns, *p)
	}
	slices.SortFunc(st.Topics, func(a, b TopicStatus) int { return strings.Compare(a.Topic, b.Topic) })
	slices.SortFunc(st.Sinks, func(a, b SinkStatus) int { return strings.Compare(a.Sink, b.Sink) })
	slices.SortFunc(st.Patterns, func(a, b PatternStatus) int { return strings.Compare(a.Pattern, b.Pattern) })
	return st, nil
}

// sinkState is a sink's state from its figures, most urgent first: a
// sink whose every delivery of the last minute failed is failing, however
// its deliveries failed; one where some fail while others get through is
// retrying or refusing.
func sinkState(x SinkStatus, paused bool) string {
	failed := x.DeadLastMinute > 0 || x.Retrying > 0
	switch {
	case paused:
		return SinkPaused
	case failed && x.DeliveredLastMinute == 0:
		return SinkFailing
	case x.Retrying > 0:
		return SinkRetrying
	case x.DeadLastMinute > 0:
		return SinkRefusing
	}
	return SinkFlowing
}

// mergeRelays merges the claim loops of each relay (named relay.owner, or
// relay.owner/N when it has several), rows in owner order.
func mergeRelays(rows []store.RelayRow) []RelayStatus {
	out := []RelayStatus{}
	byName := map[string]int{}
	for _, row := range rows {
		name := workerSuffix.ReplaceAllString(row.Owner, "")
		i, ok := byName[name]
		if !ok {
			i = len(out)
			byName[name] = i
			out = append(out, RelayStatus{Relay: name, StartedAt: row.Started, Config: row.Config, ConfigSince: row.Since,
				Claiming: row.Claiming, PausedSinks: []string{}, Lanes: []int16{}})
		}
		r := &out[i]
		r.Workers++
		if row.Started.Before(r.StartedAt) {
			r.StartedAt = row.Started
		}
		r.Claiming = r.Claiming && row.Claiming
		r.Lanes = append(r.Lanes, row.Lanes...)
		slices.Sort(r.Lanes)
		for _, p := range row.Paused {
			if !slices.Contains(r.PausedSinks, p) {
				r.PausedSinks = append(r.PausedSinks, p)
			}
		}
		slices.Sort(r.PausedSinks)
	}
	return out
}

// workerSuffix is what a relay's claim loops add to its name.
var workerSuffix = regexp.MustCompile(`/[0-9]+$`)

// age is now - t in seconds, never negative.
func age(now, t time.Time) float64 { return max(now.Sub(t), 0).Seconds() }

// Totals is the cheap backlog summary the metrics refresh reads.
type Totals struct {
	// Pending counts events in the outbox not claimed yet.
	Pending int64
	// Queued counts deliveries waiting in the sinks' queues (and the
	// routing step's).
	Queued int64
	// OldestAge is the age (since created_at) of the oldest event pending
	// or queued; zero when there is none.
	OldestAge time.Duration
	// Dead counts dead letters.
	Dead int64
}

// Undelivered is what still has to be delivered: Pending + Queued.
func (t Totals) Undelivered() int64 { return t.Pending + t.Queued }

// Totals counts pending events, queued deliveries and dead letters, and the
// age of the oldest event pending or queued.
func (s *Store) Totals(ctx context.Context) (Totals, error) {
	r, err := s.db.Totals(ctx)
	if err != nil {
		return Totals{}, fmt.Errorf("reading the backlog of %s: %w", s.outbox, err)
	}
	t := Totals{Pending: r.Pending, Queued: r.Queued, Dead: r.Dead}
	var oldest time.Time
	for _, o := range []time.Time{r.OldestPending, r.OldestQueued} {
		if !o.IsZero() && (oldest.IsZero() || o.Before(oldest)) {
			oldest = o
		}
	}
	if !oldest.IsZero() {
		t.OldestAge = max(r.Now.Sub(oldest), 0)
	}
	return t, nil
}
