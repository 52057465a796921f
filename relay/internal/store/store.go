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
	"errors"
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
	// the newest, the lanes owner holds with their epochs, and the
	// database's clock. One round trip.
	Renew(ctx context.Context, owner, config string, lease time.Duration, paused []string) (LaneView, error)
	// ReleaseLanes gives back the lanes of mask that owner holds.
	ReleaseLanes(ctx context.Context, owner string, mask uint64) error
	// AcquireLanes takes, for lease, the lanes first to last (inclusive)
	// that no live relay holds, skipping those another relay is taking at
	// the same moment, each under a new epoch. It returns the lanes taken
	// with their epochs, and among them those taken over from an owner
	// whose lease had expired (it may have died with a batch in flight).
	AcquireLanes(ctx context.Context, owner string, lease time.Duration, first, last int) (acquired Leases, takenOver uint64, err error)
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
	// Record writes a batch's outcome in one transaction, fenced by
	// o.Fence: it writes only rows of the fence's lanes that owner still
	// holds under the epoch the fence names, so that an outcome of work
	// claimed under a lease that has since been lost (even if the lane came
	// back to owner later) changes nothing. The result says which lanes
	// were fenced out; when all were, nothing was written and the error is
	// ErrFenced. The outbox rows go (deleted, or with keepDone marked
	// done). A row another transaction holds locked is not waited for
	// long: the outcome is written without it, and the result lists it as
	// left (the engine claims it again later). An error of the database
	// refusing the data (a constraint, a value out of range) is a
	// *DataError.
	Record(ctx context.Context, owner string, o *Outcome, keepDone bool) (Recorded, error)

	// SinksWithDeliveries lists the sinks that have deliveries (any state,
	// any lane; "" is the routing step).
	SinksWithDeliveries(ctx context.Context) ([]string, error)
	// CountWaiting counts the deliveries of sink that are not dead
	// letters (any lane): what waits for it.
	CountWaiting(ctx context.Context, sink string) (int64, error)
	// QueuedSinks returns, of keys, those that have a queue (a head) on
	// some sink, with those sinks ("" is the routing step): an event read
	// from the write-ahead log joins its key's queues, as a claimed outbox
	// row does (Claimed.Queued).
	QueuedSinks(ctx context.Context, keys []string) (map[string][]string, error)
	// ReadSlot reports the log position named name (a replication slot,
	// CaptureWAL): how much log it keeps on the server and how far behind
	// it is. ErrNoSlot when there is none.
	ReadSlot(ctx context.Context, name string) (Slot, error)
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

// Capture is a stream of committed events read from the database's log
// rather than claimed from the outbox table (on PostgreSQL, the events
// outbox_emit wrote into the write-ahead log, read from a logical
// replication slot: relay/internal/walcapture). One reader reads a stream
// at a time; a new Capture resumes where the last one confirmed.
type Capture interface {
	// Prepare creates the stream's position (the slot) unless it exists:
	// what is written to the log before that is not read.
	Prepare(ctx context.Context) error
	// Run reads until ctx ends (nil) or the stream fails (an error).
	Run(ctx context.Context) error
	// Arrived is signalled when events arrive to be taken.
	Arrived() <-chan struct{}
	// Take removes and returns at most max events, in commit order.
	Take(max int) []LogEvent
	// Settled says that the events of the oldest Take not yet settled
	// are delivered, dead-lettered or written to the deliveries table:
	// the stream may be confirmed past every transaction all of whose
	// events are settled. Takes are settled in their order.
	Settled()
	// Lag returns the commit time of the oldest event read and not
	// settled (zero when none), and the position last confirmed.
	Lag() (oldest time.Time, confirmed uint64)
}

// Slot is a replication slot's state (Store.ReadSlot).
type Slot struct {
	Active bool
	// RetainedBytes is the log the slot keeps on the server's disk;
	// BehindBytes how far its confirmed position is behind the log's end.
	RetainedBytes, BehindBytes int64
	// WALStatus is the server's word on the retained log ("lost": the
	// slot can no longer be read).
	WALStatus string
}

// ErrNoSlot is a slot that does not exist.
var ErrNoSlot = errors.New("no such replication slot")

// LogEvent is an event read from the database's log.
type LogEvent struct {
	Event
	// CommitTime is when its transaction committed.
	CommitTime time.Time
}

// LaneView is what Renew found.
type LaneView struct {
	// Live counts the live relays running the newest configuration; Rank
	// how many of them sort before the owner by name.
	Live, Rank int
	// Current: the owner runs the newest configuration.
	Current bool
	// Held are the lanes the owner holds, renewed.
	Held Leases
	// Now is the database's clock when it renewed them.
	Now time.Time
}

// Leases are lanes held by one owner, each under the epoch of its
// acquisition: a number the lanes table raises every time a lane changes
// hands, and never while one owner keeps renewing it. Work claimed under a
// lease is recorded only while that same lease lasts (Outcome.Fence).
type Leases struct {
	// Mask has bit 1<<lane set for each lane held.
	Mask uint64
	// Epochs[lane] is the lane's epoch, for the lanes in Mask.
	Epochs [Lanes]int64
}

// Add sets lane, under epoch.
func (l *Leases) Add(lane int, epoch int64) {
	l.Mask |= 1 << uint(lane)
	l.Epochs[lane] = epoch
}

