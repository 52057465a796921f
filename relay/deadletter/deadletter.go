// Package deadletter is where operators meet the outbox: it lists, shows,
// replays and purges dead letters, and reads the backlog figures that `relay
// status` and the admin server report. Every SQL statement of these
// operations lives here.
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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/queue"
)

// DefaultBatchSize is the most rows one statement reads or changes.
const DefaultBatchSize = 1000

// RoutingStep is the sink name of the routing step: deliveries of events
// that have not been routed to their sinks yet (replayed with AllSinks, or
// dead before any sink because no route matched or the event could not be
// read).
const RoutingStep = ""

// DB is what the store needs from a connection pool; *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

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

// Store runs the dead-letter and status statements on one outbox table.
type Store struct {
	db        DB
	tables    migrations.Tables
	batchSize int

	listSQL, countSQL, pagePlanSQL      string
	listNewestSQL, countAtMostSQL       string
	countPlanSQL                        string
	showSetupSQL, showEventSQL          string
	showDeliveriesSQL, nowSQL           string
	lockLanesSQL, notifySQL             string
	replaySQL, routeSQL                 string
	dropSinkDeadSQL, purgeSQL           string
	promoteSQL                          string
	statusPendingSQL, statusQueuesSQL   string
	statusPublishedSQL, statusRelaysSQL string
	backlogSQL                          string
	heldKeysSQL, keyQueuesSQL           string
}

// New returns a Store for the tables t (defaults filled in).
func New(db DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	o, dl, l := t.Outbox(), t.Deliveries(), t.Lanes()
	s := &Store{db: db, tables: t, batchSize: DefaultBatchSize}
	s.listSQL = `SELECT d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key
FROM ` + dl + ` d WHERE ` + filterSQL + `
ORDER BY d.seq, d.sink LIMIT $11`
	// The same walking the index backwards, from the newest.
	s.listNewestSQL = `SELECT d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.sink, d.attempts, d.created_at, d.dead_at,
       coalesce(d.last_error, ''), d.stops_key
FROM ` + dl + ` d WHERE ` + filterBeforeSQL + `
ORDER BY d.seq DESC, d.sink DESC LIMIT $11`
	s.countSQL = `SELECT count(*) FROM ` + dl + ` d WHERE ` + filterSQL
	s.countAtMostSQL = `SELECT count(*) FROM (SELECT FROM ` + dl + ` d WHERE ` + filterSQL + ` LIMIT $11) m`
	// A batch must walk the dead-letter index in (seq, sink) order, stop at
	// its limit, and reach every other row it reads or changes through an
	// index, one probe per row. Right after a burst of dead letters, before
	// autovacuum has analysed the table, the planner underestimates them
	// and would rather read and sort every remaining match, or hash the
	// whole table to join a batch with it; these settings, local to the
	// batch's transaction, keep it on the indexes. (Disabled plans look
	// expensive enough to set JIT compiling off; it is not worth it for a
	// batch.) A selection by id is left to the planner: the id index finds
	// the few rows at once.
	s.pagePlanSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
       set_config('jit', 'off', true)`
	s.countPlanSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true)`
	// Show reads the outbox row and the deliveries of one event from one
	// snapshot: a relay moving the event from one to the other in between
	// would otherwise hide it.
	s.showSetupSQL = `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`
	s.showEventSQL = `SELECT seq, id::text, topic, coalesce(key, ''), status, payload::text, payload_bin,
       coalesce(content_type, ''), headers, created_at, available_at, max_attempts, finished_at
FROM ` + o + ` WHERE id = $1`
	// Each delivery of the event, and for one waiting in its key's queue,
	// the head it waits behind (one probe of the unique head index).
	s.showDeliveriesSQL = `SELECT d.sink, d.seq, d.topic, coalesce(d.key, ''), d.payload::text, d.payload_bin,
       coalesce(d.content_type, ''), d.headers, d.created_at, d.max_attempts,
       d.state, d.stops_key, d.attempts, d.next_at, coalesce(d.last_error, ''), d.queued_at, d.dead_at,
       h.seq, h.id::text, h.state
FROM ` + dl + ` d
LEFT JOIN LATERAL (
    SELECT x.seq, x.id, x.state FROM ` + dl + ` x
    WHERE d.state = 'waiting' AND x.key = d.key AND x.sink = d.sink AND (x.state = 'ready' OR x.stops_key)
) h ON true
WHERE d.id = $1
ORDER BY d.sink`
	s.nowSQL = `SELECT now()`
	// Every lane, in lane order (the order relays take theirs in share
	// mode): a batch waits for the records in flight and holds off new
	// ones until it commits.
	s.lockLanesSQL = `SELECT lane FROM ` + l + ` ORDER BY lane FOR NO KEY UPDATE`
	s.notifySQL = `SELECT pg_notify($1, '` + queue.Notification + `')`
	// One batch of a replay: the next dead letters, locked ($1 to $10 the
	// filter, $11 the batch size), rejoin their queues, unless $12 sends
	// them to the routing step instead (see Replay). queued says whether
	// the event still has a delivery that is not dead on a sink, which
	// keeps it out of the routing step. A rejoining dead letter waits,
	// none is a head yet (promoteSQL makes the heads next), so the unique
	// head index never sees two heads of a queue, even for a moment; one
	// without a key is a queue of its own, due at once. The batch drives
	// the update, row by row through the primary key.
	s.replaySQL = `WITH sel AS (
    SELECT d.sink, d.seq, d.id, d.key, d.stops_key,
           $12::boolean AND EXISTS (
               SELECT 1 FROM ` + dl + ` x WHERE x.id = d.id AND x.sink <> '' AND x.state <> 'dead') AS queued
    FROM ` + dl + ` d WHERE ` + filterSQL + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
), rejoin AS (
    UPDATE ` + dl + ` d
    SET state = CASE WHEN d.key IS NULL THEN 'ready' ELSE 'waiting' END,
        next_at = CASE WHEN d.key IS NULL THEN now() END,
        stops_key = false, attempts = 0, last_error = NULL, dead_at = NULL, queued_at = now()
    FROM sel
    WHERE d.sink = sel.sink AND d.seq = sel.seq AND (NOT $12::boolean OR sel.queued)
)
SELECT sink, seq, id::text, key, stops_key, queued FROM sel`
	// Events ($1 seqs) go back to the routing step: a delivery on sink ''
	// each, copied from one of their dead letters (their own dead one
	// there, when they died before any sink), waiting like a dead letter
	// rejoining its queue (promoteSQL makes the heads).
	s.routeSQL = `INSERT INTO ` + dl + ` AS r (sink, seq, lane, id, topic, key, payload, payload_bin, content_type,
    headers, created_at, max_attempts, state, stops_key, attempts, next_at, last_error, queued_at, dead_at)
