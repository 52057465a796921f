package deadletter

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
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
	// PublishedLastMinute estimates the events published in the last 60
	// seconds, from per-minute counts.
	PublishedLastMinute int64 `json:"published_last_minute"`
}

// TopicStatus is the backlog of one topic.
type TopicStatus struct {
	Topic string `json:"topic"`
	Backlog
}

// SinkStatus is the backlog of one sink. Sink "" (RoutingStep) is the
// routing step: events replayed to every sink, or dead before any sink.
type SinkStatus struct {
	Sink string `json:"sink"`
	Backlog
}

// Status is the state of the outbox and its queues as `relay status` shows
// it. Its JSON fields are at, total, topics and sinks.
type Status struct {
	// At is the database's time when the status was read.
	At time.Time `json:"at"`
	// Total is the backlog of the whole outbox.
	Total Backlog `json:"total"`
	// Topics has one entry per topic with pending, queued, dead or
	// recently published events, sorted by topic.
	Topics []TopicStatus `json:"topics"`
	// Sinks has one entry per sink with queued or dead deliveries or
	// recent publications (and, given the routes, per sink routed pending
	// events), sorted by name.
	Sinks []SinkStatus `json:"sinks"`
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

// statusRows are what a backend reads for Status: per topic, per (sink,
// topic) and per relay, few rows however many events wait.
type statusRows struct {
	// at is the database's time.
	at        time.Time
	pending   []pendingRow
	queues    []queueRow
	published []publishedRow
	relays    []relayRow
}

// pendingRow is the pending events of a topic, with the creation time of
// the oldest one due (zero when none is).
type pendingRow struct {
	topic  string
	n      int64
	oldest time.Time
}

// queueRow is the deliveries of a topic on a sink: queued (with the oldest
// event's creation time, zero when none) and dead.
type queueRow struct {
	sink, topic  string
	queued, dead int64
	oldest       time.Time
}

// publishedRow is the estimate of a sink and topic's publications in the
// last minute.
type publishedRow struct {
	sink, topic string
	n           float64
}

// relayRow is one live claim loop (relays table row).
type relayRow struct {
	owner   string
	started time.Time
	config  string
	// since is zero when unknown (announced by a relay from before the
	// column).
	since    time.Time
	paused   []string
	claiming bool
	lanes    []int16
}

// Status reads the backlog per topic and per sink and what was published
// in the last minute. routes may be nil; with it, each sink's Pending
// counts the pending events routed to it.
func (s *Store) Status(ctx context.Context, routes RouteFunc) (*Status, error) {
	rows, err := s.db.status(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", s.outbox, err)
	}
	st := &Status{At: rows.at, Topics: []TopicStatus{}, Sinks: []SinkStatus{}, Relays: mergeRelays(rows.relays)}
	topics := map[string]*TopicStatus{}
	sinkMap := map[string]*SinkStatus{}
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
	for _, r := range rows.pending {
		t := topic(r.topic)
		t.Pending += r.n
		older(&t.Backlog, r.oldest, none)
		st.Total.Pending += r.n
		older(&st.Total, r.oldest, none)
		if routes != nil {
			for _, sk := range routes(r.topic) {
				x := sink(sk)
				x.Pending += r.n
				older(&x.Backlog, r.oldest, none)
			}
		}
	}
	// The queues and dead letters per sink and topic.
	for _, r := range rows.queues {
		for _, b := range []*Backlog{&sink(r.sink).Backlog, &topic(r.topic).Backlog, &st.Total} {
			b.Queued += r.queued
			b.Dead += r.dead
			older(b, none, r.oldest)
		}
	}
	// Published in the last minute.
	for _, r := range rows.published {
		n := int64(math.Round(r.n))
		sink(r.sink).PublishedLastMinute += n
		topic(r.topic).PublishedLastMinute += n
		st.Total.PublishedLastMinute += n
	}
	for b, o := range oldestOf {
		if !o.pending.IsZero() {
			b.OldestPendingAgeSeconds = age(st.At, o.pending)
		}
		if !o.queued.IsZero() {
			b.OldestQueuedAgeSeconds = age(st.At, o.queued)
		}
	}
	for _, t := range topics {
		st.Topics = append(st.Topics, *t)
	}
	for _, x := range sinkMap {
		st.Sinks = append(st.Sinks, *x)
	}
	slices.SortFunc(st.Topics, func(a, b TopicStatus) int { return strings.Compare(a.Topic, b.Topic) })
	slices.SortFunc(st.Sinks, func(a, b SinkStatus) int { return strings.Compare(a.Sink, b.Sink) })
	return st, nil
}

// mergeRelays merges the claim loops of each relay (named relay.owner, or
// relay.owner/N when it has several), rows in owner order.
func mergeRelays(rows []relayRow) []RelayStatus {
	out := []RelayStatus{}
	byName := map[string]int{}
	for _, row := range rows {
		name := workerSuffix.ReplaceAllString(row.owner, "")
		i, ok := byName[name]
		if !ok {
			i = len(out)
			byName[name] = i
			out = append(out, RelayStatus{Relay: name, StartedAt: row.started, Config: row.config, ConfigSince: row.since,
				Claiming: row.claiming, PausedSinks: []string{}, Lanes: []int16{}})
		}
		r := &out[i]
		r.Workers++
		if row.started.Before(r.StartedAt) {
			r.StartedAt = row.started
		}
		r.Claiming = r.Claiming && row.claiming
		r.Lanes = append(r.Lanes, row.lanes...)
		slices.Sort(r.Lanes)
		for _, p := range row.paused {
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

// totalsRow is what a backend reads for Totals: the oldest times are zero
// when there is none.
type totalsRow struct {
	pending, queued, dead       int64
	oldestPending, oldestQueued time.Time
	now                         time.Time
}

// Totals counts pending events, queued deliveries and dead letters, and the
// age of the oldest event pending or queued.
func (s *Store) Totals(ctx context.Context) (Totals, error) {
	r, err := s.db.totals(ctx)
	if err != nil {
		return Totals{}, fmt.Errorf("reading the backlog of %s: %w", s.outbox, err)
	}
	t := Totals{Pending: r.pending, Queued: r.queued, Dead: r.dead}
	var oldest time.Time
	for _, o := range []time.Time{r.oldestPending, r.oldestQueued} {
		if !o.IsZero() && (oldest.IsZero() || o.Before(oldest)) {
			oldest = o
		}
	}
	if !oldest.IsZero() {
		t.OldestAge = max(r.now.Sub(oldest), 0)
	}
	return t, nil
}
