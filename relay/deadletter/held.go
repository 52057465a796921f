package deadletter

import (
	"context"
	"fmt"
	"time"
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

// HeldKeys returns at most limit keys held back on some sink by a failing
// or dead head (one entry per key and sink), those with the most
// deliveries waiting behind first, then the oldest.
func (s *Store) HeldKeys(ctx context.Context, limit int) ([]HeldKey, error) {
	if limit <= 0 {
		return nil, &InputError{"limit", fmt.Sprintf("must be positive, got %d", limit)}
	}
	rows, err := s.db.HeldKeys(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the held keys of %s: %w", s.outbox, err)
	}
	out := make([]HeldKey, len(rows))
	for i, h := range rows {
		out[i] = HeldKey(h)
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
	if key == "" {
		return map[string][]KeyDelivery{}, nil // events without a key are queues of their own
	}
	queues, err := s.db.KeyQueues(ctx, key, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the queues of key %q in %s: %w", truncate(key, 60), s.outbox, err)
	}
	out := make(map[string][]KeyDelivery, len(queues))
	for sink, q := range queues {
		ds := make([]KeyDelivery, len(q))
		for i, d := range q {
			ds[i] = KeyDelivery(d)
		}
		out[sink] = ds
	}
	return out, nil
}