SELECT DISTINCT ON (d.seq) '', d.seq, d.lane, d.id, d.topic, d.key, d.payload, d.payload_bin, d.content_type,
       d.headers, d.created_at, d.max_attempts,
       CASE WHEN d.key IS NULL THEN 'ready' ELSE 'waiting' END, false, 0,
       CASE WHEN d.key IS NULL THEN now() END, NULL, now(), NULL
FROM ` + dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.state = 'dead'
ORDER BY d.seq, d.sink
ON CONFLICT (sink, seq) DO UPDATE
SET state = excluded.state, next_at = excluded.next_at, stops_key = false, attempts = 0,
    last_error = NULL, dead_at = NULL, queued_at = now()
WHERE r.state = 'dead'`
	// The dead letters of events gone back to the routing step ($1 seqs),
	// on every sink: the routing step sends the event to each sink of its
	// route again.
	s.dropSinkDeadSQL = `DELETE FROM ` + dl + ` d
WHERE d.seq = ANY($1::bigint[]) AND d.sink <> '' AND d.state = 'dead'
RETURNING d.sink, d.key`
	s.purgeSQL = `WITH sel AS (
    SELECT d.sink, d.seq FROM ` + dl + ` d WHERE ` + filterSQL + `
    ORDER BY d.seq, d.sink LIMIT $11
    FOR UPDATE OF d
)
DELETE FROM ` + dl + ` d USING sel
WHERE d.sink = sel.sink AND d.seq = sel.seq
RETURNING d.sink, d.seq, d.id::text, d.key, d.stops_key`
	// Every lane is locked by the operation: no fence on the promoted rows.
	s.promoteSQL = queue.PromoteSQL(t, "")
	s.initStatus()
	s.initHeld()
	return s, nil
}

