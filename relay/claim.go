package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// event is one event as the relay carries it through a batch, read from an
// outbox row or from a delivery.
type event struct {
	seq         int64
	id          string
	topic       string
	key         string
	lane        int16
	payload     []byte
	contentType string
	headers     map[string]string
	createdAt   time.Time
	availableAt time.Time // an outbox row's: where the next claim may start
	maxAttempts int       // 0: the relay's default
	decodeErr   error     // a column the relay cannot read: the event is dead-lettered
}

// item is one claimed piece of work: an outbox row, or a delivery waiting
// in a sink's queue (the routing step's included).
type item struct {
	event
	// delivery is set for a delivery, with sink naming its queue ("" for
	// the routing step); an outbox row has neither.
	delivery bool
	sink     string
	// head: the delivery is its queue's head (the others were claimed
	// behind it); chainAt is its place in the chain claimed from the
	// queue (1: the head).
	head    bool
	chainAt int32
	// attempts spent on sink so far.
	attempts int
	// queued lists, for an outbox row or a routing-step delivery, the sinks
	// on which its key has a queue: the event joins them.
	queued []string
	// elsewhere lists, for a routing-step delivery, the sinks on which the
	// event already has a delivery: routing it again leaves them out.
	elsewhere []string
	// logged is set for an event read from the database's log
	// (CaptureWAL): it has no outbox row, and a delivery of it is written
	// from these columns.
	logged *store.Event
}

// claimLimits bound what one claim loads.
type claimLimits struct {
	// rows is the most outbox rows, and the most deliveries per sink.
	rows int
	// bytes is the most payload bytes in all (an event larger than that
	// comes alone), shared between the outbox rows and the deliveries
	// when both are claimed.
	bytes int64
	// eventBytes is the largest payload loaded: a larger one is left in
	// the database, and its event comes with an error saying why.
	eventBytes int64
}

// claim reads up to limit.rows due outbox rows of the lanes in mask, after
// the position after in (available_at, seq) order (zero: from the start),
// and, unless queues is nil, the due heads of those lanes and the
// deliveries waiting behind them that queues says. Outbox rows in skip are
// left out. Both reads go in one round trip. An empty mask claims nothing.
func (s *session) claim(ctx context.Context, mask uint64, limit claimLimits, after store.Position, queues *queueClaim, skip []int64) (fresh, queued []item, err error) {
	if mask == 0 {
		return nil, nil, nil
	}
	p := store.ClaimParams{Config: s.config, Lanes: mask, Rows: limit.rows, Bytes: limit.bytes, EventBytes: limit.eventBytes, Skip: skip, After: after}
	if queues != nil {
		p.Bytes /= 2 // half for new events, half for queued deliveries
		p.QueueSinks, p.QueueHeads, p.QueueRows, p.QueueChain = queues.sinks, queues.heads, queues.rows, queues.chain
	}
	rows, deliveries, err := s.store.Claim(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	return items(rows, limit), items(deliveries, limit), nil
}

// items reads claimed rows into items, deciding what the relay makes of
// their columns: the payload and its content type, the headers, and which
// events cannot be carried (their decodeErr says why).
func items(rows []store.Claimed, limit claimLimits) []item {
	if rows == nil {
		return nil
	}
	out := make([]item, len(rows))
	var chainAt int32
	for i := range rows {
		c := &rows[i]
		it := &out[i]
		it.event = event{seq: c.Seq, id: c.ID, topic: c.Topic, key: c.Key, lane: c.Lane, maxAttempts: c.MaxAttempts, availableAt: c.AvailableAt}
		it.delivery, it.sink, it.head, it.attempts, it.queued, it.elsewhere = c.Delivery, c.Sink, c.Head, c.Attempts, c.Queued, c.Elsewhere
		if c.Delivery {
			// A claim brings each head before the deliveries behind it.
			if c.Head {
				chainAt = 0
			}
			chainAt++
			it.chainAt = chainAt
		}
		switch {
		case c.PayloadBytes > limit.eventBytes:
			it.decodeErr = fmt.Errorf("its payload is %d bytes, more than relay.max_event_bytes (%d): left unloaded", c.PayloadBytes, limit.eventBytes)
		case c.PayloadBin != nil:
			it.payload = c.PayloadBin
			it.contentType = "application/octet-stream"
		case c.Payload != nil:
			it.payload = c.Payload
			it.contentType = "application/json"
		default:
			it.payload = []byte("null")
			it.contentType = "application/json"
		}
		if c.ContentType != "" {
			it.contentType = c.ContentType
		}
		if len(c.Headers) > 2 {
			it.headers, it.decodeErr = decodeHeaders(c.Headers)
		}
		var err error
		if it.createdAt, err = createdTime(c.CreatedAt, c.CreatedAtErr); err != nil && it.decodeErr == nil {
			it.decodeErr = err
		}
		if it.delivery && it.sink == "" {
			// The routing step's own queue is the one it is in.
			it.queued = slices.DeleteFunc(it.queued, func(s string) bool { return s == "" })
		}
	}
	return out
}

// createdTime checks the created_at column (read as t, or unreadable with
// err). Sinks carry it (a Kafka record's timestamp, a webhook envelope's
// JSON) and operators list it: it must be an actual time, of years 1 to
// 9999. The schema refuses other values at INSERT (migration 006 on
// PostgreSQL); a row written before that is dead-lettered with the reason.
func createdTime(t time.Time, err error) (time.Time, error) {
	switch {
	case err != nil:
		return time.Time{}, err
	case t.Year() < 1 || t.Year() > 9999:
		return time.Time{}, fmt.Errorf("created_at %s is outside years 1 to 9999", t.Format(time.RFC3339))
	}
	return t, nil
}

// decodeHeaders reads the headers column: a JSON object whose values are
// strings; other values (written by hand) are kept as their JSON text.
func decodeHeaders(raw []byte) (map[string]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("headers column: %w", err)
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out, nil
}
