package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Claim implements store.Store: after planSQL, the outbox claim and, with
// queue sinks, the queue claim, in one round trip.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (fresh, queued []store.Claimed, err error) {
	// The lane range, lowest to highest lane held, is tested on the claim
	// index's entries; the mask, exactly, on the rows.
	lowest, highest := bits.TrailingZeros64(p.Lanes), store.Lanes-1-bits.LeadingZeros64(p.Lanes)
	skip := p.Skip
	if skip == nil {
		skip = []int64{}
	}
	b := &pgx.Batch{}
	b.Queue(s.sql.planSQL)
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	if !p.After.IsZero() {
		after = pgtype.Timestamptz{Time: p.After.AvailableAt, Valid: true}
	}
	b.Queue(s.sql.claimSQL, int64(p.Lanes), p.Rows, lowest, highest, skip, p.EventBytes, p.Bytes, p.Config, after, p.After.Seq)
	if p.QueueSinks != nil {
		b.Queue(s.sql.claimQueueSQL, p.QueueSinks, int64(p.Lanes), lowest, highest, p.QueueHeads, p.EventBytes, p.Bytes, p.Config, p.QueueRows, p.QueueChain)
	}
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	if fresh, err = readClaimed(br, p.Rows, false); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	if p.QueueSinks != nil {
		if queued, err = readClaimed(br, p.Rows, true); err != nil {
			return nil, nil, fmt.Errorf("claiming queued deliveries: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	return fresh, queued, nil
}

// readClaimed reads the next result of a claim batch: outbox rows, or (with
// deliveries) deliveries, which have more columns.
func readClaimed(br pgx.BatchResults, rows int, deliveries bool) ([]store.Claimed, error) {
	res, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer res.Close()
	out := make([]store.Claimed, 0, rows)
	var (
		id                  pgtype.UUID
		key, contentType    pgtype.Text
		payload, payloadBin []byte
		headers             []byte
		maxAttempts         pgtype.Int4
		attempts            int32
		payloadBytes        int32
		createdAt           pgtype.Timestamptz
		availableAt         pgtype.Timestamptz
	)
	for res.Next() {
		c := store.Claimed{Delivery: deliveries}
		dest := []any{&c.Seq, &id, &c.Topic, &key, &payload, &payloadBin, &contentType, &headers,
			&createdAt, &maxAttempts, &c.Lane, &c.Queued, &payloadBytes}
		if deliveries {
			dest = append(dest, &c.Sink, &attempts, &c.Head, &c.Elsewhere)
		} else {
			dest = append(dest, &availableAt)
		}
		// pgx scans a []byte into a new slice (or nil) for each row, so
		// the slices kept below are the row's own.
		if err := res.Scan(dest...); err != nil {
			return nil, fmt.Errorf("reading a claimed event: %w", err)
		}
		c.ID, c.Key, c.ContentType = uuidString(id), key.String, contentType.String
		c.Payload, c.PayloadBin, c.Headers, c.PayloadBytes = payload, payloadBin, headers, int64(payloadBytes)
		c.MaxAttempts, c.Attempts = int(maxAttempts.Int32), int(attempts)
		if availableAt.InfinityModifier == pgtype.Finite {
			c.AvailableAt = availableAt.Time
		}
		if createdAt.InfinityModifier != pgtype.Finite {
			c.CreatedAtErr = errors.New("created_at is infinity or -infinity, not a time")
		} else {
			c.CreatedAt = createdAt.Time
		}
		out = append(out, c)
	}
	return out, res.Err()
}
