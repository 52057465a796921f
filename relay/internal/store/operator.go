package store

import (
	"context"
	"strings"
	"time"
)

// Operator is the database as operators use it (relay/deadletter): list,
// count, show, replay and purge dead letters, drop a sink's queue, and read
// the figures of the status, the backlog and the held keys. Each database's
// store implements it beside its Store, in its own SQL, so that every
// statement that changes the queues (the relay's records and the
// operators' replays, purges and drops) lives in one package per database
// and keeps the queues' invariant the same way: in the deliveries table,
// every key that has deliveries waiting on a sink has exactly one head
// there, a delivery in state ready or a dead letter that stops its key.
//
// Validating filters, paging and the assembly of what the operations
// return are the caller's; each method is one short transaction, or one
// statement, of its own. Writes (ReplayDeadLetters, PurgeDeadLetters,
// DropQueue) first lock every lane in lane order, the order relays lock
// theirs for a record, so that a batch and a relay's record never
// interleave, give the queues they changed their heads, and wake the
// relays, all in one transaction.
type Operator interface {
	// DeadLetters returns at most limit dead letters matching f after p in
	// (seq, sink) order, or before p in descending order when newest.
	DeadLetters(ctx context.Context, f DeadLetterFilter, p DeadLetterPosition, limit int, newest bool) ([]DeadLetter, error)
	// CountDeadLetters counts the dead letters matching f, no further than
	// limit when it is positive.
	CountDeadLetters(ctx context.Context, f DeadLetterFilter, limit int64) (int64, error)
	// ShowEvent reads the event id (a UUID in canonical form) from the
	// outbox and its deliveries, from one snapshot.
	ShowEvent(ctx context.Context, id string) (ShownEvent, error)
	// ReplayDeadLetters replays the next n dead letters matching f after
	// p: each rejoins its key's queue on its sink, attempts reset, or, with
	// allSinks, its event goes back to the routing step unless it is still
	// queued on a sink (Taken.Queued).
	ReplayDeadLetters(ctx context.Context, f DeadLetterFilter, p DeadLetterPosition, n int, allSinks bool) ([]Taken, error)
	// PurgeDeadLetters deletes the next n dead letters matching f after p.
	PurgeDeadLetters(ctx context.Context, f DeadLetterFilter, p DeadLetterPosition, n int) ([]Taken, error)
	// DropQueue deletes the next n deliveries of sink (any state) after
	// seq, in seq order.
	DropQueue(ctx context.Context, sink string, after int64, n int) ([]Taken, error)
	// QueueSize counts the deliveries of sink, in any state.
	QueueSize(ctx context.Context, sink string) (int64, error)
	// Now reads the database's clock, the one dead_at is written with.
	Now(ctx context.Context) (time.Time, error)
	// StatusRows reads what a status sums up.
	StatusRows(ctx context.Context) (*StatusRows, error)
	// Totals reads the backlog's totals.
	Totals(ctx context.Context) (Totals, error)
	// HeldKeys returns at most limit heads (one per key and sink) that
	// failed at least once or stop their key, those with the most
	// deliveries behind them first, then the oldest.
	HeldKeys(ctx context.Context, limit int) ([]HeldKey, error)
	// KeyQueues returns key's queues by sink: the head, then the
	// deliveries behind it in seq order, at most limit per sink, from one
	// snapshot.
	KeyQueues(ctx context.Context, key string, limit int) (map[string][]KeyDelivery, error)
}

// DeadLetterFilter selects dead letters; zero fields select everything
// (relay/deadletter's Filter, validated: IDs are UUIDs).
type DeadLetterFilter struct {
	IDs   []string
	Topic string
	Key   string
	Sink  string
	Error string
	// Since and Until bound dead_at: at or after Since, before Until.
	Since, Until time.Time
	// OlderThan selects dead letters that died more than this long ago on
	// the database's clock.
	OlderThan time.Duration
}

// DeadLetterPosition is a place in the (seq, sink) order of dead letters.
type DeadLetterPosition struct {
	Seq  int64
	Sink string
	// WholeSeq: the position is after every dead letter of Seq (before
	// every one, going from the newest); Sink is not compared.
	WholeSeq bool
}

// DeadLetter is one dead delivery as a listing reads it.
type DeadLetter struct {
	Seq       int64
	ID        string
	Topic     string
	Key       string
	Sink      string
	Attempts  int
	CreatedAt time.Time
	DiedAt    time.Time
	LastError string
	StopsKey  bool
}

// Taken is a delivery a replay, purge or drop took.
type Taken struct {
	Sink string
	Seq  int64
	ID   string
	// Key is nil for an event without one.
	Key      *string
	StopsKey bool
	// Queued: the event has a delivery on a sink that is not dead (read
	// by a replay with allSinks only).
	Queued bool
}

// ShownEvent is an event as ShowEvent read it: from its outbox row when
// it has one (OutboxStatus set), else from one of its deliveries.
type ShownEvent struct {
	// OutboxStatus is the outbox row's status, "" without one.
	OutboxStatus string
	Seq          int64
	ID           string
	Topic        string
	Key          string
	ContentType  string
	Columns      EventColumns
	CreatedAt    time.Time
	// AvailableAt and FinishedAt are the outbox row's, zero without one
	// (or, for FinishedAt, when not done).
	AvailableAt, FinishedAt time.Time
	// Deliveries are the event's deliveries by sink.
	Deliveries map[string]ShownDelivery
}

