package deadletter

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

func (s *Store) initStatus() {
	o, dl, st := s.tables.Outbox(), s.tables.Deliveries(), s.tables.Stats()
	// The oldest pending event is the oldest due one: an event written
	// with a delay is not late before its time.
	s.statusPendingSQL = `SELECT topic, count(*), min(created_at) FILTER (WHERE isfinite(created_at) AND available_at <= now()), now()
FROM ` + o + ` WHERE status = 'pending'
GROUP BY topic`
	// The queues per sink and topic: deliveries waiting (ready or waiting)
	// with their oldest event, and dead letters.
	s.statusQueuesSQL = `SELECT sink, topic,
       count(*) FILTER (WHERE state <> 'dead'),
       min(created_at) FILTER (WHERE state <> 'dead' AND isfinite(created_at)),
       count(*) FILTER (WHERE state = 'dead')
FROM ` + dl + `
GROUP BY sink, topic`
	// Published in the last minute, estimated from per-minute counts as a
	// sliding window: the current minute counts whole, the previous one in
	// proportion to the part of it still inside the window.
	// The live relays (a row per claim loop), with whether each runs the
	// newest configuration: only those claim.
	s.statusRelaysSQL = `WITH live AS (SELECT * FROM ` + s.tables.Relays() + ` WHERE heartbeat_until > now())
SELECT owner, started_at, config, config_since, paused_sinks,
       config = (SELECT config FROM live ORDER BY config_since DESC, config LIMIT 1),
       ARRAY(SELECT lane FROM ` + s.tables.Lanes() + ` l WHERE l.owner = live.owner AND l.lease_until > now() ORDER BY lane)
FROM live ORDER BY owner`
	s.statusPublishedSQL = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= date_trunc('minute', now()) THEN 1
           ELSE 1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60 END)::float8
