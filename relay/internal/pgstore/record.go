package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Record implements store.Store. When another transaction holds one of the
// batch's outbox rows locked past lock_timeout (set by planSQL), it writes
// the outcome again with FOR UPDATE SKIP LOCKED, leaving that row (and, on
// a fan-out, its key's other rows) in place.
func (s *Store) Record(ctx context.Context, owner string, o *store.Outcome, keepDone bool) (left []int64, err error) {
	left, err = s.recordWith(ctx, owner, o, s.sql.removals[boolIndex(keepDone)][0])
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		left, err = s.recordWith(ctx, owner, o, s.sql.removals[boolIndex(keepDone)][1])
	}
	return left, err
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// deliveryArgs are d as the parameters $2 to $8 of the statements that write
// deliveries (outcomes), after the owner.
func deliveryArgs(owner string, d *store.Deliveries) []any {
	nextAt := make([]pgtype.Timestamptz, len(d.NextAt))
	for i, t := range d.NextAt {
		nextAt[i] = pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} // NULL: now
	}
	lastErrors := make([]pgtype.Text, len(d.LastErrors))
	for i, e := range d.LastErrors {
		lastErrors[i] = pgtype.Text{String: e.String, Valid: e.Valid}
	}
	return []any{owner, d.Seqs, d.Sinks, d.States, d.Stops, d.Attempts, nextAt, lastErrors}
}

// outboxKeys are o's outbox rows' keys, NULL for none (and for rows whose
// key o does not give).
func outboxKeys(o *store.Outcome) []pgtype.Text {
	out := make([]pgtype.Text, len(o.OutboxSeqs))
	for i := range min(len(out), len(o.OutboxKeys)) {
		k := o.OutboxKeys[i]
		out[i] = pgtype.Text{String: k, Valid: k != ""}
	}
	return out
}

// recordWith writes o, removing the outbox rows with rm.
func (s *Store) recordWith(ctx context.Context, owner string, o *store.Outcome, rm removal) (left []int64, err error) {
	b := &pgx.Batch{}
	b.Queue(s.sql.planSQL)
	var gone int64
	if o.Happy() {
		if len(o.OutboxSeqs) == 0 {
			return nil, nil
		}
		b.Queue(rm.happy, owner, o.OutboxSeqs).Exec(func(tag pgconn.CommandTag) error {
			gone = tag.RowsAffected()
			return nil
		})
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("recording %d delivered events: %w", len(o.OutboxSeqs), dataError(err))
		}
		if gone < int64(len(o.OutboxSeqs)) {
			return s.left(ctx, o.OutboxSeqs)
		}
		return nil, nil
	}
	if len(o.OutboxSeqs) > 0 {
		args := append(deliveryArgs(owner, &o.FromOutbox), o.OutboxSeqs)
		if rm.keyed {
			args = append(args, outboxKeys(o))
		}
		b.Queue(rm.fanOut, args...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&gone)
		})
	}
	if o.FromRouting.Len() > 0 {
		b.Queue(s.sql.rerouteSQL, deliveryArgs(owner, &o.FromRouting)...)
	}
	if len(o.DeleteSeqs) > 0 {
		b.Queue(s.sql.deleteDeliveriesSQL, owner, o.DeleteSinks, o.DeleteSeqs)
	}
	if o.Demote.Len() > 0 {
		b.Queue(s.sql.demoteSQL, deliveryArgs(owner, &o.Demote)...)
	}
	if o.Heads.Len() > 0 {
		b.Queue(s.sql.headsSQL, deliveryArgs(owner, &o.Heads)...)
	}
	if len(o.PromoteKeys) > 0 {
		b.Queue(s.sql.promoteSQL, o.PromoteKeys, o.PromoteSinks, owner)
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		n := len(o.OutboxSeqs) + len(o.DeleteSeqs) + o.Demote.Len() + o.Heads.Len()
		return nil, fmt.Errorf("recording the outcome of %d events and deliveries: %w", n, dataError(err))
	}
	if gone < int64(len(o.OutboxSeqs)) {
		return s.left(ctx, o.OutboxSeqs)
	}
	return nil, nil
}

// left returns which of seqs are still pending outbox rows after a record.
func (s *Store) left(ctx context.Context, seqs []int64) ([]int64, error) {
	rows, err := s.pool.Query(ctx, s.sql.leftSQL, seqs)
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	return left, nil
}
