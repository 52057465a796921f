// Package deadletter is where operators meet the outbox table: it lists,
// shows, replays and purges dead-lettered events, and reads the backlog
// figures that `relay status` and the admin server report. Every SQL
// statement of these operations lives here.
//
// Operations that touch many rows walk the dead letters in seq order with
// keyset pagination, DefaultBatchSize rows per statement, each statement its
// own short transaction: memory stays bounded and no lock is held for long,
// however many rows match. Filters travel as statement parameters, never as
// SQL text.
//
// Replaying an event keeps its id and seq, makes it pending and due at once
// with attempts reset, and keeps only the sinks that already delivered it in
// its deliveries, so only the sinks that failed receive it again (unless
// ReplayOpts.AllSinks). Replaying or purging an event also ends what the
// relay's stop_key_on_dead_letter policy left behind for it: its holds are
// deleted and the later events of its key, parked until an operator acts,
// are woken.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/migrations"
)

// DefaultBatchSize is the most rows one statement reads or changes.
const DefaultBatchSize = 1000

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

	listSQL, countSQL, showSQL, replaySQL, purgeSQL, nowSQL string
	pagePlanSQL                                             string

	statusTopicsSQL, statusSinksSQL, statusRoutedSQL string
	statusDeadSQL, statusPublishedSQL, backlogSQL    string
}

