package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Claim implements store.Store. The outbox claim is one statement; with
// queue sinks, the queue claim takes two more: the due heads of every sink
// (one statement), then each head with the deliveries waiting behind it
// (one statement). All are plain reads: the lanes reserve the rows.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (fresh, queued []store.Claimed, err error) {
	lanesArgs := lanes(p.Lanes)
	skip := p.Skip
	if len(skip) == 0 {
		skip = []int64{0} // seqs start at 1: an IN list cannot be empty
	}
	args := []any{p.EventBytes, p.EventBytes, p.EventBytes}
	args = append(args, lanesArgs...)
	for _, seq := range skip {
		args = append(args, seq)
	}
	after := p.After.AvailableAt
	if p.After.IsZero() {
		after = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC) // DATETIME's earliest
	}
	args = append(args, after, after, p.After.Seq)
	args = append(args, p.Config, p.Config, p.Rows, p.Bytes)
	if fresh, err = s.readClaimed(ctx, inList(s.sql.claimFresh, len(skip)), args, p.Rows, false); err != nil {
		return nil, nil, fmt.Errorf("claiming events: %w", err)
	}
	if p.QueueSinks == nil {
		return fresh, nil, nil
	}
	if queued, err = s.claimQueues(ctx, p); err != nil {
		return nil, nil, fmt.Errorf("claiming queued deliveries: %w", err)
	}
	return fresh, queued, nil
}

// head is a due head found by the queue claim.
type head struct {
	sinkAt int
	sink   string
	seq    int64
	key    sql.NullString
}

func (s *Store) claimQueues(ctx context.Context, p store.ClaimParams) ([]store.Claimed, error) {
	lanesArgs := lanes(p.Lanes)
	parts := make([]string, 0, len(p.QueueSinks))
	var args []any
	for i, sink := range p.QueueSinks {
		if i >= len(p.QueueHeads) || p.QueueHeads[i] <= 0 {
			continue
		}
		parts = append(parts, s.sql.claimHead)
		args = append(args, i, sink)
		args = append(args, lanesArgs...)
		args = append(args, p.Config, p.Config, p.QueueHeads[i])
	}
	if len(parts) == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, strings.Join(parts, "\nUNION ALL\n")+"\nORDER BY sink_at, next_at, seq", args...)
	if err != nil {
		return nil, err
	}
	var heads []head
	for rows.Next() {
		var h head
		var next time.Time
		if err := rows.Scan(&h.sinkAt, &h.sink, &h.seq, &h.key, &next); err != nil {
			rows.Close()
			return nil, err
		}
		heads = append(heads, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(heads) == 0 {
		return nil, nil
	}
	// A sink's rows are shared evenly between its heads found, at most its
	// chain each.
	found := map[int]int{}
	for _, h := range heads {
		found[h.sinkAt]++
	}
	parts = parts[:0]
	args = []any{p.EventBytes, p.EventBytes, p.EventBytes}
	for i, h := range heads {
		rows := int(p.QueueRows[h.sinkAt])
		share := min((rows+found[h.sinkAt]-1)/found[h.sinkAt], int(p.QueueChain[h.sinkAt]))
		parts = append(parts, s.sql.claimFollow)
		args = append(args, h.sinkAt, i, rows, h.sink, h.seq, h.sinkAt, i, rows, h.key, h.sink, h.seq, max(share-1, 0))
	}
	args = append(args, p.Bytes)
	stmt := strings.Replace(s.sql.claimQueue, seqsMarker, strings.Join(parts, "\nUNION ALL\n"), 1)
	return s.readClaimed(ctx, stmt, args, len(heads), true)
}

// readClaimed runs a claim and reads its rows: outbox rows, or (with
// deliveries) deliveries, which have more columns.
func (s *Store) readClaimed(ctx context.Context, stmt string, args []any, capacity int, deliveries bool) ([]store.Claimed, error) {
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]store.Claimed, 0, capacity)
	for rows.Next() {
		c := store.Claimed{Delivery: deliveries}
		var (
			key, contentType    sql.NullString
			payload, payloadBin []byte
			headers             []byte
			maxAttempts         sql.NullInt32
			queuedOn, elsewhere []byte
			head                bool
			availableAt         time.Time
		)
		dest := []any{&c.Seq, &c.ID, &c.Topic, &key, &payload, &payloadBin, &contentType, &headers,
			&c.CreatedAt, &maxAttempts, &c.Lane, &queuedOn, &c.PayloadBytes}
		if deliveries {
			dest = append(dest, &c.Sink, &c.Attempts, &head, &elsewhere)
		} else {
			dest = append(dest, &availableAt)
		}
		// database/sql copies a []byte column into a new slice for each
		// row, so the slices kept below are the row's own.
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("reading a claimed event: %w", err)
		}
		c.Key, c.ContentType, c.MaxAttempts, c.Head = key.String, contentType.String, int(maxAttempts.Int32), head
		c.Payload, c.PayloadBin, c.Headers, c.AvailableAt = payload, payloadBin, headers, availableAt
		if c.Queued, err = sinkList(queuedOn); err != nil {
			return nil, fmt.Errorf("reading the queues of event %d: %w", c.Seq, err)
		}
		if c.Elsewhere, err = sinkList(elsewhere); err != nil {
			return nil, fmt.Errorf("reading the deliveries of event %d: %w", c.Seq, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// sinkList reads a JSON array of sink names (NULL: none).
func sinkList(b []byte) ([]string, error) {
	if b == nil {
		return nil, nil
	}
	var sinks []string
	err := json.Unmarshal(b, &sinks)
	return sinks, err
}