// EventColumns are an event's stored columns, NULL as nil.
type EventColumns struct {
	// Payload is the JSON payload column's text, PayloadBin the binary
	// column.
	Payload     *string
	PayloadBin  []byte
	Headers     []byte
	MaxAttempts *int32
}

// ShownDelivery is one delivery of a shown event.
type ShownDelivery struct {
	State    string
	Attempts int
	Error    string
	NextAt   time.Time
	QueuedAt time.Time
	DeadAt   time.Time
	StopsKey bool
	// Head is, for a waiting delivery, the head of its queue; nil for
	// any other.
	Head *ShownHead
}

// ShownHead is the head a waiting delivery waits behind.
type ShownHead struct {
	Seq   int64
	ID    string
	State string
}

// StatusRows are what a status is summed up from: per topic, per (sink,
// topic) and per relay, few rows however many events wait.
type StatusRows struct {
	// At is the database's time.
	At        time.Time
	Pending   []PendingRow
	Queues    []QueueRow
	Published []PublishedRow
	Relays    []RelayRow
}

// PendingRow is the pending events of a topic, with the creation time of
// the oldest one due (zero when none is).
type PendingRow struct {
	Topic  string
	N      int64
	Oldest time.Time
}

// QueueRow is the deliveries of a topic on a sink: queued (with the oldest
// event's creation time, zero when none), dead (DeadLastMinute of them in
// the last 60 seconds), and retrying: heads waiting for another attempt.
type QueueRow struct {
	Sink, Topic              string
	Queued, Dead             int64
	DeadLastMinute, Retrying int64
	Oldest                   time.Time
}

// PublishedRow estimates a sink and topic pattern's deliveries in the
// last 60 seconds, from the per-minute counts.
type PublishedRow struct {
	Sink, Topic string
	N           float64
}

// RelayRow is one live claim loop (a relays table row).
type RelayRow struct {
	Owner   string
	Started time.Time
	Config  string
	// Since is zero when unknown (announced by a relay from before the
	// column).
	Since time.Time
	// Paused are the sinks it holds paused.
	Paused []string
	// Claiming: it runs the newest live configuration.
	Claiming bool
	// Lanes are the lanes it holds (leases not expired), in order.
	Lanes []int16
}

// Totals are the backlog's totals: the oldest times are zero when there is
// none.
type Totals struct {
	Pending, Queued, Dead       int64
	OldestPending, OldestQueued time.Time
	// Now is the database's time.
	Now time.Time
}

// HeldKey is a key held back on a sink by its head.
type HeldKey struct {
	Sink, Key, Topic string
	HeadID           string
	HeadSeq          int64
	HeadState        string
	Attempts         int
	LastError        string
	NextAt           time.Time
	// Since is when the head was queued (or died).
	Since time.Time
	// Behind counts the deliveries waiting behind the head.
	Behind int64
}

// KeyDelivery is one member of a key's queue on a sink.
type KeyDelivery struct {
	Seq      int64
	ID       string
	Topic    string
	State    string
	Attempts int
	Error    string
	NextAt   time.Time
	QueuedAt time.Time
	DeadAt   time.Time
}

// RoutingStep is the sink name of the routing step's queue.
const RoutingStep = ""

// Queues is a set of queues, (key, sink) pairs: those a change may have
// left without a head.
type Queues map[[2]string]bool

// Add adds the queue of key (none when nil) on sink.
func (q Queues) Add(key *string, sink string) {
	if key != nil {
		q[[2]string{*key, sink}] = true
	}
}

// Split returns the queues' keys and sinks, in the same order.
func (q Queues) Split() (keys, sinks []string) {
	keys, sinks = make([]string, 0, len(q)), make([]string, 0, len(q))
	for p := range q {
		keys = append(keys, p[0])
		sinks = append(sinks, p[1])
	}
	return keys, sinks
}

// The queues an operator's batch changes, which it gives their heads
// before it commits. The stores share them: what a replay, purge or drop
// does to a queue is the same on every database.

// ReplayedQueues returns the queues a replayed batch changes and the seqs
// of the events that go back to the routing step (allSinks, and not queued
// on a sink): a dead letter replayed on its own sink rejoins its queue
// there; an event sent to the routing step joins its key's queue there and
// its dead letters on the sinks go, which can free their queues too (the
// store adds those as it deletes them).
func ReplayedQueues(batch []Taken, allSinks bool) (Queues, []int64) {
	var (
		routeSeqs []int64
		routed    = map[int64]bool{}
		queues    = Queues{}
	)
	for _, x := range batch {
		switch {
		case !allSinks || x.Queued:
			queues.Add(x.Key, x.Sink)
		case !routed[x.Seq]:
			routed[x.Seq] = true
			routeSeqs = append(routeSeqs, x.Seq)
			queues.Add(x.Key, RoutingStep)
		}
	}
	return queues, routeSeqs
}

// PurgedQueues returns the queues a purged batch lets move on: those its
// dead letters stopped.
func PurgedQueues(batch []Taken) Queues {
	queues := Queues{}
	for _, x := range batch {
		if x.StopsKey {
			queues.Add(x.Key, x.Sink)
		}
	}
	return queues
}

// DroppedQueues returns the queues a dropped batch cut into: every key's
// on the sink.
func DroppedQueues(batch []Taken) Queues {
	queues := Queues{}
	for _, x := range batch {
		queues.Add(x.Key, x.Sink)
	}
	return queues
}

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
