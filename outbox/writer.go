// Package outbox is the library applications call inside their own
// transaction to enqueue events for Herald's relay.
//
// An application writes its business change and its events in one
// transaction: either both commit or neither does. The relay then publishes
// committed events to the sinks. On PostgreSQL, Enqueue takes a pgx.Tx,
// EnqueueSQL a database/sql *sql.Tx opened through the pgx stdlib driver;
// both write any number of events in one statement, in order. On MySQL and
// MariaDB (Config.Dialect = MySQL), EnqueueSQL takes a *sql.Tx of
// github.com/go-sql-driver/mysql and writes a multi-row INSERT.
//
// Applications in other languages need no library: an
// INSERT INTO outbox (topic, key, payload) VALUES (...) is the whole contract,
// every other column has a default.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
)

// DefaultNotifyInterval is the NotifyInterval used when Config leaves it zero.
const DefaultNotifyInterval = 20 * time.Millisecond

// NotifyEveryCall is the NotifyInterval that notifies relays on every
// Enqueue call: each transaction that enqueues then takes PostgreSQL's
// notification lock at commit. Meant for low event rates and tests.
const NotifyEveryCall time.Duration = -1

// Config configures a Writer. The zero value writes to public.outbox on
// PostgreSQL and wakes relays at most every DefaultNotifyInterval.
type Config struct {
	// Dialect is the database holding the table. Defaults to PostgreSQL.
	Dialect Dialect
	// Tables names the outbox table. Defaults to public.outbox; on MySQL,
	// to outbox in the connection's database (see migrations/mysql.NewTables).
	Tables migrations.Tables
	// NotifyInterval is the least time between two notifications sent by
	// one Writer to wake relays listening on the table's channel
	// (PostgreSQL only).
	//
	// A NOTIFY inside a transaction takes a database-wide lock at commit that
	// serialises every notifying commit, so notifying on every transaction
	// caps the commit rate of every producer. Debouncing keeps that lock off
	// most commits; the price is latency in rare cases: a relay that misses
	// a debounced notification (because the notifying transaction rolled
	// back, or committed before the others of its interval) finds those
	// events on its next poll, or at once while it is busy.
	//
	// Defaults to DefaultNotifyInterval (20ms). A negative value, such as
	// NotifyEveryCall, notifies on every Enqueue call.
	NotifyInterval time.Duration
	// DisableNotify never notifies: relays find events by polling only.
	DisableNotify bool
	// Capture is how the events are written: Table (the default) inserts
	// rows into the outbox table; WAL emits each as a transactional logical
	// decoding message (the outbox_emit function), which a relay with
	// database.capture: wal reads from a replication slot, writing no table
	// row. The validation and the event ids are the same; a WAL event's
	// JSON payload is stored as jsonb (object keys in jsonb's order, a
	// duplicate key dropped), and an event with a delay (Delay or
	// AvailableAt) goes to the table all the same, where relays find it
	// once it is due. PostgreSQL only.
	Capture Capture
	// Propagator writes the caller's trace context into each event's
	// headers (traceparent, tracestate) when the Enqueue context carries a
	// valid span and the event sets neither header; the relay continues the
	// trace from there. Defaults to OpenTelemetry's global propagator at
	// each call (otel.GetTextMapPropagator, which writes nothing until the
	// application sets one).
	Propagator propagation.TextMapPropagator
}

// Capture is how a Writer writes events: see Config.Capture.
type Capture int

const (
	// Table inserts events into the outbox table.
	Table Capture = iota
	// WAL emits events into PostgreSQL's write-ahead log, for relays that
	// read it from a replication slot (database.capture: wal).
	WAL
)

// Writer enqueues events into the outbox table. It is safe for concurrent
// use; create one per table and share it.
type Writer struct {
	dialect        Dialect
	tables         migrations.Tables
	outboxName     string // the quoted table, for errors
	channel        string
	notifyInterval time.Duration // < 0: every call
	disableNotify  bool
	insertSQL      string                        // the insert alone
	notifySQL      string                        // the insert and a pg_notify, one statement
	propagator     propagation.TextMapPropagator // nil: the global one
	mysqlInsert    string                        // MySQL: the INSERT up to VALUES

	// start is the origin of lastNotify, read through the monotonic clock.
	start time.Time
	// lastNotify is when this Writer last added a notification, in
	// nanoseconds since start; 0 means never.
	lastNotify atomic.Int64
}

