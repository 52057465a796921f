package deadletter

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

func (s *Store) initStatus() {
	o, st := s.tables.Outbox(), s.tables.Stats()
	s.statusTopicsSQL = `SELECT topic,
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'dead'),
       min(created_at) FILTER (WHERE status = 'pending'),
       now()
FROM ` + o + ` WHERE status IN ('pending', 'dead')
GROUP BY topic ORDER BY topic`
	// Pending events per sink, from their deliveries: a sink counts an
	// event it has a delivery entry for that is not done.
	s.statusSinksSQL = `SELECT d.key, count(*), min(o.created_at)
FROM ` + o + ` o, jsonb_each(o.deliveries) AS d(key, value)
WHERE o.status = 'pending' AND d.value->>'state' <> 'done'
GROUP BY d.key`
	// Pending events per sink, from the routes: $1 and $2 pair each topic
	// with a sink its route names; the sink counts the topic's pending
	// events it has not delivered.
	s.statusRoutedSQL = `SELECT m.sink, count(*), min(o.created_at)
FROM ` + o + ` o JOIN unnest($1::text[], $2::text[]) AS m(topic, sink) ON o.topic = m.topic
WHERE o.status = 'pending' AND coalesce(o.deliveries -> m.sink ->> 'state', '') <> 'done'
GROUP BY m.sink`
	s.statusDeadSQL = `SELECT d.key, count(*)
FROM ` + o + ` o, jsonb_each(o.deliveries) AS d(key, value)
WHERE o.status = 'dead' AND d.value->>'state' = 'dead'
GROUP BY d.key`
	// Published in the last minute, estimated from per-minute counts as a
	// sliding window: the current minute counts whole, the previous one in
	// proportion to the part of it still inside the window.
	s.statusPublishedSQL = `SELECT sink, topic, sum(published * CASE
           WHEN minute >= date_trunc('minute', now()) THEN 1
           ELSE 1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60 END)::float8
FROM ` + st + `
WHERE minute >= date_trunc('minute', now()) - interval '1 minute'
GROUP BY sink, topic`
	s.backlogSQL = `SELECT (SELECT count(*) FROM ` + o + ` WHERE status = 'pending'),
       (SELECT min(created_at) FROM ` + o + ` WHERE status = 'pending'),
       (SELECT count(*) FROM ` + o + ` WHERE status = 'dead'),
       now()`
}

// Backlog counts events waiting in one place: a topic, a sink, or all.
type Backlog struct {
	// Pending events are not delivered yet: waiting to be claimed (due now,
	// or later for retries and delayed events) or being published.
	Pending int64 `json:"pending"`
	// Dead events wait for an operator (relay dlq).
	Dead int64 `json:"dead"`
	// OldestPendingAgeSeconds is the age of the oldest pending event, in
	// seconds; zero when there is none.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// PublishedLastMinute estimates the events published in the last 60
	// seconds, from per-minute counts.
	PublishedLastMinute int64 `json:"published_last_minute"`
}

// TopicStatus is the backlog of one topic.
type TopicStatus struct {
	Topic string `json:"topic"`
	Backlog
}

// SinkStatus is the backlog of one sink.
type SinkStatus struct {
	Sink string `json:"sink"`
	Backlog
}

// Status is the state of the outbox table as `relay status` shows it.
type Status struct {
	// At is the database's time when the status was read.
	At time.Time `json:"at"`
	// Total is the backlog of the whole table.
	Total Backlog `json:"total"`
	// Topics has one entry per topic with pending, dead or recently
	// published events, sorted by topic.
	Topics []TopicStatus `json:"topics"`
	// Sinks has one entry per sink, sorted by name. Pending events are
	// attributed to a sink from their deliveries (an event the
	// sink has not delivered yet), or from the routes when RouteFunc is
	// given; dead events to the sinks they failed on.
	Sinks []SinkStatus `json:"sinks"`
}

// RouteFunc returns the sinks the route of a topic sends to (none when no
// route matches).
type RouteFunc func(topic string) []string