// New returns a Store for the tables t (defaults filled in).
func New(db DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	o, h := t.Outbox(), t.Holds()
	s := &Store{db: db, tables: t, batchSize: DefaultBatchSize}
	s.listSQL = `SELECT seq, id::text, topic, coalesce(key, ''), attempts, created_at, finished_at,
       coalesce(last_error, ''),
       ARRAY(SELECT d.key FROM jsonb_each(deliveries) AS d(key, value) WHERE d.value->>'state' = 'dead')
FROM ` + o + ` WHERE ` + filterSQL + `
ORDER BY seq LIMIT $10`
	s.countSQL = `SELECT count(*) FROM ` + o + ` WHERE ` + filterSQL
	s.showSQL = `SELECT seq, id::text, topic, coalesce(key, ''), status, payload::text, payload_bin,
       coalesce(content_type, ''), headers, created_at, available_at, attempts, max_attempts,
       coalesce(last_error, ''), deliveries, finished_at
FROM ` + o + ` WHERE id = $1`
	// One batch of a replay: the matching dead rows are made pending again,
	// due at $11 (the same time for every batch, so the claim takes replayed
	// events in seq order), keeping only the deliveries already done unless
	// $12 asks for every sink. Their holds go, and the later events of their
	// keys parked for an operator ('infinity') are woken.
	s.replaySQL = `WITH sel AS (
    SELECT seq FROM ` + o + ` WHERE ` + filterSQL + `
    ORDER BY seq LIMIT $10 FOR UPDATE
), upd AS (
    UPDATE ` + o + ` o SET status = 'pending', attempts = 0, available_at = $11, last_error = NULL,
        finished_at = NULL,
        deliveries = CASE WHEN $12::boolean THEN '{}'::jsonb ELSE coalesce(
            (SELECT jsonb_object_agg(d.key, d.value) FROM jsonb_each(o.deliveries) AS d(key, value)
             WHERE d.value->>'state' = 'done'), '{}'::jsonb) END
    FROM sel WHERE o.seq = sel.seq
    RETURNING o.seq, o.id, o.key
)` + releaseKeys(o, h, "upd")
	s.purgeSQL = `WITH sel AS (
    SELECT seq FROM ` + o + ` WHERE ` + filterSQL + `
    ORDER BY seq LIMIT $10 FOR UPDATE
), del AS (
    DELETE FROM ` + o + ` o USING sel WHERE o.seq = sel.seq
    RETURNING o.seq, o.id, o.key
)` + releaseKeys(o, h, "del")
	s.nowSQL = `SELECT now()`
	// A page must walk the dead-letter index in seq order and stop at its
	// limit. Right after a burst of dead letters, before autovacuum has
	// analysed the table, the planner underestimates them and would rather
	// read and sort every remaining match on each page; these settings,
	// local to the page's transaction, keep it on the index.
	// (Disabled plans look expensive enough to set JIT compiling off;
	// it is not worth it for a page.)
	s.pagePlanSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('jit', 'off', true)`
	s.initStatus()
	return s, nil
}

// filterSQL selects dead rows past seq $1 matching the filter parameters
// $2 to $9 (NULL means no condition).
const filterSQL = `status = 'dead' AND seq > $1
  AND ($2::uuid[] IS NULL OR id = ANY($2::uuid[]))
  AND ($3::text IS NULL OR topic LIKE $3::text)
  AND ($4::text IS NULL OR key = $4::text)
  AND ($5::text IS NULL OR deliveries -> $5::text ->> 'state' = 'dead')
  AND ($6::text IS NULL OR strpos(lower(last_error), lower($6::text)) > 0)
  AND ($7::timestamptz IS NULL OR finished_at >= $7::timestamptz)
  AND ($8::timestamptz IS NULL OR finished_at < $8::timestamptz)
  AND ($9::interval IS NULL OR finished_at < now() - $9::interval)`

// Filter selects dead letters. Zero fields select everything; set fields
// must all match.
type Filter struct {
	// IDs are event ids (UUIDs).
	IDs []string `json:"ids,omitempty"`
	// Topic is a topic pattern as in routes: * matches any run of
	// characters, everything else matches itself.
	Topic string `json:"topic,omitempty"`
	// Key is an exact event key.
	Key string `json:"key,omitempty"`
	// Sink selects events that failed for good on this sink.
	Sink string `json:"sink,omitempty"`
	// Error is a case-insensitive substring of the event's last error.
	Error string `json:"error,omitempty"`
	// Since and Until bound the time the event died (finished_at): at or
	// after Since, before Until.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// OlderThan selects events that died more than this long ago.
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

// args returns the filter's statement parameters $1 to $9.
func (f Filter) args(after int64) []any {
	args := make([]any, 9, 12)
	args[0] = after
	if len(f.IDs) > 0 {
		ids := make([]pgtype.UUID, len(f.IDs))
		for i, id := range f.IDs {
			u, _ := uuid.Parse(id) // checked by Validate
			ids[i] = pgtype.UUID{Bytes: u, Valid: true}
		}
		args[1] = ids
	}
	args[2] = optText(TopicLike(f.Topic))
	args[3] = optText(f.Key)
	args[4] = optText(f.Sink)
	args[5] = optText(f.Error)
	args[6] = optTime(f.Since)
	args[7] = optTime(f.Until)
	if f.OlderThan > 0 {
		args[8] = f.OlderThan
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

// DeadLetter is one dead event as List reports it.
type DeadLetter struct {
	// Seq is the row's sequence number: its position in the table.
	Seq int64 `json:"seq"`
	// ID is the event id.
	ID    string `json:"id"`
	Topic string `json:"topic"`
	Key   string `json:"key,omitempty"`
	// Attempts is the most attempts spent on any sink.
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	// DiedAt is when the event was dead-lettered (finished_at).
	DiedAt    time.Time `json:"died_at"`
	LastError string    `json:"last_error"`
	// DeadSinks are the sinks on which the event failed for good.
	DeadSinks []string `json:"dead_sinks"`
}

// ListOpts bounds a List.
type ListOpts struct {
	// Limit is the most dead letters returned; 0 means all.
	Limit int
	// AfterSeq starts after this seq, for paging through results.
	AfterSeq int64
}

// List calls fn for each dead letter matching f, in seq order, reading
// DefaultBatchSize rows per statement. It stops at fn's first error and
// returns it.
func (s *Store) List(ctx context.Context, f Filter, opts ListOpts, fn func(DeadLetter) error) error {
	if err := f.Validate(); err != nil {
		return err
	}
	after, seen := opts.AfterSeq, 0
	for {
		n := s.batchSize
		if opts.Limit > 0 {
			n = min(n, opts.Limit-seen)
		}
		if n <= 0 {
			return nil
		}
		page, err := s.listPage(ctx, f, after, n)
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
		after = page[len(page)-1].Seq
	}
}

func (s *Store) listPage(ctx context.Context, f Filter, after int64, limit int) ([]DeadLetter, error) {
	page := make([]DeadLetter, 0, limit)
	err := s.inPage(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.listSQL, append(f.args(after), limit)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				d        DeadLetter
				attempts int32
				finished pgtype.Timestamptz
			)
			if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &attempts, &d.CreatedAt, &finished, &d.LastError, &d.DeadSinks); err != nil {
				return err
			}
			d.Attempts, d.DiedAt = int(attempts), finished.Time
			slices.Sort(d.DeadSinks)
			page = append(page, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("listing dead letters of %s: %w", s.tables.Outbox(), err)
	}
	return page, nil
}

// inPage runs one page's statement in its own short transaction, planned
// to walk the dead-letter index.
func (s *Store) inPage(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.pagePlanSQL); err != nil {
			return err
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
	if err := s.db.QueryRow(ctx, s.countSQL, f.args(0)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting dead letters of %s: %w", s.tables.Outbox(), err)
	}
	return n, nil
}

// Delivery is one sink's state for one event (the deliveries column).
type Delivery struct {
	// State is done, retry or dead.
	State    string    `json:"state"`
	Attempts int       `json:"attempts,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// Event is every column of one outbox row, as Show reports it.
type Event struct {
	Seq    int64  `json:"seq"`
	ID     string `json:"id"`
	Topic  string `json:"topic"`
	Key    string `json:"key,omitempty"`
	Status string `json:"status"`
	// Payload is the body; JSON says whether it is JSON text (the payload
	// column) or bytes (payload_bin, or null).
	Payload     []byte            `json:"-"`
	PayloadJSON bool              `json:"-"`
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers"`
	CreatedAt   time.Time         `json:"created_at"`
	AvailableAt time.Time         `json:"available_at"`
	Attempts    int               `json:"attempts"`
	// MaxAttempts is 0 when the row leaves it to the relay's default.
	MaxAttempts int                 `json:"max_attempts,omitempty"`
	LastError   string              `json:"last_error,omitempty"`
	Deliveries  map[string]Delivery `json:"deliveries"`
	// FinishedAt is when the event was delivered or dead-lettered.
	FinishedAt time.Time `json:"finished_at,omitzero"`
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

// Show returns every column of the event with the given id, whatever its
// status, or ErrNotFound.
func (s *Store) Show(ctx context.Context, id string) (*Event, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, &InputError{"id", fmt.Sprintf("%q is not a UUID", truncate(id, 60))}
	}
	var (
		e                   Event
		payload             pgtype.Text
		payloadBin          []byte
		headers, deliveries []byte
		attempts            int32
		maxAttempts         pgtype.Int4
		available, finis    pgtype.Timestamptz
	)
	err = s.db.QueryRow(ctx, s.showSQL, pgtype.UUID{Bytes: u, Valid: true}).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &e.Status,
		&payload, &payloadBin, &e.ContentType, &headers, &e.CreatedAt, &available, &attempts, &maxAttempts,
		&e.LastError, &deliveries, &finis)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading event %s from %s: %w", id, s.tables.Outbox(), err)
	}
	switch {
	case payload.Valid:
		e.Payload, e.PayloadJSON = []byte(payload.String), true
	case payloadBin != nil:
		e.Payload = payloadBin
	}
	e.Attempts, e.MaxAttempts = int(attempts), int(maxAttempts.Int32)
	e.AvailableAt, e.FinishedAt = infinityAware(available), finis.Time
	e.Headers = map[string]string{}
	if err := decodeHeaders(headers, e.Headers); err != nil {
		return nil, fmt.Errorf("event %s: %w", id, err)
	}
	e.Deliveries = map[string]Delivery{}
	if err := json.Unmarshal(deliveries, &e.Deliveries); err != nil {
		return nil, fmt.Errorf("event %s: deliveries column: %w", id, err)
	}
	return &e, nil
}

