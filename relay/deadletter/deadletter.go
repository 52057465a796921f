// Package deadletter is where operators meet the outbox: it lists, shows,
// replays and purges dead letters, and reads the backlog figures that `relay
// status` and the admin server report, on PostgreSQL (New) or MySQL and
// MariaDB (NewMySQL). It holds the filters, paging, batching and the
// assembly of what the operations return; the statements are each
// database's store's (relay/internal/pgstore, relay/internal/mysqlstore,
// behind store.Operator), beside the relay's own, so that one package per
// database writes everything that keeps the queues whole.
//
// A dead letter is a delivery in state 'dead' in the deliveries table: one
// event on one sink, so an event that failed for good on two sinks is two
// dead letters. The sink named "" is the routing step, before any sink: an
// event that matched no route or could not be read dies there.
//
// Operations that touch many rows walk the dead letters in (seq, sink)
// order with keyset pagination, DefaultBatchSize rows per statement, each
// batch its own short transaction: memory stays bounded and no lock is held
// for long, however many rows match. Filters travel as statement
// parameters, never as SQL text.
//
// Replay and purge change rows the relays work on. Each of their batches
// first locks every lane (relays write a lane's rows only while holding it
// in share mode), so a batch and a relay's record never interleave, and two
// operators' batches run one after the other. Replaying a dead letter puts
// it back in its key's queue on its sink, attempts reset: it becomes the
// head of the queue, due at once, unless the queue already has one, in
// which case it waits its turn. Replaying or purging a dead letter that
// stopped its key (relay.stop_key_on_dead_letter) lets the deliveries
// waiting behind it move on, in seq order. See ReplayOpts.AllSinks for
// replaying through the routing step.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/relay/internal/store"
)

// DefaultBatchSize is the most rows one statement reads or changes.
const DefaultBatchSize = 1000

// RoutingStep is the sink name of the routing step: deliveries of events
// that have not been routed to their sinks yet (replayed with AllSinks, or
// dead before any sink because no route matched or the event could not be
// read).
const RoutingStep = ""

// ErrNotFound is returned by Show for an id no stored event has.
var ErrNotFound = errors.New("deadletter: no event with this id")

// InputError is an invalid filter field or id, as opposed to a failure of
// the database.
type InputError struct {
	// Field names the filter field ("id", "until", "older_than").
	Field string
	// Reason says what is wrong.
	Reason string
}

// Error returns e.g. `id: "x" is not a UUID`.
func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

// Store runs the dead-letter and status operations on one outbox table,
// on PostgreSQL (New) or MySQL (NewMySQL).
type Store struct {
	db store.Operator
	// outbox is the quoted outbox table, as errors name it.
	outbox    string
	batchSize int
}

// Filter selects dead letters. Zero fields select everything; set fields
// must all match. A dead letter matches on its own row: its sink, error
// and time of death.
type Filter struct {
	// IDs are event ids (UUIDs).
	IDs []string `json:"ids,omitempty"`
	// Topic is a topic pattern as in routes: * matches any run of
	// characters, everything else matches itself.
	Topic string `json:"topic,omitempty"`
	// Key is an exact event key.
	Key string `json:"key,omitempty"`
	// Sink is the exact name of the sink the delivery failed on. Empty
	// selects every sink (the routing step's dead letters included).
	Sink string `json:"sink,omitempty"`
	// Error is a case-insensitive substring of the dead letter's last
	// error.
	Error string `json:"error,omitempty"`
	// Since and Until bound the time the delivery died (dead_at): at or
	// after Since, before Until.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// OlderThan selects dead letters that died more than this long ago.
	OlderThan time.Duration `json:"older_than,omitempty"`
}

// IsZero reports whether f selects every dead letter.
func (f Filter) IsZero() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.Sink == "" && f.Error == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.OlderThan == 0
}

// Validate returns an error naming the first invalid field.
func (f Filter) Validate() error {
	for _, id := range f.IDs {
		if _, err := uuid.Parse(id); err != nil {
			return &InputError{"id", fmt.Sprintf("%q is not a UUID", truncate(id, 60))}
		}
	}
	switch {
	case f.OlderThan < 0:
		return &InputError{"older_than", fmt.Sprintf("must not be negative, got %s", f.OlderThan)}
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return &InputError{"until", fmt.Sprintf("%s is not after since %s", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))}
	}
	return nil
}

// start is before every dead letter: seqs are positive.
var start = store.DeadLetterPosition{Seq: math.MinInt64}

