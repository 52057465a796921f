package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/relay/internal/store"
)

// StatusRows implements store.Operator.
func (s *Operator) StatusRows(ctx context.Context) (*store.StatusRows, error) {
	out := &store.StatusRows{}
	valid := func(t pgtype.Timestamptz) time.Time {
		if !t.Valid {
			return time.Time{}
		}
		return t.Time
	}
	var (
		first pgtype.Timestamptz
		r     store.PendingRow
		q     store.QueueRow
		p     store.PublishedRow
	)
	if err := s.each(ctx, "the pending events per topic", s.sql.statusPendingSQL, []any{&r.Topic, &r.N, &first, &out.At}, func() error {
		r.Oldest = valid(first)
		out.Pending = append(out.Pending, r)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := s.each(ctx, "the queues", s.sql.statusQueuesSQL, []any{&q.Sink, &q.Topic, &q.Queued, &first, &q.Dead, &q.DeadLastMinute, &q.Retrying}, func() error {
		q.Oldest = valid(first)
		out.Queues = append(out.Queues, q)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := s.each(ctx, "the published counts", s.sql.statusPublishedSQL, []any{&p.Sink, &p.Topic, &p.N}, func() error {
		out.Published = append(out.Published, p)
		return nil
	}); err != nil {
		return nil, err
	}
	var (
		rr    store.RelayRow
		since pgtype.Timestamptz // -infinity: announced by a relay from before the column
	)
	if err := s.each(ctx, "the relays", s.sql.statusRelaysSQL, []any{&rr.Owner, &rr.Started, &rr.Config, &since, &rr.Paused, &rr.Claiming, &rr.Lanes}, func() error {
		rr.Since = time.Time{}
		if since.Valid && since.InfinityModifier == pgtype.Finite {
			rr.Since = since.Time
		}
		out.Relays = append(out.Relays, rr)
		rr.Paused, rr.Lanes = nil, nil // the next row's own
		return nil
	}); err != nil {
		return nil, err
	}
	if out.At.IsZero() {
		if err := s.db.QueryRow(ctx, s.sql.nowSQL).Scan(&out.At); err != nil {
			return nil, fmt.Errorf("the time: %w", err)
		}
	}
	return out, nil
}

// each runs query and calls fn after scanning each of its rows into
// scans; errors name what the query reads.
func (s *Operator) each(ctx context.Context, what, query string, scans []any, fn func() error, args ...any) error {
	rows, err := s.db.Query(ctx, query, args...)
	if err == nil {
		_, err = pgx.ForEachRow(rows, scans, fn)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Totals implements store.Operator.
func (s *Operator) Totals(ctx context.Context) (store.Totals, error) {
	var (
		t                     store.Totals
		oldPending, oldQueued pgtype.Timestamptz
	)
	if err := s.db.QueryRow(ctx, s.sql.totalsSQL).Scan(&t.Pending, &oldPending, &t.Queued, &oldQueued, &t.Dead, &t.Now); err != nil {
		return t, err
	}
	if oldPending.Valid {
		t.OldestPending = oldPending.Time
	}
	if oldQueued.Valid {
		t.OldestQueued = oldQueued.Time
	}
	return t, nil
}

// HeldKeys implements store.Operator, planned to stay on the indexes as a
// page of dead letters is (see pagePlanSQL): the deliveries table's
// statistics may be those of an empty table.
func (s *Operator) HeldKeys(ctx context.Context, limit int) ([]store.HeldKey, error) {
	out := []store.HeldKey{}
	err := s.inPage(ctx, true, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql.heldKeysSQL, limit)
		if err != nil {
			return err
		}
		var (
			h           store.HeldKey
			attempts    int32
			next, since pgtype.Timestamptz
		)
		_, err = pgx.ForEachRow(rows, []any{&h.Sink, &h.Key, &h.Topic, &h.HeadID, &h.HeadSeq, &h.HeadState, &attempts,
			&h.LastError, &next, &since, &h.Behind}, func() error {
			h.Attempts, h.NextAt, h.Since = int(attempts), jsonTime(next), jsonTime(since)
			out = append(out, h)
			return nil
		})
		return err
	})
	return out, err
}

// KeyQueues implements store.Operator, planned like HeldKeys.
func (s *Operator) KeyQueues(ctx context.Context, key string, limit int) (map[string][]store.KeyDelivery, error) {
	out := map[string][]store.KeyDelivery{}
	err := s.inPage(ctx, true, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql.keyQueuesSQL, key, limit)
		if err != nil {
			return err
		}
		var (
			sink               string
			d                  store.KeyDelivery
			attempts           int32
			next, queued, dead pgtype.Timestamptz
		)
		_, err = pgx.ForEachRow(rows, []any{&sink, &d.Seq, &d.ID, &d.Topic, &d.State, &attempts, &d.Error, &next, &queued, &dead}, func() error {
			d.Attempts, d.NextAt, d.QueuedAt, d.DeadAt = int(attempts), jsonTime(next), jsonTime(queued), jsonTime(dead)
			out[sink] = append(out[sink], d)
			return nil
		})
		return err
	})
	return out, err
}