// Status reads the backlog per topic and per sink and what was published
// in the last minute. routes may be nil; see Status.Sinks.
func (s *Store) Status(ctx context.Context, routes RouteFunc) (*Status, error) {
	st := &Status{Topics: []TopicStatus{}, Sinks: []SinkStatus{}}
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

	rows, err := s.db.Query(ctx, s.statusTopicsSQL)
	if err != nil {
		return fail("the backlog per topic", err)
	}
	var (
		name          string
		pending, dead int64
		oldest        pgtype.Timestamptz
		oldestAll     time.Time
	)
	for rows.Next() {
		if err := rows.Scan(&name, &pending, &dead, &oldest, &st.At); err != nil {
			rows.Close()
			return fail("the backlog per topic", err)
		}
		t := topic(name)
		t.Pending, t.Dead = pending, dead
		if oldest.Valid {
			t.OldestPendingAgeSeconds = age(st.At, oldest.Time)
			if oldestAll.IsZero() || oldest.Time.Before(oldestAll) {
				oldestAll = oldest.Time
			}
		}
		st.Total.Pending += pending
		st.Total.Dead += dead
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the backlog per topic", err)
	}
	if st.At.IsZero() {
		if err := s.db.QueryRow(ctx, s.nowSQL).Scan(&st.At); err != nil {
			return fail("the time", err)
		}
	}
	if !oldestAll.IsZero() {
		st.Total.OldestPendingAgeSeconds = age(st.At, oldestAll)
	}

	// Pending per sink.
	sinkSQL, sinkArgs := s.statusSinksSQL, []any(nil)
	if routes != nil {
		var pairTopics, pairSinks []string
		for name, t := range topics {
			if t.Pending == 0 {
				continue
			}
			for _, sk := range routes(name) {
				pairTopics = append(pairTopics, name)
				pairSinks = append(pairSinks, sk)
			}
		}
		sinkSQL, sinkArgs = s.statusRoutedSQL, []any{pairTopics, pairSinks}
	}
	rows, err = s.db.Query(ctx, sinkSQL, sinkArgs...)
	if err != nil {
		return fail("the backlog per sink", err)
	}
	for rows.Next() {
		if err := rows.Scan(&name, &pending, &oldest); err != nil {
			rows.Close()
			return fail("the backlog per sink", err)
		}
		x := sink(name)
		x.Pending = pending
		if oldest.Valid {
			x.OldestPendingAgeSeconds = age(st.At, oldest.Time)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the backlog per sink", err)
	}

	// Dead per sink.
	rows, err = s.db.Query(ctx, s.statusDeadSQL)
	if err != nil {
		return fail("the dead letters per sink", err)
	}
	for rows.Next() {
		if err := rows.Scan(&name, &dead); err != nil {
			rows.Close()
			return fail("the dead letters per sink", err)
		}
		sink(name).Dead = dead
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("the dead letters per sink", err)
	}

	// Published in the last minute.
	rows, err = s.db.Query(ctx, s.statusPublishedSQL)
	if err != nil {
		return fail("the published counts", err)
	}
	var (
		topicName string
		published float64
	)
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

	for _, t := range topics {
		st.Topics = append(st.Topics, *t)
	}
	for _, x := range sinkMap {
		st.Sinks = append(st.Sinks, *x)
	}
	slices.SortFunc(st.Topics, func(a, b TopicStatus) int { return cmpString(a.Topic, b.Topic) })
	slices.SortFunc(st.Sinks, func(a, b SinkStatus) int { return cmpString(a.Sink, b.Sink) })
	return st, nil
}

// age is now - t in seconds, never negative.
func age(now, t time.Time) float64 { return max(now.Sub(t), 0).Seconds() }

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Totals is the cheap backlog summary the metrics refresh reads.
type Totals struct {
	// Pending counts pending events.
	Pending int64
	// OldestPendingAge is the age of the oldest pending event; zero when
	// there is none.
	OldestPendingAge time.Duration
	// Dead counts dead letters.
	Dead int64
}

// Totals counts pending and dead events and the age of the oldest pending
// one, through the table's partial indexes.
func (s *Store) Totals(ctx context.Context) (Totals, error) {
	var (
		t      Totals
		oldest pgtype.Timestamptz
		now    time.Time
	)
	if err := s.db.QueryRow(ctx, s.backlogSQL).Scan(&t.Pending, &oldest, &t.Dead, &now); err != nil {
		return t, fmt.Errorf("reading the backlog of %s: %w", s.tables.Outbox(), err)
	}
	if oldest.Valid {
		t.OldestPendingAge = max(now.Sub(oldest.Time), 0)
	}
	return t, nil
}