// end is after every dead letter, for a list from the newest.
var end = store.DeadLetterPosition{Seq: math.MaxInt64, WholeSeq: true}

func at(seq int64, sink string) store.DeadLetterPosition {
	return store.DeadLetterPosition{Seq: seq, Sink: sink}
}

// before reports whether p is before the dead letter (seq, sink).
func before(p store.DeadLetterPosition, seq int64, sink string) bool {
	return p.Seq < seq || p.Seq == seq && !p.WholeSeq && p.Sink < sink
}

// TopicLike translates a topic pattern (* matches any run of characters) to
// a LIKE pattern, escaping LIKE's own wildcards and escape character. The
// empty pattern stays empty.
func TopicLike(pattern string) string { return store.TopicLike(pattern) }

// DeadLetter is one dead delivery (an event on one sink) as List reports
// it. Its JSON fields are seq, id, topic, key (absent without one), sink,
// attempts, created_at, died_at, last_error and stops_key.
type DeadLetter struct {
	// Seq is the event's sequence number: its position in the outbox.
	// Dead letters are listed in (seq, sink) order.
	Seq int64 `json:"seq"`
	// ID is the event id.
	ID    string `json:"id"`
	Topic string `json:"topic"`
	Key   string `json:"key,omitempty"`
	// Sink is the sink the delivery failed on for good; "" (RoutingStep)
	// when the event died before any sink (no route matched, or it could
	// not be read).
	Sink string `json:"sink"`
	// Attempts is the attempts spent on the sink.
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	// DiedAt is when the delivery became a dead letter (dead_at).
	DiedAt    time.Time `json:"died_at"`
	LastError string    `json:"last_error"`
	// StopsKey says that the dead letter holds back the later events of
	// its key on its sink (relay.stop_key_on_dead_letter) until it is
	// replayed or purged.
	StopsKey bool `json:"stops_key"`
}

// ListOpts bounds a List.
type ListOpts struct {
	// Limit is the most dead letters returned; 0 means all.
	Limit int
	// AfterSeq and AfterSink start after this dead letter in (seq, sink)
	// order, for paging through results: pass the last one's Seq and Sink.
	// With AfterSink empty, the list starts after every dead letter of
	// AfterSeq (the same thing for a dead letter of the routing step, the
	// only one of its event); with both zero, at the beginning. "After"
	// is in the list's order: with Newest, older.
	AfterSeq  int64
	AfterSink string
	// Newest lists in descending (seq, sink) order, the newest events
	// first: seq is the order events were written in. A page back towards
	// the newest is the list the other way from the page's first dead
	// letter, reversed.
	Newest bool
}

// List calls fn for each dead letter matching f, in (seq, sink) order
// (descending with opts.Newest), reading DefaultBatchSize rows per
// statement. It stops at fn's first
// error and returns it.
func (s *Store) List(ctx context.Context, f Filter, opts ListOpts, fn func(DeadLetter) error) error {
	if err := f.Validate(); err != nil {
		return err
	}
	after, seen := at(opts.AfterSeq, opts.AfterSink), 0
	switch {
	case opts.AfterSeq == 0 && opts.AfterSink == "" && opts.Newest:
		after = end
	case opts.AfterSeq == 0 && opts.AfterSink == "":
		after = start
	case opts.AfterSink == "":
		after = store.DeadLetterPosition{Seq: opts.AfterSeq, WholeSeq: true} // after all of AfterSeq, either way
	}
	for {
		n := s.batchSize
		if opts.Limit > 0 {
			n = min(n, opts.Limit-seen)
		}
		if n <= 0 {
			return nil
		}
		page, err := s.listPage(ctx, f, after, n, opts.Newest)
		if err != nil {
			return err
		}
		for _, d := range page {
			if err := fn(d); err != nil {
				return err
			}
		}
		seen += len(page)
		if len(page) < n {
			return nil
		}
		last := page[len(page)-1]
		after = at(last.Seq, last.Sink)
	}
}

func (s *Store) listPage(ctx context.Context, f Filter, after store.DeadLetterPosition, limit int, newest bool) ([]DeadLetter, error) {
	rows, err := s.db.DeadLetters(ctx, store.DeadLetterFilter(f), after, limit, newest)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters of %s: %w", s.outbox, err)
	}
	page := make([]DeadLetter, len(rows))
	for i, d := range rows {
		page[i] = DeadLetter(d)
	}
	return page, nil
}

// Count returns how many dead letters match f.
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	n, err := s.db.CountDeadLetters(ctx, store.DeadLetterFilter(f), 0)
	if err != nil {
		return 0, fmt.Errorf("counting dead letters of %s: %w", s.outbox, err)
	}
	return n, nil
}

