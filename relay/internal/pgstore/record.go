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

// Record implements store.Store. Its first statement share-locks the
// fence's lanes still held under their epochs and reports them; every
// statement after it is fenced the same way. When another transaction
// holds one of the batch's outbox rows locked past lock_timeout (set by
// planSQL), it writes the outcome again with FOR UPDATE SKIP LOCKED,
// leaving that row (and, on a fan-out, its key's other rows) in place.
func (s *Store) Record(ctx context.Context, owner string, o *store.Outcome, keepDone bool) (store.Recorded, error) {
	rec, err := s.recordWith(ctx, owner, o, s.sql.removals[boolIndex(keepDone)][0])
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		rec, err = s.recordWith(ctx, owner, o, s.sql.removals[boolIndex(keepDone)][1])
	}
	return rec, err
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// epochs is the fence as the statements take it: each lane's epoch, -1
// for a lane outside the fence (no lane has that epoch).
func epochs(f *store.Leases) []int64 {
	out := make([]int64, store.Lanes)
	for lane := range out {
		out[lane] = -1
		if f.Mask&(1<<uint(lane)) != 0 {
			out[lane] = f.Epochs[lane]
		}
	}
	return out
}

// deliveryArgs are d as the parameters $2 to $8 of the statements that write
// deliveries (outcomes), after the owner.
func deliveryArgs(owner string, d *store.Deliveries) []any {
	delays := make([]int64, len(d.Delays))
	for i, delay := range d.Delays {
		delays[i] = delay.Microseconds()
	}
	lastErrors := make([]pgtype.Text, len(d.LastErrors))
	for i, e := range d.LastErrors {
		lastErrors[i] = pgtype.Text{String: e.String, Valid: e.Valid}
	}
	return []any{owner, d.Seqs, d.Sinks, d.States, d.Stops, d.Attempts, delays, lastErrors}
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
func (s *Store) recordWith(ctx context.Context, owner string, o *store.Outcome, rm removal) (store.Recorded, error) {
	fence := epochs(&o.Fence)
	b := &pgx.Batch{}
	b.Queue(s.sql.planSQL)
	var held uint64
	b.Queue(s.sql.fenceSQL, owner, fence).QueryRow(func(row pgx.Row) error {
		var mask int64
		err := row.Scan(&mask)
		held = uint64(mask)
		return err
	})
	var gone int64
	if o.Happy() {
		b.Queue(rm.happy, owner, o.OutboxSeqs, fence).Exec(func(tag pgconn.CommandTag) error {
			gone = tag.RowsAffected()
			return nil
		})
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
			return store.Recorded{}, fmt.Errorf("recording %d delivered events: %w", len(o.OutboxSeqs), dataError(err))
		}
		return s.recorded(ctx, o, gone, held)
	}
	if len(o.OutboxSeqs) > 0 {
		args := append(deliveryArgs(owner, &o.FromOutbox), o.OutboxSeqs, fence)
		if rm.keyed {
			args = append(args, outboxKeys(o))
		}
		b.Queue(rm.fanOut, args...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&gone)
		})
	}
	if o.FromEvents.Len() > 0 {
		args := append(deliveryArgs(owner, &o.FromEvents), eventArgs(o.Events)...)
		b.Queue(s.sql.fromEventsSQL, append(args, fence)...)
	}
	if o.FromRouting.Len() > 0 {
		b.Queue(s.sql.rerouteSQL, append(deliveryArgs(owner, &o.FromRouting), fence)...)
	}
	if len(o.DeleteSeqs) > 0 {
		b.Queue(s.sql.deleteDeliveriesSQL, owner, o.DeleteSinks, o.DeleteSeqs, fence)
	}
	if o.Demote.Len() > 0 {
		b.Queue(s.sql.demoteSQL, append(deliveryArgs(owner, &o.Demote), fence)...)
	}
	if o.Heads.Len() > 0 {
		b.Queue(s.sql.headsSQL, append(deliveryArgs(owner, &o.Heads), fence)...)
	}
	if len(o.PromoteKeys) > 0 {
		b.Queue(s.sql.promoteSQL, o.PromoteKeys, o.PromoteSinks, owner, fence)
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		n := len(o.OutboxSeqs) + len(o.Events) + len(o.DeleteSeqs) + o.Demote.Len() + o.Heads.Len()
		return store.Recorded{}, fmt.Errorf("recording the outcome of %d events and deliveries: %w", n, dataError(err))
	}
	return s.recorded(ctx, o, gone, held)
}

// recorded is what a record that removed gone outbox rows, holding the
// lanes held of its fence, did beyond its outcome: the fence's lanes it
// was fenced out of, and the rows of the others it left in place.
func (s *Store) recorded(ctx context.Context, o *store.Outcome, gone int64, held uint64) (store.Recorded, error) {
	rec := store.Recorded{Fenced: o.Fence.Mask &^ held}
	if held&o.Fence.Mask == 0 {
		return rec, store.ErrFenced
	}
	if gone < int64(len(o.OutboxSeqs)) {
		var err error
		if rec.Left, err = s.left(ctx, o.OutboxSeqs, held); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// left returns which of seqs, in the lanes of mask, are still pending
// outbox rows after a record.
func (s *Store) left(ctx context.Context, seqs []int64, mask uint64) ([]int64, error) {
	rows, err := s.pool.Query(ctx, s.sql.leftSQL, seqs, int64(mask))
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	return left, nil
}
