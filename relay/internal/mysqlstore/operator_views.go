package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// StatusRows implements store.Operator.
func (s *Operator) StatusRows(ctx context.Context) (*store.StatusRows, error) {
	out := &store.StatusRows{}
	db := s.st.db
	if err := each(ctx, db, s.sql.pending, func(rows *sql.Rows) error {
		var (
			r     store.PendingRow
			first sql.NullTime
		)
		if err := rows.Scan(&r.Topic, &r.N, &first, &out.At); err != nil {
			return err
		}
		r.Oldest = nullTime(first)
		out.Pending = append(out.Pending, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the pending events per topic: %w", err)
	}
	if err := each(ctx, db, s.sql.queuesByTopic, func(rows *sql.Rows) error {
		var (
			q     store.QueueRow
			first sql.NullTime
		)
		if err := rows.Scan(&q.Sink, &q.Topic, &q.Queued, &first, &q.Dead, &q.DeadLastMinute, &q.Retrying); err != nil {
			return err
		}
		q.Oldest = nullTime(first)
		out.Queues = append(out.Queues, q)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the queues: %w", err)
	}
	if err := each(ctx, db, s.sql.published, func(rows *sql.Rows) error {
		var p store.PublishedRow
		if err := rows.Scan(&p.Sink, &p.Topic, &p.N); err != nil {
			return err
		}
		out.Published = append(out.Published, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("the published counts: %w", err)
	}
	if err := each(ctx, db, s.sql.relays, func(rows *sql.Rows) error {
		r, err := scanRelay(rows)
		out.Relays = append(out.Relays, r)
		return err
	}); err != nil {
		return nil, fmt.Errorf("the relays: %w", err)
	}
	if out.At.IsZero() {
		var err error
		if out.At, err = s.Now(ctx); err != nil {
			return nil, fmt.Errorf("the time: %w", err)
		}
	}
	return out, nil
}

// scanRelay reads a row of the relays statement.
func scanRelay(rows *sql.Rows) (store.RelayRow, error) {
	var (
		r      store.RelayRow
		paused string
		lanes  sql.NullString
	)
	if err := rows.Scan(&r.Owner, &r.Started, &r.Config, &r.Since, &paused, &r.Claiming, &lanes); err != nil {
		return r, err
	}
	// '1000-01-01' stands for PostgreSQL's -infinity (the migration).
	if r.Since.Year() <= 1000 {
		r.Since = time.Time{}
	}
	if err := json.Unmarshal([]byte(paused), &r.Paused); err != nil {
		return r, fmt.Errorf("relay %s: paused_sinks column: %w", r.Owner, err)
	}
	for l := range strings.SplitSeq(lanes.String, ",") {
		if l == "" {
			continue
		}
		n, err := strconv.ParseInt(l, 10, 16)
		if err != nil {
			return r, fmt.Errorf("relay %s: lane %q: %w", r.Owner, l, err)
		}
		r.Lanes = append(r.Lanes, int16(n))
	}
	return r, nil
}

// Totals implements store.Operator.
func (s *Operator) Totals(ctx context.Context) (store.Totals, error) {
	var (
		t                     store.Totals
		oldPending, oldQueued sql.NullTime
	)
	if err := s.st.db.QueryRowContext(ctx, s.sql.total).Scan(&t.Pending, &oldPending, &t.Queued, &oldQueued, &t.Dead, &t.Now); err != nil {
		return t, err
	}
	t.OldestPending, t.OldestQueued = nullTime(oldPending), nullTime(oldQueued)
	return t, nil
}

// HeldKeys implements store.Operator.
func (s *Operator) HeldKeys(ctx context.Context, limit int) ([]store.HeldKey, error) {
	out := []store.HeldKey{}
	err := each(ctx, s.st.db, s.sql.heldKeys, func(rows *sql.Rows) error {
		var (
			h    store.HeldKey
			next sql.NullTime
		)
		if err := rows.Scan(&h.Sink, &h.Key, &h.Topic, &h.HeadID, &h.HeadSeq, &h.HeadState, &h.Attempts,
			&h.LastError, &next, &h.Since, &h.Behind); err != nil {
			return err
		}
		h.NextAt = nullTime(next)
		out = append(out, h)
		return nil
	}, limit)
	return out, err
}

// KeyQueues implements store.Operator: the key's heads, then each queue,
// in one REPEATABLE READ snapshot; a key has a queue on few sinks.
func (s *Operator) KeyQueues(ctx context.Context, key string, limit int) (map[string][]store.KeyDelivery, error) {
	out := map[string][]store.KeyDelivery{}
	tx, err := s.st.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	var sinks []string
	if err := each(ctx, tx, s.sql.keyHeads, func(rows *sql.Rows) error {
		var sink string
		err := rows.Scan(&sink)
		sinks = append(sinks, sink)
		return err
	}, key); err != nil {
		return nil, fmt.Errorf("the heads: %w", err)
	}
	for _, sink := range sinks {
		if err := each(ctx, tx, s.sql.keyQueue, func(rows *sql.Rows) error {
			var (
				d          store.KeyDelivery
				next, dead sql.NullTime
			)
			if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.State, &d.Attempts, &d.Error, &next, &d.QueuedAt, &dead); err != nil {
				return err
			}
			d.NextAt, d.DeadAt = nullTime(next), nullTime(dead)
			out[sink] = append(out[sink], d)
			return nil
		}, key, sink, limit); err != nil {
			return nil, fmt.Errorf("the queue on sink %s: %w", sink, err)
		}
	}
	return out, tx.Commit()
}