// CountAtMost returns how many dead letters match f, counting no further
// than limit: when more match, it returns limit and true. Count reads
// every match (every dead letter, for a filter on the error text), which
// takes time in proportion to them; a page that shows "10,000+" bounds
// that work, and Count remains for the exact figure an operator confirms
// before a replay or purge.
func (s *Store) CountAtMost(ctx context.Context, f Filter, limit int64) (n int64, more bool, err error) {
	if err := f.Validate(); err != nil {
		return 0, false, err
	}
	if limit <= 0 {
		return 0, false, &InputError{"limit", fmt.Sprintf("must be positive, got %d", limit)}
	}
	if n, err = s.db.CountDeadLetters(ctx, store.DeadLetterFilter(f), limit+1); err != nil {
		return 0, false, fmt.Errorf("counting dead letters of %s: %w", s.outbox, err)
	}
	if n > limit {
		return limit, true, nil
	}
	return n, false, nil
}

// Cause is an error text without what a row showing the event and its
// sink already says: sinks wrap their errors as "publishing event ID to
// DESTINATION: …" or "event ID: …". With eventID "", the prefix goes
// whatever event it names: a sink's error shown without its event (why it
// is paused). For display only: the stored text stays whole (Show, the
// JSON answers).
func Cause(eventID, text string) string {
	if eventID == "" {
		eventID = prefixedID(text)
	}
	if rest, ok := strings.CutPrefix(text, "publishing event "+eventID+" to "); ok {
		if _, after, found := strings.Cut(rest, ": "); found {
			text = after
		}
	}
	return strings.TrimPrefix(text, "event "+eventID+": ")
}

// prefixedID is the event id text starts with after "publishing event "
// or "event ", or "" when there is none.
func prefixedID(text string) string {
	for _, prefix := range []string{"publishing event ", "event "} {
		rest, ok := strings.CutPrefix(text, prefix)
		if !ok || len(rest) < 36 {
			continue
		}
		if _, err := uuid.Parse(rest[:36]); err == nil {
			return rest[:36]
		}
	}
	return "\x00" // matches no prefix
}

// Event statuses, as Show reports them.
const (
	// StatusPending: the event is in the outbox, not claimed yet.
	StatusPending = "pending"
	// StatusQueued: the event waits in a sink's queue (or the routing
	// step's): it has a delivery that is not dead.
	StatusQueued = "queued"
	// StatusDead: every delivery the event has left is a dead letter.
	StatusDead = "dead"
	// StatusDone: the relay is done with the event (kept in the outbox by
	// relay.retention): delivered to every sink.
	StatusDone = "done"
)

// Delivery states, as the deliveries table stores them.
const (
	// StateReady: the head of its key's queue on the sink (or an event
	// without a key), due at NextAt.
	StateReady = "ready"
	// StateWaiting: behind the head of its key's queue on the sink; it
	// becomes the head when the deliveries before it are gone.
	StateWaiting = "waiting"
	// StateDead: a dead letter.
	StateDead = "dead"
)

// Delivery is the state of one event on one sink (or on the routing step,
// sink ""), as Show reports it.
type Delivery struct {
	// State is ready, waiting or dead (StateReady, ...).
	State string `json:"state"`
	// Attempts is the attempts spent on the sink so far.
	Attempts int `json:"attempts"`
	// Error is the last attempt's error.
	Error string `json:"error,omitempty"`
	// NextAt is when a ready delivery is due (its next attempt).
	NextAt time.Time `json:"next_at,omitzero"`
	// QueuedAt is when the delivery joined its queue (was created, or
	// replayed).
	QueuedAt time.Time `json:"queued_at"`
	// DeadAt is when a dead letter died.
	DeadAt time.Time `json:"dead_at,omitzero"`
	// StopsKey: the dead letter holds back its key's later events on the
	// sink until it is replayed or purged.
	StopsKey bool `json:"stops_key,omitempty"`
	// Head is, for a waiting delivery, the head of its key's queue on the
	// sink: the delivery it waits behind.
	Head *QueueHead `json:"head,omitempty"`
}

// QueueHead is the head of a key's queue on a sink: a delivery due at its
// next attempt (state ready), or a dead letter that stops the key (state
// dead).
type QueueHead struct {
	Seq   int64  `json:"seq"`
	ID    string `json:"id"`
	State string `json:"state"`
}

