package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/store"
)

// wal builds the statements of events read from the write-ahead log
// (capture: wal), which have no outbox row.
func (n names) wal(s *statements) {
	// The queues of a batch's keys: one probe of head_idx (key, sink) per
	// key.
	s.queuedSinksSQL = `SELECT k.key, ARRAY(SELECT d.sink FROM ` + n.dl + ` d WHERE d.key = k.key AND ` + head + `)
FROM unnest($1::text[]) AS k(key)
WHERE EXISTS (SELECT 1 FROM ` + n.dl + ` d WHERE d.key = k.key AND ` + head + `)`

	// The deliveries of events without a row: the outcomes in $2 to $8,
	// the events' columns in $9 to $19, fenced by the epochs in $20 as
	// any other write. An event is read again from the slot's confirmed
	// position after a reader restarts, and its delivery on a sink may be
	// in the table already (queued, or dead) from its first reading: that
	// one stands, as the first outcome of the event on that sink.
	s.fromEventsSQL = n.insertFrom(`SELECT e.seq, e.id, e.topic, e.key, e.payload::jsonb AS payload, e.payload_bin,
           e.content_type, e.headers::jsonb AS headers, e.created_at, e.max_attempts, e.lane
    FROM unnest($9::bigint[], $10::uuid[], $11::text[], $12::text[], $13::text[], $14::bytea[], $15::text[],
                $16::text[], $17::timestamptz[], $18::int[], $19::smallint[])
         AS e(seq, id, topic, key, payload, payload_bin, content_type, headers, created_at, max_attempts, lane)
    WHERE e.seq = u.seq AND e.lane = ANY(`+n.mine("$20")+`)`, "true") + `
ON CONFLICT DO NOTHING`
}

// QueuedSinks implements store.Store.
func (s *Store) QueuedSinks(ctx context.Context, keys []string) (map[string][]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.sql.queuedSinksSQL, keys)
	if err != nil {
		return nil, fmt.Errorf("looking up the queues of %d keys: %w", len(keys), err)
	}
	out := map[string][]string{}
	var (
		key   string
		sinks []string
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &sinks}, func() error {
		out[key] = sinks
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("looking up the queues of %d keys: %w", len(keys), err)
	}
	return out, nil
}

// eventArgs are events' columns as the parameters $9 to $19 of
// fromEventsSQL.
func eventArgs(events []store.Event) []any {
	n := len(events)
	var (
		seqs         = make([]int64, n)
		ids          = make([]string, n)
		topics       = make([]string, n)
		keys         = make([]pgtype.Text, n)
		payloads     = make([]pgtype.Text, n)
		payloadBins  = make([][]byte, n)
		contentTypes = make([]pgtype.Text, n)
		headers      = make([]string, n)
		createdAts   = make([]pgtype.Timestamptz, n)
		maxAttempts  = make([]pgtype.Int4, n)
		lanes        = make([]int16, n)
	)
	for i := range events {
		e := &events[i]
		seqs[i], ids[i], topics[i], lanes[i] = e.Seq, e.ID, e.Topic, e.Lane
		keys[i] = pgtype.Text{String: e.Key, Valid: e.Key != ""}
		payloads[i] = pgtype.Text{String: string(e.Payload), Valid: e.Payload != nil}
		payloadBins[i] = e.PayloadBin
		contentTypes[i] = pgtype.Text{String: e.ContentType, Valid: e.ContentType != ""}
		headers[i] = string(e.Headers)
		if headers[i] == "" {
			headers[i] = "{}"
		}
		createdAts[i] = pgtype.Timestamptz{Time: e.CreatedAt, Valid: true}
		maxAttempts[i] = pgtype.Int4{Int32: int32(e.MaxAttempts), Valid: e.MaxAttempts > 0}
	}
	return []any{seqs, ids, topics, keys, payloads, payloadBins, contentTypes, headers, createdAts, maxAttempts, lanes}
}

// ReadSlot implements store.Store.
func (s *Store) ReadSlot(ctx context.Context, name string) (store.Slot, error) {
	sl, err := migrations.ReadSlot(ctx, s.pool, name)
	if errors.Is(err, migrations.ErrNoSlot) {
		return store.Slot{}, fmt.Errorf("%w: %s", store.ErrNoSlot, name)
	}
	if err != nil {
		return store.Slot{}, err
	}
	return store.Slot{Active: sl.Active, RetainedBytes: sl.RetainedBytes, BehindBytes: sl.BehindBytes, WALStatus: sl.WALStatus}, nil
}