// NewWriter returns a Writer for cfg, after checking the table names.
func NewWriter(cfg Config) (*Writer, error) {
	tables := cfg.Tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: Config.Tables: %w", err)
	}
	switch cfg.Dialect {
	case PostgreSQL:
	case MySQL:
		if cfg.Capture != Table {
			return nil, errors.New("outbox: Config.Capture: WAL capture is PostgreSQL's; on MySQL events go to the table")
		}
		names, err := mysqlmigrations.NewTables(tables)
		if err != nil {
			return nil, fmt.Errorf("outbox: Config.Tables: %w", err)
		}
		return &Writer{
			dialect:     MySQL,
			tables:      tables,
			outboxName:  names.Outbox(),
			propagator:  cfg.Propagator,
			mysqlInsert: "INSERT INTO " + names.Outbox() + mysqlColumns,
		}, nil
	default:
		return nil, fmt.Errorf("outbox: Config.Dialect: %d is neither PostgreSQL nor MySQL", int(cfg.Dialect))
	}
	interval := cfg.NotifyInterval
	if interval == 0 {
		interval = DefaultNotifyInterval
	}
	insert := insertSQL(tables)
	switch cfg.Capture {
	case Table:
	case WAL:
		// Decoding pushes the events to the relay at commit: there is no
		// one to wake.
		return &Writer{tables: tables, outboxName: tables.Outbox(), propagator: cfg.Propagator,
			insertSQL: emitSQL(tables), disableNotify: true, start: time.Now()}, nil
	default:
		return nil, fmt.Errorf("outbox: Config.Capture: %d is neither Table nor WAL", int(cfg.Capture))
	}
	return &Writer{
		tables:         tables,
		outboxName:     tables.Outbox(),
		channel:        tables.Channel(),
		notifyInterval: interval,
		disableNotify:  cfg.DisableNotify,
		propagator:     cfg.Propagator,
		insertSQL:      insert,
		notifySQL:      "WITH ins AS (" + insert + ") SELECT pg_notify($11, '')",
		start:          time.Now(),
	}, nil
}

// insertSQL is the one statement that writes a batch: unnest zips the column
// arrays into rows, WITH ORDINALITY and ORDER BY keep the slice order, so seq
// follows it. Empty strings stand for NULL key, payload and content type.
// An event without AvailableAt is due from clock_timestamp(), the time its
// row is written, as the table's default: with now(), the transaction's
// start, a transaction that began first but enqueued second would put the
// key's higher seq first in the claim's (available_at, seq) order.
func insertSQL(t migrations.Tables) string {
	return `INSERT INTO ` + t.Outbox() + ` (id, topic, key, payload, payload_bin, content_type, headers, available_at, max_attempts)
SELECT u.id, u.topic, NULLIF(u.key, ''), NULLIF(u.payload, '')::json, u.payload_bin, NULLIF(u.content_type, ''),
       u.headers::jsonb, COALESCE(u.available_at, clock_timestamp() + u.delay_us * interval '1 microsecond'), NULLIF(u.max_attempts, 0)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::bigint[], $9::timestamptz[], $10::integer[])
     WITH ORDINALITY AS u(id, topic, key, payload, payload_bin, content_type, headers, delay_us, available_at, max_attempts, ord)
ORDER BY u.ord`
}

// emitSQL is insertSQL for Capture WAL: one call of the outbox's emit
// function per event, in slice order, which draws seqs in that order.
func emitSQL(t migrations.Tables) string {
	return `SELECT ` + t.EmitEvent() + `(u.id, u.topic, NULLIF(u.key, ''), NULLIF(u.payload, '')::jsonb, u.payload_bin,
       NULLIF(u.content_type, ''), u.headers::jsonb,
       CASE WHEN u.available_at IS NOT NULL THEN u.available_at - clock_timestamp()
            ELSE u.delay_us * interval '1 microsecond' END,
       NULLIF(u.max_attempts, 0))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::text[], $8::bigint[], $9::timestamptz[], $10::integer[])
     WITH ORDINALITY AS u(id, topic, key, payload, payload_bin, content_type, headers, delay_us, available_at, max_attempts, ord)
ORDER BY u.ord`
}

