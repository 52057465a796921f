package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	maxAttempts int   // 0: the relay's default
	decodeErr   error // a column the relay cannot read: the event is dead-lettered
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
	// behind it).
	head bool
	// attempts spent on sink so far.
	attempts int
	// queued lists, for an outbox row or a routing-step delivery, the sinks
	// on which its key has a queue: the event joins them.
	queued []string
	// elsewhere lists, for a routing-step delivery, the sinks on which the
	// event already has a delivery: routing it again leaves them out.
	elsewhere []string
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

// claim reads up to limit.rows due outbox rows of the lanes in mask, in seq
// order, and, unless queueSinks is nil, from each queue sink in queueSinks
// (the earlier first, when bytes run short) up to its queueHeads due heads
// of those lanes, each followed by its waiting deliveries, queueRows rows at
// most per sink. Outbox
// rows in skip are left out. Both reads go in one round trip. An empty mask
// claims nothing.
func (s *store) claim(ctx context.Context, mask uint64, limit claimLimits, queueSinks []string, queueHeads []int32, queueRows int, skip []int64) (fresh, queued []item, err error) {
	if mask == 0 {
		return nil, nil, nil
	}
	lowest, highest := bits.TrailingZeros64(mask), laneCount-1-bits.LeadingZeros64(mask)
	if skip == nil {
		skip = []int64{}
	}
	bytes := limit.bytes
	if queueSinks != nil {
		bytes /= 2
	}
	b := &pgx.Batch{}
	b.Queue(s.planSQL)
	b.Queue(s.claimSQL, int64(mask), limit.rows, lowest, highest, skip, limit.eventBytes, bytes, s.config)
	if queueSinks != nil {
		b.Queue(s.claimQueueSQL, queueSinks, int64(mask), lowest, highest, queueHeads, limit.eventBytes, bytes, s.config, queueRows)
	}
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	if fresh, err = readItems(br, limit, false); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	if queueSinks != nil {
		if queued, err = readItems(br, limit, true); err != nil {
			return nil, nil, fmt.Errorf("claiming queued deliveries: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	return fresh, queued, nil
}

// readItems reads the next result of a claim batch: outbox rows, or (with
// deliveries) deliveries, which have more columns.
func readItems(br pgx.BatchResults, limit claimLimits, deliveries bool) ([]item, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]item, 0, limit.rows)
	var (
		id                  pgtype.UUID
		key, contentType    pgtype.Text
		payload, payloadBin []byte
		headers             []byte
		maxAttempts         pgtype.Int4
		attempts            int32
		payloadBytes        int32
		createdAt           pgtype.Timestamptz
	)
	for rows.Next() {
		it := item{delivery: deliveries}
		dest := []any{&it.seq, &id, &it.topic, &key, &payload, &payloadBin, &contentType, &headers,
			&createdAt, &maxAttempts, &it.lane, &it.queued, &payloadBytes}
		if deliveries {
			dest = append(dest, &it.sink, &attempts, &it.head, &it.elsewhere)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("reading a claimed event: %w", err)
		}
		it.id, it.key, it.maxAttempts, it.attempts = uuidString(id), key.String, int(maxAttempts.Int32), int(attempts)
		switch {
		case int64(payloadBytes) > limit.eventBytes:
			it.decodeErr = fmt.Errorf("its payload is %d bytes, more than relay.max_event_bytes (%d): left unloaded", payloadBytes, limit.eventBytes)
		case payloadBin != nil:
			it.payload = payloadBin
			it.contentType = "application/octet-stream"
		case payload != nil:
			it.payload = payload
			it.contentType = "application/json"
		default:
			it.payload = []byte("null")
			it.contentType = "application/json"
		}
		if contentType.Valid && contentType.String != "" {
			it.contentType = contentType.String
		}
		if len(headers) > 2 {
			it.headers, it.decodeErr = decodeHeaders(headers)
		}
		if it.createdAt, err = createdTime(createdAt); err != nil && it.decodeErr == nil {
			it.decodeErr = err
		}
		if it.delivery && it.sink == "" {
			// The routing step's own queue is the one it is in.
			it.queued = slices.DeleteFunc(it.queued, func(s string) bool { return s == "" })
		}
		out = append(out, it)
	}
	return out, rows.Err()
}

// createdTime reads the created_at column. Sinks carry it (a Kafka record's
// timestamp, a webhook envelope's JSON) and operators list it: it must be
// an actual time, of years 1 to 9999. Migration 006 refuses other values at
// INSERT; a row written before that is dead-lettered with the reason.
func createdTime(t pgtype.Timestamptz) (time.Time, error) {
	switch {
	case t.InfinityModifier != pgtype.Finite:
		return time.Time{}, errors.New("created_at is infinity or -infinity, not a time")
	case t.Time.Year() < 1 || t.Time.Year() > 9999:
		return time.Time{}, fmt.Errorf("created_at %s is outside years 1 to 9999", t.Time.Format(time.RFC3339))
	}
	return t.Time, nil
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

func uuidString(u pgtype.UUID) string {
	const hex = "0123456789abcdef"
	b := u.Bytes
	buf := make([]byte, 36)
	j := 0
	for i := 0; i < 16; i++ {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			buf[j] = '-'
			j++
		}
		buf[j], buf[j+1] = hex[b[i]>>4], hex[b[i]&0xf]
		j += 2
	}
	return string(buf)
}