// Only returns the leases of l in the lanes of mask.
func (l Leases) Only(mask uint64) Leases {
	l.Mask &= mask
	return l
}

// Same reports whether lane is in both l and m under the same epoch.
func (l *Leases) Same(m *Leases, lane int) bool {
	bit := uint64(1) << uint(lane)
	return l.Mask&bit != 0 && m.Mask&bit != 0 && l.Epochs[lane] == m.Epochs[lane]
}

// Recorded is what a Record wrote, beyond the outcome itself.
type Recorded struct {
	// Left lists outbox rows left in place because another transaction
	// held them locked.
	Left []int64
	// Fenced are the lanes of the outcome's fence that owner no longer
	// held under the fence's epoch: nothing of them was written.
	Fenced uint64
}

// ClaimParams say what one claim reads: up to Rows due outbox rows of the
// lanes in Lanes, in seq order, and, when QueueSinks is not nil, from each
// queue in QueueSinks ("" is the routing step; the earlier first when bytes
// run short) up to QueueHeads[i] due heads of those lanes, oldest due
// first, each followed by the deliveries waiting behind it: QueueRows[i]
// rows at most for the sink, shared evenly between its heads (each head
// gets ceil(QueueRows[i] / heads found) rows at most, itself included), so
// that a queue drains over as many keys at once as it has, not one key's
// backlog at a time, and at most QueueChain[i] rows a head (at least 1), so
// that a sink sending a key's events one after another answers them
// within its call. Both reads go in one round trip.
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
	// After, when not zero, claims only the rows that come after it in
	// the claim's order (available_at, seq): the walk of the claim index
	// starts there instead of at its beginning, past the entries of the
	// rows delivered since (dead until a vacuum), which a long backlog's
	// drain would otherwise walk at every claim.
	After Position

	QueueSinks []string
	QueueHeads []int32
	QueueRows  []int32
	QueueChain []int32
}

// Position is a place in the claim's order of outbox rows.
type Position struct {
	AvailableAt time.Time
	Seq         int64
}

// IsZero reports whether p is no position: the beginning.
func (p Position) IsZero() bool { return p.Seq == 0 && p.AvailableAt.IsZero() }

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
	// AvailableAt is an outbox row's available_at (zero for a delivery).
	AvailableAt time.Time
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
	// Delays are when a ready delivery is due: this long after the
	// database's clock (0 is now). The database's clock, not the relay's:
	// the relay's host may be minutes off, and the time is compared there.
	Delays []time.Duration
	// LastErrors are the errors' texts, valid UTF-8 without NUL; NULL
	// (not Valid) when there is none.
	LastErrors []sql.NullString
}

// Add appends one delivery.
func (d *Deliveries) Add(seq int64, sink, state string, stops bool, attempts int32, delay time.Duration, lastError sql.NullString) {
	d.Seqs = append(d.Seqs, seq)
	d.Sinks = append(d.Sinks, sink)
	d.States = append(d.States, state)
	d.Stops = append(d.Stops, stops)
	d.Attempts = append(d.Attempts, attempts)
	d.Delays = append(d.Delays, delay)
	d.LastErrors = append(d.LastErrors, lastError)
}

// CopyRow appends row i of from.
func (d *Deliveries) CopyRow(from *Deliveries, i int) {
	d.Add(from.Seqs[i], from.Sinks[i], from.States[i], from.Stops[i], from.Attempts[i], from.Delays[i], from.LastErrors[i])
}

// Len is the number of deliveries.
func (d *Deliveries) Len() int { return len(d.Seqs) }

// Outcome is what recording a batch writes.
type Outcome struct {
	// Fence are the lanes the outcome's rows were claimed in, under the
	// epochs they were claimed with: only rows of those lanes are written,
	// and only while the owner still holds them under those epochs.
	Fence Leases
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
	// FromEvents are deliveries to insert for events that have no row:
	// read from the write-ahead log (capture: wal), their columns in
	// Events (each event once, whatever its number of deliveries). Heads
	// wait instead as FromOutbox's do.
	FromEvents Deliveries
	Events     []Event
	// DeleteSinks and DeleteSeqs are claimed deliveries to remove
	// (delivered, or routed from the routing step).
	DeleteSinks []string
	DeleteSeqs  []int64
	// Demote are claimed deliveries that stop being a head (written
	// first), Heads those that become or stay one (waiting instead when the
	// queue has another head). A head written without an error keeps the
	// one it had.
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
	return o.FromOutbox.Len() == 0 && o.FromRouting.Len() == 0 && o.FromEvents.Len() == 0 && len(o.DeleteSeqs) == 0 &&
		o.Demote.Len() == 0 && o.Heads.Len() == 0 && len(o.PromoteKeys) == 0
}

// ErrFenced is a record that wrote nothing: the owner no longer held any
// lane of its fence under the fence's epoch.
var ErrFenced = errors.New("fenced: the lanes changed hands since the work was claimed")

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
	// MySQL: the store is MySQL's, and HistoryLength is InnoDB's history
	// list length (undo records not yet purged: claims slow down as it
	// grows), 0 when it cannot be read.
	MySQL         bool
	HistoryLength int64
}