// Enqueue writes events in tx, in one round trip, and returns their ids in
// order. The events become visible to relays when tx commits and vanish if
// it rolls back. When any event is invalid it returns a *ValidationError and
// writes nothing. Calling it with no events does nothing.
func (w *Writer) Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	if w.dialect != PostgreSQL {
		return nil, fmt.Errorf("outbox: Enqueue takes a pgx transaction, for PostgreSQL; this Writer is for %s: use EnqueueSQL", w.dialect)
	}
	if tx == nil {
		return nil, errors.New("outbox: Enqueue: nil transaction")
	}
	return w.enqueue(w.traceHeaders(ctx), events, func(query string, args []any) error {
		_, err := tx.Exec(ctx, query, args...)
		return err
	})
}

// EnqueueSQL is Enqueue for database/sql. On PostgreSQL, tx must come from
// a *sql.DB opened with the pgx driver (github.com/jackc/pgx/v5/stdlib),
// which passes the column arrays through to PostgreSQL. On MySQL (Config's
// Dialect), from github.com/go-sql-driver/mysql: the events go in one
// multi-row INSERT per 6,553 events (the most placeholders a statement
// takes), which the driver prepares and executes, or sends at once when
// the DSN sets interpolateParams=true. Should an INSERT after the first
// fail, the events before are in tx: roll it back.
func (w *Writer) EnqueueSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, errors.New("outbox: EnqueueSQL: nil transaction")
	}
	if w.dialect == MySQL {
		return w.enqueueMySQL(ctx, tx, w.traceHeaders(ctx), events)
	}
	return w.enqueue(w.traceHeaders(ctx), events, func(query string, args []any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	})
}

// traceHeaders returns the trace context headers of ctx (traceparent and
// tracestate), or nil when ctx carries no valid span.
func (w *Writer) traceHeaders(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	p := w.propagator
	if p == nil {
		p = otel.GetTextMapPropagator()
	}
	carrier := propagation.MapCarrier{}
	p.Inject(ctx, carrier)
	if carrier["traceparent"] == "" {
		return nil
	}
	out := map[string]string{"traceparent": carrier["traceparent"]}
	if ts := carrier["tracestate"]; ts != "" {
		out["tracestate"] = ts
	}
	return out
}

// withTrace returns headers with the trace context added, unless they carry
// their own (either header, in any case) or adding it would break a limit.
func withTrace(index int, headers, traceCtx map[string]string) map[string]string {
	if traceCtx == nil {
		return headers
	}
	for name := range headers {
		if strings.EqualFold(name, "traceparent") || strings.EqualFold(name, "tracestate") {
			return headers
		}
	}
	merged := make(map[string]string, len(headers)+len(traceCtx))
	for k, v := range headers {
		merged[k] = v
	}
	for k, v := range traceCtx {
		merged[k] = v
	}
	if validateHeaders(index, merged) != nil {
		return headers
	}
	return merged
}

// enqueue validates and encodes events, adding traceCtx to their headers,
// then runs the statement with exec.
func (w *Writer) enqueue(traceCtx map[string]string, events []Event, exec func(query string, args []any) error) ([]uuid.UUID, error) {
	if len(events) == 0 {
		return nil, nil
	}
	for i := range events {
		if err := events[i].validate(i); err != nil {
			return nil, err
		}
	}
	cols, err := encode(events, traceCtx)
	if err != nil {
		return nil, err
	}
	args := cols.args()
	query := w.insertSQL
	notify, claimed, previous := w.claimNotify()
	if notify {
		query = w.notifySQL
		args = append(args, w.channel)
	}
	if err := exec(query, args); err != nil {
		if claimed != 0 {
			// No notification went out: let the next call send one.
			w.lastNotify.CompareAndSwap(claimed, previous)
		}
		return nil, fmt.Errorf("outbox: inserting %d events into %s: %w", len(events), w.outboxName, err)
	}
	return cols.ids, nil
}