// Event is one event, wherever it is, as Show reports it. Its JSON fields
// are those of the struct plus payload (JSON text) or payload_base64.
type Event struct {
	Seq   int64  `json:"seq"`
	ID    string `json:"id"`
	Topic string `json:"topic"`
	Key   string `json:"key,omitempty"`
	// Status is pending, queued, dead or done (StatusPending, ...).
	Status string `json:"status"`
	// Payload is the body; PayloadJSON says whether it is JSON text (the
	// payload column) or bytes (payload_bin, or null).
	Payload     []byte            `json:"-"`
	PayloadJSON bool              `json:"-"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers"`
	CreatedAt   time.Time         `json:"created_at"`
	// AvailableAt is when a pending event may be claimed; zero once the
	// event left the outbox.
	AvailableAt time.Time `json:"available_at,omitzero"`
	// MaxAttempts is 0 when the event leaves it to the relay's default.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// FinishedAt is when the relay took the event from the outbox, when
	// relay.retention keeps it there (status done in the outbox table).
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Deliveries are the event's deliveries by sink ("" is the routing
	// step). A sink of its route that is absent either received the event
	// or (status pending) has not been tried yet.
	Deliveries map[string]Delivery `json:"deliveries"`
}

// MarshalJSON writes the event with its payload as JSON when it is JSON
// text ("payload") and base64 otherwise ("payload_base64").
func (e Event) MarshalJSON() ([]byte, error) {
	type plain Event
	out := struct {
		plain
		Payload       json.RawMessage `json:"payload,omitempty"`
		PayloadBase64 []byte          `json:"payload_base64,omitempty"`
	}{plain: plain(e)}
	if e.PayloadJSON {
		out.Payload = e.Payload
	} else if e.Payload != nil {
		out.PayloadBase64 = e.Payload
	}
	return json.Marshal(out)
}

// Show returns the event with the given id, from the outbox and its
// deliveries, whatever its status, or ErrNotFound.
func (s *Store) Show(ctx context.Context, id string) (*Event, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, &InputError{"id", fmt.Sprintf("%q is not a UUID", truncate(id, 60))}
	}
	got, err := s.db.ShowEvent(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("reading event %s from %s: %w", id, s.outbox, err)
	}
	if got.OutboxStatus == "" && len(got.Deliveries) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	e := &Event{
		Seq: got.Seq, ID: got.ID, Topic: got.Topic, Key: got.Key, ContentType: got.ContentType,
		CreatedAt: got.CreatedAt, AvailableAt: got.AvailableAt, FinishedAt: got.FinishedAt,
		Headers: map[string]string{}, Deliveries: make(map[string]Delivery, len(got.Deliveries)),
	}
	c := got.Columns
	switch {
	case c.Payload != nil:
		e.Payload, e.PayloadJSON = []byte(*c.Payload), true
	case c.PayloadBin != nil:
		e.Payload = c.PayloadBin
	}
	if c.MaxAttempts != nil {
		e.MaxAttempts = int(*c.MaxAttempts)
	}
	if err := decodeHeaders(c.Headers, e.Headers); err != nil {
		return nil, fmt.Errorf("event %s: %w", id, err)
	}
	for sink, d := range got.Deliveries {
		shown := Delivery{State: d.State, Attempts: d.Attempts, Error: d.Error, NextAt: d.NextAt,
			QueuedAt: d.QueuedAt, DeadAt: d.DeadAt, StopsKey: d.StopsKey}
		if d.Head != nil {
			shown.Head = &QueueHead{Seq: d.Head.Seq, ID: d.Head.ID, State: d.Head.State}
		}
		e.Deliveries[sink] = shown
	}
	e.Status = eventStatus(got.OutboxStatus, e.Deliveries)
	return e, nil
}

// eventStatus derives an event's status from its outbox row's status
// ("" without one) and its deliveries.
func eventStatus(outbox string, deliveries map[string]Delivery) string {
	if outbox == "pending" {
		return StatusPending
	}
	dead := false
	for _, d := range deliveries {
		if d.State != StateDead {
			return StatusQueued
		}
		dead = true
	}
	if dead {
		return StatusDead
	}
	return StatusDone
}

// decodeHeaders reads the headers column; values that are not strings
// (written by hand) are kept as their JSON text.
func decodeHeaders(raw []byte, out map[string]string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("headers column: %w", err)
	}
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return nil
}

// canonicalID is a UUID in the lower-case form PostgreSQL prints.
func canonicalID(id string) string {
	if u, err := uuid.Parse(id); err == nil {
		return u.String()
	}
	return id
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
