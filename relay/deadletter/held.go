package deadletter

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/relay/internal/queue"
)

// HeldKey is a key held back on one sink: the head of its queue there is
// failing (waiting to retry after at least one attempt) or dead and
// stopping the key. A head that waits only because its sink is paused (no
// attempt spent) is not listed: the sink's state says that, for all its keys.
type HeldKey struct {
	Sink  string `json:"sink"`
	Key   string `json:"key"`
	Topic string `json:"topic"` // the head's topic
	// HeadID and HeadSeq name the head: the delivery the key waits on.
	HeadID  string `json:"head_id"`
	HeadSeq int64  `json:"head_seq"`
	// HeadState is StateReady (due at NextAt for its next attempt) or
	// StateDead (a dead letter stopping the key until it is replayed or
	// purged).
	HeadState string `json:"head_state"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error"`
	// NextAt is when a ready head is tried again; zero for a dead one.
	NextAt time.Time `json:"next_at,omitzero"`
	// Since is when the head was queued (or died).
	Since time.Time `json:"since"`
	// Behind counts the deliveries of the key waiting behind the head on
	// that sink.
	Behind int64 `json:"behind"`
}

// KeyDelivery is one of a key's deliveries waiting (or dead) in a sink's
// queue, in queue order: the head first (StateReady, or StateDead when it
// stops the key), then those waiting behind it (StateWaiting).
type KeyDelivery struct {
	Seq      int64  `json:"seq"`
	ID       string `json:"id"`
	Topic    string `json:"topic"`
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error,omitempty"`
	// NextAt is when a ready head is due.
	NextAt time.Time `json:"next_at,omitzero"`
	// QueuedAt is when the delivery joined the queue.
	QueuedAt time.Time `json:"queued_at"`
	// DeadAt is when a dead head died.
	DeadAt time.Time `json:"dead_at,omitzero"`
}

func (s *Store) initHeld() {
	dl := s.tables.Deliveries()
	// The heads (head_idx: one per key and sink) that have failed at least
	// once or stop their key, each with the number of deliveries behind it:
	// the members of its queue but itself, counted on the queue index
	// alone (an index-only scan: testing state = 'waiting' instead would
	// read every waiting row, ten times the buffers on 100,000 of them).
	// Every failing head's queue is counted before the sort: "most behind
	// first" needs all of them; their number is that of keys whose head
	// fails, not of events.
	s.heldKeysSQL = `SELECT d.sink, d.key, d.topic, d.id::text, d.seq, d.state, d.attempts, coalesce(d.last_error, ''),
       d.next_at, CASE WHEN d.state = 'dead' THEN d.dead_at ELSE d.queued_at END AS since, b.n
FROM ` + dl + ` d
CROSS JOIN LATERAL (
    SELECT count(*) - 1 AS n FROM ` + dl + ` w
    WHERE w.key = d.key AND w.sink = d.sink AND ` + queue.On(queue.Member, "w") + `
) b
WHERE d.key IS NOT NULL AND ` + queue.Head + ` AND (d.attempts > 0 OR d.stops_key)
ORDER BY b.n DESC, since, d.sink, d.key
LIMIT $1`
	// A key's queues: its heads (one per sink, head_idx), then for each
	// the first $2 members of the queue in seq order (queue_idx), which
	// never reads further into a long queue than the limit.
	s.keyQueuesSQL = `SELECT h.sink, q.seq, q.id::text, q.topic, q.state, q.attempts, coalesce(q.last_error, ''),
       q.next_at, q.queued_at, q.dead_at
FROM ` + dl + ` h
CROSS JOIN LATERAL (
    SELECT d.seq, d.id, d.topic, d.state, d.attempts, d.last_error, d.next_at, d.queued_at, d.dead_at
    FROM ` + dl + ` d
    WHERE d.key = h.key AND d.sink = h.sink AND ` + queue.Member + `
    ORDER BY d.seq LIMIT $2
) q
WHERE h.key = $1 AND ` + queue.On(queue.Head, "h") + `
ORDER BY h.sink, q.seq`
}

// HeldKeys returns at most limit keys held back on some sink by a failing
// or dead head (one entry per key and sink), those with the most
// deliveries waiting behind first, then the oldest.
func (s *Store) HeldKeys(ctx context.Context, limit int) ([]HeldKey, error) {
	if limit <= 0 {
		return nil, &InputError{"limit", fmt.Sprintf("must be positive, got %d", limit)}
	}
	out := []HeldKey{}
	err := s.inPlan(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.heldKeysSQL, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				h           HeldKey
				attempts    int32
				next, since pgtype.Timestamptz
			)
			if err := rows.Scan(&h.Sink, &h.Key, &h.Topic, &h.HeadID, &h.HeadSeq, &h.HeadState, &attempts,
				&h.LastError, &next, &since, &h.Behind); err != nil {
				return err
			}
			h.Attempts, h.NextAt, h.Since = int(attempts), jsonTime(next), jsonTime(since)
			out = append(out, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("reading the held keys of %s: %w", s.tables.Outbox(), err)
	}
	return out, nil
}

// KeyQueues returns key's queues by sink ("" is the routing step): the
// head, then the deliveries waiting behind it in seq order, at most limit
// per sink. Sinks where the key has no queue are absent; so are its dead
// letters that do not stop it (they left the queue).
func (s *Store) KeyQueues(ctx context.Context, key string, limit int) (map[string][]KeyDelivery, error) {
	if limit <= 0 {
		return nil, &InputError{"limit", fmt.Sprintf("must be positive, got %d", limit)}
	}
	out := map[string][]KeyDelivery{}
	if key == "" {
		return out, nil // events without a key are queues of their own
	}
	err := s.inPlan(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.keyQueuesSQL, key, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				sink               string
				d                  KeyDelivery
				attempts           int32
				next, queued, dead pgtype.Timestamptz
			)
			if err := rows.Scan(&sink, &d.Seq, &d.ID, &d.Topic, &d.State, &attempts, &d.Error, &next, &queued, &dead); err != nil {
				return err
			}
			d.Attempts, d.NextAt, d.QueuedAt, d.DeadAt = int(attempts), jsonTime(next), jsonTime(queued), jsonTime(dead)
			out[sink] = append(out[sink], d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("reading the queues of key %q in %s: %w", truncate(key, 60), s.tables.Outbox(), err)
	}
	return out, nil
}

// inPlan runs fn in a short read transaction planned to stay on the
// indexes, as a page of dead letters is (see pagePlanSQL): the deliveries
// table's statistics may be those of an empty table.
func (s *Store) inPlan(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.inPage(ctx, Filter{}, fn)
}