// claimNotify decides whether this call adds a notification. When a debounced
// call does, it records the time it claimed and the record it replaced, so a
// failed statement can give the claim back.
func (w *Writer) claimNotify() (notify bool, claimed, previous int64) {
	if w.disableNotify {
		return false, 0, 0
	}
	if w.notifyInterval < 0 {
		return true, 0, 0
	}
	now := int64(time.Since(w.start)) + 1 // + 1: never 0, which means never
	previous = w.lastNotify.Load()
	if previous != 0 && now-previous < int64(w.notifyInterval) {
		return false, 0, 0
	}
	if !w.lastNotify.CompareAndSwap(previous, now) {
		return false, 0, 0 // another call claimed this interval first
	}
	return true, now, previous
}

// emptyHeaders is the headers column of an event without headers.
var emptyHeaders = []byte("{}")

// columns holds a batch as one array per column, the parameters of the
// insert statement.
type columns struct {
	ids          []uuid.UUID   // returned to the caller
	pgIDs        []pgtype.UUID // the same, as pgx encodes them without reflection
	topics       []string
	keys         []string
	payloads     [][]byte // JSON text; empty for binary payloads
	payloadBins  [][]byte // nil (NULL) for JSON payloads
	contentTypes []string
	headers      [][]byte // JSON objects
	delaysMicro  []int64
	availableAt  []pgtype.Timestamptz
	maxAttempts  []int32
}

// encode turns validated events into columns, drawing ids for those without
// and adding the trace context headers (nil for none).
func encode(events []Event, traceCtx map[string]string) (*columns, error) {
	n := len(events)
	c := &columns{
		ids:          make([]uuid.UUID, n),
		pgIDs:        make([]pgtype.UUID, n),
		topics:       make([]string, n),
		keys:         make([]string, n),
		payloads:     make([][]byte, n),
		payloadBins:  make([][]byte, n),
		contentTypes: make([]string, n),
		headers:      make([][]byte, n),
		delaysMicro:  make([]int64, n),
		availableAt:  make([]pgtype.Timestamptz, n),
		maxAttempts:  make([]int32, n),
	}
	for i := range events {
		e := &events[i]
		id := e.ID
		if id == uuid.Nil {
			var err error
			if id, err = uuid.NewV7(); err != nil {
				return nil, fmt.Errorf("outbox: generating the id of events[%d]: %w", i, err)
			}
		}
		c.ids[i] = id
		c.pgIDs[i] = pgtype.UUID{Bytes: id, Valid: true}
		c.topics[i] = e.Topic
		c.keys[i] = e.Key
		if e.payloadIsJSON() {
			c.payloads[i] = e.Payload
		} else {
			c.payloadBins[i] = e.Payload
			if e.Payload == nil {
				c.payloadBins[i] = []byte{} // an empty body, not NULL
			}
		}
		c.contentTypes[i] = e.ContentType
		c.headers[i] = emptyHeaders
		if headers := withTrace(i, e.Headers, traceCtx); len(headers) > 0 {
			h, err := json.Marshal(headers)
			if err != nil {
				return nil, fmt.Errorf("outbox: encoding the headers of events[%d]: %w", i, err)
			}
			c.headers[i] = h
		}
		c.delaysMicro[i] = e.Delay.Microseconds()
		c.availableAt[i] = pgtype.Timestamptz{Time: e.AvailableAt, Valid: !e.AvailableAt.IsZero()}
		c.maxAttempts[i] = int32(e.MaxAttempts)
	}
	return c, nil
}

// args returns the statement's parameters $1 to $10, with room for $11.
func (c *columns) args() []any {
	args := make([]any, 10, 11)
	args[0], args[1], args[2], args[3], args[4] = c.pgIDs, c.topics, c.keys, c.payloads, c.payloadBins
	args[5], args[6], args[7], args[8], args[9] = c.contentTypes, c.headers, c.delaysMicro, c.availableAt, c.maxAttempts
	return args
}