// infinityAware decodes 'infinity' (an event parked for an operator) as the
// largest time JSON and RFC 3339 can show.
func infinityAware(t pgtype.Timestamptz) time.Time {
	if t.InfinityModifier == pgtype.Infinity {
		return time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	}
	return t.Time
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

// releaseKeys is the end of the replay and purge statements, after the CTE
// named from that returns the rows replayed or purged (seq, id, key): their
// holds go; under relay.stop_key_on_dead_letter the later events of their
// keys were parked for an operator ('infinity'), and are woken at $11 with
// their own holds, which they keep while they wait (see relay's holds).
func releaseKeys(outbox, holds, from string) string {
	return `, unhold AS (
    DELETE FROM ` + holds + ` x USING ` + from + ` WHERE x.key = ` + from + `.key AND x.seq = ` + from + `.seq
), wake AS (
    UPDATE ` + outbox + ` SET available_at = $11
    WHERE status = 'pending' AND available_at = 'infinity'
      AND key IN (SELECT key FROM ` + from + ` WHERE key IS NOT NULL)
    RETURNING seq, key
), rehold AS (
    UPDATE ` + holds + ` x SET until = $11 FROM wake w WHERE x.key = w.key AND x.seq = w.seq
)
SELECT seq, id::text FROM ` + from
}
