// Package store is the relay engine's only way to its database: the Store
// interface, at the level of the engine's operations (announce a relay, hold
// lanes, claim a batch under them, record its outcome fenced by them, keep
// the tables tidy, wait for work), and the plain Go values that cross it.
//
// The engine (package relay) decides everything that is the same on every
// database: which lanes a relay should hold, what a batch's outcome is
// (routing, per-key order, backoff, dead letters), when to claim the queues,
// how often to tidy, how to retry. A Store only says how the database does
// each operation, in its own SQL, in one round trip where the operation
// allows. Each database has an implementation of its own (relay/internal/pgstore
// for PostgreSQL), and nothing of a driver (pgx types, error codes) crosses
// this interface.
package store

import (
	"context"
	"database/sql"
	"time"
)

// Lanes is the number of lanes the key space is hashed into: the rows every
// schema seeds in the lanes table, and the bits of a lane mask (lane i is bit
// 1<<i).
const Lanes = 64

// Store is the database as the relay engine uses it. Owner names one claim
// loop (a worker) to the database; config is the fingerprint of its routes:
// only relays running the newest live configuration claim (see Heartbeat).
// Every write on events and deliveries is fenced by lane: it changes only
// rows of lanes owner still holds, and waits for no lock it does not need.
// A Store is safe for concurrent use by several workers.
type Store interface {
	// CheckSchema returns nil when the database holds exactly the schema
	// version this relay was built for, and an error saying what to do
	// otherwise.
	CheckSchema(ctx context.Context) error

	// Heartbeat announces owner as live until lease from now, running
	// config, with the sinks it holds paused (nil: none).
	Heartbeat(ctx context.Context, owner, config string, lease time.Duration, paused []string) error
	// Renew heartbeats owner (as Heartbeat) and renews the lanes it holds,
	// then reports the live relays running the newest configuration: how
	// many, how many of them sort before owner, whether owner's config is
	// the newest, and the lanes owner holds. One round trip.
	Renew(ctx context.Context, owner, config string, lease time.Duration, paused []string) (LaneView, error)
	// ReleaseLanes gives back the lanes of mask that owner holds.
	ReleaseLanes(ctx context.Context, owner string, mask uint64) error
	// AcquireLanes takes, for lease, the lanes first to last (inclusive)
	// that no live relay holds, skipping those another relay is taking at
	// the same moment. It returns the lanes taken, and among them those
	// taken over from an owner whose lease had expired (it may have died
	// with a batch in flight), as masks.
	AcquireLanes(ctx context.Context, owner string, lease time.Duration, first, last int) (acquired, takenOver uint64, err error)
	// ReleaseAll gives back every lane of owner and removes its heartbeat,
	// so that other relays take over at once.
	ReleaseAll(ctx context.Context, owner string) error
	// OwnerLive returns until when a relay named owner announced itself
	// live, or the zero time when none is.
	OwnerLive(ctx context.Context, owner string) (time.Time, error)

	// Claim reads a batch (see ClaimParams) without locking or writing
	// anything: holding the lanes is what reserves it. An empty lane mask
	// is not allowed (the engine claims nothing then).
	Claim(ctx context.Context, p ClaimParams) (fresh, queued []Claimed, err error)
	// Record writes a batch's outcome in one transaction, fenced by lane.
	// The outbox rows go (deleted, or with keepDone marked done). A row
	// another transaction holds locked is not waited for long: the outcome
	// is written without it, and left lists the outbox rows left in place
	// (the engine claims them again later). An error of the database
	// refusing the data (a constraint, a value out of range) is a
	// *DataError.
	Record(ctx context.Context, owner string, o *Outcome, keepDone bool) (left []int64, err error)

	// SinksWithDeliveries lists the sinks that have deliveries (any state,
	// any lane; "" is the routing step).
	SinksWithDeliveries(ctx context.Context) ([]string, error)
	// DeadLetterSinks turns at most limit deliveries of owner's lanes
	// waiting for one of sinks into dead letters that do not stop their
	// key, saying that no route names their sink. It returns how many.
	DeadLetterSinks(ctx context.Context, owner string, sinks []string, limit int) (int64, error)
	// RemoveDeparted removes the heartbeats of relays gone for a while.
	RemoveDeparted(ctx context.Context) error
	// PurgeDone removes at most limit outbox rows marked done longer than
	// olderThan ago, oldest first, and returns how many.
	PurgeDone(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// AddPublished adds published counts to the stats table and removes
	// counts older than a day.
	AddPublished(ctx context.Context, counts map[StatKey]int64) error
	// MaintainTables does what the database needs for claims to stay
	// fast as rows are deleted and tables grow (on PostgreSQL: vacuum a
	// table with more than deadRows dead rows, analyze one that grew).
	MaintainTables(ctx context.Context, deadRows int64) (Maintenance, error)

	// Listen blocks until ctx ends or its means of being told about new
	// work is lost (the error says why), calling wake whenever work may
	// have arrived: queues is set when the delivery queues changed (an
	// operator replayed or purged dead letters). It calls wake once when
	// it starts, since work may have arrived unannounced before.
	Listen(ctx context.Context, wake func(queues bool)) error
}

// LaneView is what Renew found.
type LaneView struct {
	// Live counts the live relays running the newest configuration; Rank
	// how many of them sort before the owner by name.
	Live, Rank int
	// Current: the owner runs the newest configuration.
	Current bool
	// Held is the mask of lanes the owner holds, renewed.
	Held uint64
}

// ClaimParams say what one claim reads: up to Rows due outbox rows of the
// lanes in Lanes, in seq order, and, when QueueSinks is not nil, from each
// queue in QueueSinks ("" is the routing step; the earlier first when bytes
// run short) up to QueueHeads[i] due heads of those lanes, each followed by
// the deliveries waiting behind it, QueueRows rows at most per sink. Both
// reads go in one round trip.
type ClaimParams struct {
	// Config is the claiming relay's configuration: it claims nothing
	// unless that is the newest live one.
	Config string
	// Lanes is the mask of lanes to claim from; not empty.
	Lanes uint64
	// Rows is the most outbox rows.
	Rows int
	// Bytes is the most payload bytes of each read (outbox rows, and
	// deliveries), an event larger than that coming alone.
	Bytes int64
	// EventBytes is the largest payload loaded: a larger one is left in the
	// database (Claimed.Payload and PayloadBin nil, PayloadBytes saying how
	// large it is).
	EventBytes int64
	// Skip lists outbox rows not to claim.
	Skip []int64

	QueueSinks []string
	QueueHeads []int32
	QueueRows  int
}

// Event is an event's columns as a claim reads them, from an outbox row or
// from a delivery, undecoded.
type Event struct {
	Seq   int64
	ID    string // the UUID in its canonical text form
	Topic string
	Key   string // "" when the event has none
	Lane  int16
	// Payload is the JSON payload column, PayloadBin the binary one; at
	// most one is set, neither when the payload is NULL or was too large
	// to load.
	Payload, PayloadBin []byte
	// PayloadBytes is the payload's size as stored.
	PayloadBytes int64
	ContentType  string // "" when not set
	// Headers is the headers column's JSON text.
	Headers   []byte
	CreatedAt time.Time
	// CreatedAtErr says why the created_at column is not a time the relay
	// can carry (PostgreSQL's infinity); CreatedAt is then zero.
	CreatedAtErr error
	// MaxAttempts is the event's own limit, 0 for the relay's default.
	MaxAttempts int
}

// Claimed is one claimed piece of work: an outbox row, or a delivery in a
// sink's queue (the routing step's included).
type Claimed struct {
	Event
	// Delivery is set for a delivery, Sink naming its queue ("" for the
	// routing step); an outbox row has neither.
	Delivery bool
	Sink     string
	// Head: the delivery is its queue's head (the others were claimed
	// behind it).
	Head bool
	// Attempts spent on Sink so far.
	Attempts int
	// Queued lists, for an outbox row or a routing-step delivery, the sinks
	// on which its key has a queue (a head), the routing step's included.
	Queued []string
	// Elsewhere lists, for a routing-step delivery, the sinks on which the
	// event already has a delivery.
	Elsewhere []string
}

// Delivery states, as the deliveries table stores them: a head is ready
// (due at its next attempt time) or dead and stopping its key; the others of
// its queue are waiting.
const (
	Ready   = "ready"
	Waiting = "waiting"
	Dead    = "dead"
)

// Deliveries are deliveries to insert or update, as parallel slices: row i
// is (Seqs[i], Sinks[i], ...).
type Deliveries struct {
	Seqs   []int64
	Sinks  []string
	States []string
	// Stops: a dead letter that stops its key (it stays its queue's head).
	Stops    []bool
	Attempts []int32
	// NextAt is a ready delivery's next attempt; the zero time is now.
	NextAt []time.Time
	// LastErrors are the errors' texts, valid UTF-8 without NUL; NULL
	// (not Valid) when there is none.
	LastErrors []sql.NullString
}

// Add appends one delivery.
func (d *Deliveries) Add(seq int64, sink, state string, stops bool, attempts int32, next time.Time, lastError sql.NullString) {
	d.Seqs = append(d.Seqs, seq)
	d.Sinks = append(d.Sinks, sink)
	d.States = append(d.States, state)
	d.Stops = append(d.Stops, stops)
	d.Attempts = append(d.Attempts, attempts)
	d.NextAt = append(d.NextAt, next)
	d.LastErrors = append(d.LastErrors, lastError)
}

// CopyRow appends row i of from.
func (d *Deliveries) CopyRow(from *Deliveries, i int) {
	d.Add(from.Seqs[i], from.Sinks[i], from.States[i], from.Stops[i], from.Attempts[i], from.NextAt[i], from.LastErrors[i])
}

// Len is the number of deliveries.
func (d *Deliveries) Len() int { return len(d.Seqs) }

// Outcome is what recording a batch writes.
type Outcome struct {
	// OutboxSeqs are the batch's outbox rows: every one leaves the outbox.
	// OutboxKeys are their keys ("" for none), in the same order: when a
	// row cannot be removed (another transaction holds it locked), the
	// rows of its key stay too.
	OutboxSeqs []int64
	OutboxKeys []string
	// FromOutbox and FromRouting are deliveries to insert, the event
	// copied from its outbox row, or from its delivery on the routing
	// step. The delivery inserted as a queue's head (ready, or dead and
	// stopping its key) waits instead when the queue already has a head:
	// the database has the last word.
	FromOutbox, FromRouting Deliveries
	// DeleteSinks and DeleteSeqs are claimed deliveries to remove
	// (delivered, or routed from the routing step).
	DeleteSinks []string
	DeleteSeqs  []int64
	// Demote are claimed deliveries that stop being a head (written
	// first), Heads those that become or stay one (waiting instead when the
	// queue has another head).
	Demote, Heads Deliveries
	// PromoteKeys and PromoteSinks are the (key, sink) queues that may have
	// lost their head: each that has waiting deliveries and no head gets
	// its lowest waiting delivery as head, due at once.
	PromoteKeys, PromoteSinks []string
}

// Delete removes the claimed delivery of seq on sink.
func (o *Outcome) Delete(sink string, seq int64) {
	o.DeleteSinks = append(o.DeleteSinks, sink)
	o.DeleteSeqs = append(o.DeleteSeqs, seq)
}

// Happy reports whether the outcome only removes outbox rows: every sink
// took every event, and no delivery was claimed.
func (o *Outcome) Happy() bool {
	return o.FromOutbox.Len() == 0 && o.FromRouting.Len() == 0 && len(o.DeleteSeqs) == 0 &&
		o.Demote.Len() == 0 && o.Heads.Len() == 0 && len(o.PromoteKeys) == 0
}

// DataError is the database refusing a record because of the data it was
// given (a value out of range, a constraint), rather than because it could
// not run it: recording the batch event by event sets aside only the event
// at fault.
type DataError struct{ Err error }

func (e *DataError) Error() string { return e.Err.Error() }

// Unwrap returns the database's error.
func (e *DataError) Unwrap() error { return e.Err }

// StatKey is one row of the stats table: events published in a minute to a
// sink, of a topic (label).
type StatKey struct {
	Minute      time.Time
	Sink, Topic string
}

// Maintenance says what MaintainTables did, naming the tables.
type Maintenance struct {
	Vacuumed, Analyzed []string
	// HistoryLength is InnoDB's history list length on MySQL (undo records
	// not yet purged: claims slow down as it grows), 0 on PostgreSQL or
	// when it cannot be read.
	HistoryLength int64
}