// filterSQL selects dead letters (alias d) after ($1 seq, $2 sink)
// matching the filter parameters $3 to $10 (NULL means no condition). Its
// first two conditions are those of the dead-letter index.
const filterSQL = `d.state = 'dead' AND (d.seq, d.sink) > ($1::bigint, $2::text)
  AND ($3::uuid[] IS NULL OR d.id = ANY($3::uuid[]))
  AND ($4::text IS NULL OR d.topic LIKE $4::text)
  AND ($5::text IS NULL OR d.key = $5::text)
  AND ($6::text IS NULL OR d.sink = $6::text)
  AND ($7::text IS NULL OR strpos(lower(d.last_error), lower($7::text)) > 0)
  AND ($8::timestamptz IS NULL OR d.dead_at >= $8::timestamptz)
  AND ($9::timestamptz IS NULL OR d.dead_at < $9::timestamptz)
  AND ($10::interval IS NULL OR d.dead_at < now() - $10::interval)`

// filterBeforeSQL is filterSQL selecting the dead letters before ($1 seq,
// $2 sink), for a list from the newest.
var filterBeforeSQL = strings.Replace(filterSQL, "(d.seq, d.sink) > (", "(d.seq, d.sink) < (", 1)

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

// position is a place in the (seq, sink) order of dead letters. A NULL
// sink is after every dead letter of seq (a row comparison with a NULL
// member stops there, and the dead-letter index honours it).
type position struct {
	seq  int64
	sink pgtype.Text
}

// start is before every dead letter: seqs come from an identity column
// and are positive.
var start = position{seq: math.MinInt64, sink: pgtype.Text{Valid: true}}

// end is after every dead letter, for a list from the newest.
var end = position{seq: math.MaxInt64}

func at(seq int64, sink string) position {
	return position{seq, pgtype.Text{String: sink, Valid: true}}
}

// before reports whether p is before the dead letter (seq, sink).
func (p position) before(seq int64, sink string) bool {
	return p.seq < seq || p.seq == seq && p.sink.Valid && p.sink.String < sink
}

// args returns the filter's statement parameters $1 to $10, after p.
func (f Filter) args(p position) []any {
	args := make([]any, 10, 11)
	args[0], args[1] = p.seq, p.sink
	if len(f.IDs) > 0 {
		ids := make([]pgtype.UUID, len(f.IDs))
		for i, id := range f.IDs {
			u, _ := uuid.Parse(id) // checked by Validate
			ids[i] = pgtype.UUID{Bytes: u, Valid: true}
		}
		args[2] = ids
	}
	args[3] = optText(TopicLike(f.Topic))
	args[4] = optText(f.Key)
	args[5] = optText(f.Sink)
	args[6] = optText(f.Error)
	args[7] = optTime(f.Since)
	args[8] = optTime(f.Until)
	if f.OlderThan > 0 {
		args[9] = f.OlderThan
	}
	return args
}