FROM ` + st + `
WHERE minute >= date_trunc('minute', now()) - interval '1 minute'
GROUP BY sink, topic`
	s.backlogSQL = `SELECT (SELECT count(*) FROM ` + o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + o + ` WHERE status = 'pending' AND isfinite(created_at) AND available_at <= now()),
       (SELECT count(*) FROM ` + dl + ` WHERE state <> 'dead'),
       (SELECT min(created_at) FROM ` + dl + ` WHERE state <> 'dead' AND isfinite(created_at)),
       (SELECT count(*) FROM ` + dl + ` WHERE state = 'dead'),
       now()`
}

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

// Status reads the backlog per topic and per sink and what was published
// in the last minute. routes may be nil; with it, each sink's Pending
// counts the pending events routed to it.
func (s *Store) Status(ctx context.Context, routes RouteFunc) (*Status, error) {
	st := &Status{Topics: []TopicStatus{}, Sinks: []SinkStatus{}, Relays: []RelayStatus{}}
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
	fail := func(what string, err error) (*Status, error) {
		return nil, fmt.Errorf("reading %s of %s: %w", what, s.tables.Outbox(), err)
	}
	// Oldest times (finite ones: see the statements); ages are computed
	// once st.At is known.
	type oldest struct{ pending, queued time.Time }
	oldestOf := map[*Backlog]*oldest{}
	older := func(b *Backlog, pending, queued pgtype.Timestamptz) {
		o := oldestOf[b]
		if o == nil {
			o = &oldest{}
			oldestOf[b] = o
		}
		if pending.Valid && (o.pending.IsZero() || pending.Time.Before(o.pending)) {
			o.pending = pending.Time
		}
		if queued.Valid && (o.queued.IsZero() || queued.Time.Before(o.queued)) {
			o.queued = queued.Time
		}
	}
	var none pgtype.Timestamptz

	// Pending events per topic, and per sink from the routes.
	rows, err := s.db.Query(ctx, s.statusPendingSQL)
	if err != nil {
		return fail("the pending events per topic", err)
	}
	var (
		name, topicName    string
		n, dead            int64
		first, firstQueued pgtype.Timestamptz
	)
	for rows.Next() {
		if err := rows.Scan(&name, &n, &first, &st.At); err != nil {
			rows.Close()
			return fail("the pending events per topic", err)
		}
		t := topic(name)
		t.Pending += n
		older(&t.Backlog, first, none)
		st.Total.Pending += n
		older(&st.Total, first, none)
		if routes != nil {
			for _, sk := range routes(name) {
				x := sink(sk)
				x.Pending += n
				older(&x.Backlog, first, none)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the pending events per topic", err)
	}

	// The queues and dead letters per sink and topic.
	rows, err = s.db.Query(ctx, s.statusQueuesSQL)
	if err != nil {
		return fail("the queues", err)
	}
	for rows.Next() {
		if err := rows.Scan(&name, &topicName, &n, &firstQueued, &dead); err != nil {
			rows.Close()
			return fail("the queues", err)
		}
		for _, b := range []*Backlog{&sink(name).Backlog, &topic(topicName).Backlog, &st.Total} {
			b.Queued += n
			b.Dead += dead
			older(b, none, firstQueued)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the queues", err)
	}

	// Published in the last minute.
	rows, err = s.db.Query(ctx, s.statusPublishedSQL)
	if err != nil {
		return fail("the published counts", err)
	}
	var published float64
	for rows.Next() {
		if err := rows.Scan(&name, &topicName, &published); err != nil {
			rows.Close()
			return fail("the published counts", err)
		}
		n := int64(math.Round(published))
		sink(name).PublishedLastMinute += n
		topic(topicName).PublishedLastMinute += n
		st.Total.PublishedLastMinute += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the published counts", err)
	}

	if st.Relays, err = s.relays(ctx); err != nil {
		return fail("the relays", err)
	}

	if st.At.IsZero() {
		if err := s.db.QueryRow(ctx, s.nowSQL).Scan(&st.At); err != nil {
			return fail("the time", err)
		}
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

// relays reads the live relays, merging the claim loops of each (named
// relay.owner, or relay.owner/N when it has several).
func (s *Store) relays(ctx context.Context) ([]RelayStatus, error) {
	rows, err := s.db.Query(ctx, s.statusRelaysSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []RelayStatus{}
	byName := map[string]int{}
	var (
		owner, config string
		started       time.Time
		since         pgtype.Timestamptz // -infinity: announced by a relay from before the column
		paused        []string
		claiming      bool
		lanes         []int16
	)
	for rows.Next() {
		if err := rows.Scan(&owner, &started, &config, &since, &paused, &claiming, &lanes); err != nil {
			return nil, err
		}
		name := workerSuffix.ReplaceAllString(owner, "")
		i, ok := byName[name]
		if !ok {
			i = len(out)
			byName[name] = i
			out = append(out, RelayStatus{Relay: name, StartedAt: started, Config: config, Claiming: claiming, PausedSinks: []string{}, Lanes: []int16{}})
			if since.InfinityModifier == pgtype.Finite {
				out[i].ConfigSince = since.Time
			}
		}
		r := &out[i]
		r.Workers++
		if started.Before(r.StartedAt) {
			r.StartedAt = started
		}
		r.Claiming = r.Claiming && claiming
		r.Lanes = append(r.Lanes, lanes...)
		slices.Sort(r.Lanes)
		for _, p := range paused {
			if !slices.Contains(r.PausedSinks, p) {
				r.PausedSinks = append(r.PausedSinks, p)
			}
		}
		slices.Sort(r.PausedSinks)
	}
	return out, rows.Err()
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
	var (
		t                     Totals
		oldPending, oldQueued pgtype.Timestamptz
		now                   time.Time
	)
	if err := s.db.QueryRow(ctx, s.backlogSQL).Scan(&t.Pending, &oldPending, &t.Queued, &oldQueued, &t.Dead, &now); err != nil {
		return t, fmt.Errorf("reading the backlog of %s: %w", s.tables.Outbox(), err)
	}
	var oldest time.Time
	for _, o := range []pgtype.Timestamptz{oldPending, oldQueued} {
		if o.Valid && (oldest.IsZero() || o.Time.Before(oldest)) {
			oldest = o.Time
		}
	}
	if !oldest.IsZero() {
		t.OldestAge = max(now.Sub(oldest), 0)
	}
	return t, nil
}