func optText(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func optTime(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

// TopicLike translates a topic pattern (* matches any run of characters) to
// a LIKE pattern, escaping LIKE's own wildcards and escape character. The
// empty pattern stays empty.
func TopicLike(pattern string) string {
	var b strings.Builder
	for _, r := range pattern {
		switch r {
		case '\\', '%', '_':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '*':
			b.WriteByte('%')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

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
		after = position{seq: opts.AfterSeq} // after all of AfterSeq, either way
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

func (s *Store) listPage(ctx context.Context, f Filter, after position, limit int, newest bool) ([]DeadLetter, error) {
	page := make([]DeadLetter, 0, limit)
	sql := s.listSQL
	if newest {
		sql = s.listNewestSQL
	}
	err := s.inPage(ctx, f, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, append(f.args(after), limit)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				d             DeadLetter
				attempts      int32
				created, died pgtype.Timestamptz
			)
			if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Sink, &attempts, &created, &died, &d.LastError, &d.StopsKey); err != nil {
				return err
			}
			d.Attempts, d.CreatedAt, d.DiedAt = int(attempts), jsonTime(created), jsonTime(died)
			page = append(page, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("listing dead letters of %s: %w", s.tables.Outbox(), err)
	}
	return page, nil
}

// inPage runs one page's statements in their own short transaction,
// planned to walk the dead-letter index unless f selects by id.
func (s *Store) inPage(ctx context.Context, f Filter, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(f.IDs) == 0 {
			if _, err := tx.Exec(ctx, s.pagePlanSQL); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// inCount runs a count in its own short transaction, planned to walk the
// dead-letter index (reading only dead letters' rows, not the queued
// deliveries around them) unless f selects by id.
func (s *Store) inCount(ctx context.Context, f Filter, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(f.IDs) == 0 {
			if _, err := tx.Exec(ctx, s.countPlanSQL); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// Count returns how many dead letters match f.
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	var n int64
	if err := s.inCount(ctx, f, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.countSQL, f.args(start)...).Scan(&n)
	}); err != nil {
		return 0, fmt.Errorf("counting dead letters of %s: %w", s.tables.Outbox(), err)
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
	if err := s.inCount(ctx, f, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.countAtMostSQL, append(f.args(start), limit+1)...).Scan(&n)
	}); err != nil {
		return 0, false, fmt.Errorf("counting dead letters of %s: %w", s.tables.Outbox(), err)
	}
	if n > limit {
		return limit, true, nil
	}
	return n, false, nil
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

// eventColumns are an event's columns as the outbox and the deliveries
// store them.
type eventColumns struct {
	payload     pgtype.Text
	payloadBin  []byte
	headers     []byte
	maxAttempts pgtype.Int4
}

func (c *eventColumns) fill(e *Event) error {
	switch {
	case c.payload.Valid:
		e.Payload, e.PayloadJSON = []byte(c.payload.String), true
	case c.payloadBin != nil:
		e.Payload = c.payloadBin
	}
	e.MaxAttempts = int(c.maxAttempts.Int32)
	e.Headers = map[string]string{}
	return decodeHeaders(c.headers, e.Headers)
}

// Show returns the event with the given id, from the outbox and its
// deliveries, whatever its status, or ErrNotFound.
func (s *Store) Show(ctx context.Context, id string) (*Event, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, &InputError{"id", fmt.Sprintf("%q is not a UUID", truncate(id, 60))}
	}
	arg := pgtype.UUID{Bytes: u, Valid: true}
	var (
		e       Event
		inOut   bool
		outbox  string
		decoded error
	)
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.showSetupSQL); err != nil {
			return err
		}
		var (
			cols                      eventColumns
			created, available, finis pgtype.Timestamptz
		)
		err := tx.QueryRow(ctx, s.showEventSQL, arg).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &outbox,
			&cols.payload, &cols.payloadBin, &e.ContentType, &cols.headers, &created, &available,
			&cols.maxAttempts, &finis)
		switch {
		case err == nil:
			inOut = true
			e.CreatedAt, e.AvailableAt, e.FinishedAt = jsonTime(created), jsonTime(available), jsonTime(finis)
			decoded = cols.fill(&e)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		e.Deliveries = map[string]Delivery{}
		rows, err := tx.Query(ctx, s.showDeliveriesSQL, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				sink, state, topic, key, contentType string
				seq                                  int64
				d                                    Delivery
				attempts                             int32
				created, next, queued, dead          pgtype.Timestamptz
				headSeq                              pgtype.Int8
				headID, headState                    pgtype.Text
				c                                    eventColumns
			)
			if err := rows.Scan(&sink, &seq, &topic, &key, &c.payload, &c.payloadBin, &contentType, &c.headers,
				&created, &c.maxAttempts, &state, &d.StopsKey, &attempts, &next, &d.Error, &queued, &dead,
				&headSeq, &headID, &headState); err != nil {
				return err
			}
			d.State, d.Attempts = state, int(attempts)
			d.NextAt, d.QueuedAt, d.DeadAt = jsonTime(next), jsonTime(queued), jsonTime(dead)
			if headSeq.Valid {
				d.Head = &QueueHead{Seq: headSeq.Int64, ID: headID.String, State: headState.String}
			}
			e.Deliveries[sink] = d
			if !inOut && e.ID == "" {
				e.Seq, e.ID, e.Topic, e.Key, e.ContentType, e.CreatedAt = seq, u.String(), topic, key, contentType, jsonTime(created)
				decoded = c.fill(&e)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("reading event %s from %s: %w", id, s.tables.Outbox(), err)
	}
	if !inOut && len(e.Deliveries) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if decoded != nil {
		return nil, fmt.Errorf("event %s: %w", id, decoded)
	}
	e.Status = eventStatus(outbox, e.Deliveries)
	return &e, nil
}

// jsonTime is a timestamp read from a row as a time JSON and RFC 3339 can
// carry, years 1 to 9999: a row written by hand may hold 'infinity' or a
// date past year 9999, and one such row must not break a listing. Those
// are clamped to the nearest end of the range; NULL is the zero time.
func jsonTime(t pgtype.Timestamptz) time.Time {
	switch {
	case !t.Valid || t.InfinityModifier == pgtype.NegativeInfinity || t.Time.Year() < 1:
		return time.Time{}
	case t.InfinityModifier == pgtype.Infinity || t.Time.Year() > 9999:
		return time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	}
	return t.Time
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
