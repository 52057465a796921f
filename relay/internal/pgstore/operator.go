package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay/internal/store"
)

// DB is what the Operator needs of a connection pool; *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Operator is store.Operator on PostgreSQL.
type Operator struct {
	db     DB
	tables migrations.Tables
	sql    operatorStatements
}

var _ store.Operator = (*Operator)(nil)

// NewOperator returns the operator of the tables t (defaults filled in,
// validated) on db.
func NewOperator(db DB, t migrations.Tables) *Operator {
	n := names{o: t.Outbox(), dl: t.Deliveries(), l: t.Lanes(), r: t.Relays(), st: t.Stats(), tables: t}
	return &Operator{db: db, tables: t, sql: newOperatorStatements(n)}
}

// filterArgs returns the filter's statement parameters $1 to $10, after
// p. A NULL sink is after every dead letter of seq (a row comparison with
// a NULL member stops there, and the dead-letter index honours it).
func filterArgs(f store.DeadLetterFilter, p store.DeadLetterPosition) ([]any, error) {
	args := make([]any, 10, 12)
	args[0], args[1] = p.Seq, pgtype.Text{String: p.Sink, Valid: !p.WholeSeq}
	if len(f.IDs) > 0 {
		ids := make([]pgtype.UUID, len(f.IDs))
		for i, id := range f.IDs {
			u, err := uuid.Parse(id)
			if err != nil {
				return nil, fmt.Errorf("event id %q: %w", id, err)
			}
			ids[i] = pgtype.UUID{Bytes: u, Valid: true}
		}
		args[2] = ids
	}
	args[3] = optText(store.TopicLike(f.Topic))
	args[4] = optText(f.Key)
	args[5] = optText(f.Sink)
	args[6] = optText(f.Error)
	args[7] = optTime(f.Since)
	args[8] = optTime(f.Until)
	if f.OlderThan > 0 {
		args[9] = f.OlderThan
	}
	return args, nil
}

func optText(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func optTime(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

// DeadLetters implements store.Operator.
func (s *Operator) DeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, limit int, newest bool) ([]store.DeadLetter, error) {
	args, err := filterArgs(f, p)
	if err != nil {
		return nil, err
	}
	stmt := s.sql.listSQL
	if newest {
		stmt = s.sql.listNewestSQL
	}
	page := make([]store.DeadLetter, 0, limit)
	err = s.inPage(ctx, len(f.IDs) == 0, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, stmt, append(args, limit)...)
		if err != nil {
			return err
		}
		var (
			d             store.DeadLetter
			attempts      int32
			created, died pgtype.Timestamptz
		)
		_, err = pgx.ForEachRow(rows, []any{&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Sink, &attempts, &created, &died, &d.LastError, &d.StopsKey}, func() error {
			d.Attempts, d.CreatedAt, d.DiedAt = int(attempts), jsonTime(created), jsonTime(died)
			page = append(page, d)
			return nil
		})
		return err
	})
	return page, err
}

// inPage runs one page's statements in their own short transaction,
// planned to walk the indexes when planned is set (not for a selection by
// id: the id index finds the few rows at once).
func (s *Operator) inPage(ctx context.Context, planned bool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if planned {
			if _, err := tx.Exec(ctx, s.sql.pagePlanSQL); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// CountDeadLetters implements store.Operator, in its own short transaction
// planned to walk the dead-letter index (reading only dead letters' rows,
// not the queued deliveries around them) unless f selects by id.
func (s *Operator) CountDeadLetters(ctx context.Context, f store.DeadLetterFilter, limit int64) (int64, error) {
	args, err := filterArgs(f, store.DeadLetterPosition{Seq: -1 << 63})
	if err != nil {
		return 0, err
	}
	var n int64
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if len(f.IDs) == 0 {
			if _, err := tx.Exec(ctx, s.sql.countPlanSQL); err != nil {
				return err
			}
		}
		if limit > 0 {
			return tx.QueryRow(ctx, s.sql.countAtMostSQL, append(args, limit)...).Scan(&n)
		}
		return tx.QueryRow(ctx, s.sql.countSQL, args...).Scan(&n)
	})
	return n, err
}

// ShowEvent implements store.Operator.
func (s *Operator) ShowEvent(ctx context.Context, id string) (store.ShownEvent, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return store.ShownEvent{}, fmt.Errorf("event id %q: %w", id, err)
	}
	arg := pgtype.UUID{Bytes: u, Valid: true}
	var e store.ShownEvent
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		e = store.ShownEvent{}
		if _, err := tx.Exec(ctx, s.sql.showSetupSQL); err != nil {
			return err
		}
		var created, available, finished pgtype.Timestamptz
		err := tx.QueryRow(ctx, s.sql.showEventSQL, arg).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &e.OutboxStatus,
			&e.Columns.Payload, &e.Columns.PayloadBin, &e.ContentType, &e.Columns.Headers, &created, &available,
			&e.Columns.MaxAttempts, &finished)
		switch {
		case err == nil:
			e.CreatedAt, e.AvailableAt, e.FinishedAt = jsonTime(created), jsonTime(available), jsonTime(finished)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		return s.showDeliveries(ctx, tx, arg, &e)
	})
	return e, err
}

// showDeliveries reads the deliveries of the event shown into e, and the
// event itself from the first when it has no outbox row.
func (s *Operator) showDeliveries(ctx context.Context, tx pgx.Tx, id pgtype.UUID, e *store.ShownEvent) error {
	e.Deliveries = map[string]store.ShownDelivery{}
	rows, err := tx.Query(ctx, s.sql.showDeliveriesSQL, id)
	if err != nil {
		return err
	}
	var (
		sink, state, topic, key, contentType string
		seq                                  int64
		attempts                             int32
		created, next, queued, dead          pgtype.Timestamptz
		headSeq                              pgtype.Int8
		headID, headState                    pgtype.Text
		c                                    store.EventColumns
		d                                    store.ShownDelivery
	)
	_, err = pgx.ForEachRow(rows, []any{&sink, &seq, &topic, &key, &c.Payload, &c.PayloadBin, &contentType, &c.Headers,
		&created, &c.MaxAttempts, &state, &d.StopsKey, &attempts, &next, &d.Error, &queued, &dead,
		&headSeq, &headID, &headState}, func() error {
		d.State, d.Attempts = state, int(attempts)
		d.NextAt, d.QueuedAt, d.DeadAt = jsonTime(next), jsonTime(queued), jsonTime(dead)
		d.Head = nil
		if headSeq.Valid {
			d.Head = &store.ShownHead{Seq: headSeq.Int64, ID: headID.String, State: headState.String}
		}
		e.Deliveries[sink] = d
		if e.OutboxStatus == "" && e.ID == "" {
			e.Seq, e.ID, e.Topic, e.Key, e.ContentType, e.CreatedAt = seq, uuidString(id), topic, key, contentType, jsonTime(created)
			e.Columns = c
		}
		c = store.EventColumns{} // the next row's own
		return nil
	})
	return err
}

// jsonTime is a timestamp read from a row as a time JSON and RFC 3339 can
// carry, years 1 to 9999: a row written by hand may hold 'infinity' or a
// date past year 9999, and one such row must not break a listing. Those
// are clamped to the nearest end of the range; NULL is the zero time.
func jsonTime(t pgtype.Timestamptz) time.Time {
	switch {
	case !t.Valid || t.InfinityModifier == pgtype.NegativeInfinity || t.Time.Year() < 1:
		return time.Time{}
	case t.InfinityModifier == pgtype.Infinity || t.Time.Year() > 9999:
		return time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	}
	return t.Time
}

// ReplayDeadLetters implements store.Operator.
func (s *Operator) ReplayDeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, n int, allSinks bool) ([]store.Taken, error) {
	return s.batch(ctx, f, p, func(tx pgx.Tx, args []any) ([]store.Taken, error) {
		return s.replay(ctx, tx, append(args, n, allSinks), n, allSinks)
	}, n)
}

// PurgeDeadLetters implements store.Operator.
func (s *Operator) PurgeDeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, n int) ([]store.Taken, error) {
	return s.batch(ctx, f, p, func(tx pgx.Tx, args []any) ([]store.Taken, error) {
		batch, err := s.taken(tx.Query(ctx, s.sql.purgeSQL, append(args, n)...))
		if err != nil {
			return nil, err
		}
		return batch, s.promote(ctx, tx, store.PurgedQueues(batch))
	}, n)
}

// batch runs one batch of a replay or purge (fn) under the lock of every
// lane, and wakes the relays when it took any dead letter.
func (s *Operator) batch(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, fn func(pgx.Tx, []any) ([]store.Taken, error), n int) ([]store.Taken, error) {
	args, err := filterArgs(f, p)
	if err != nil {
		return nil, err
	}
	var batch []store.Taken
	err = s.inPage(ctx, len(f.IDs) == 0, func(tx pgx.Tx) error {
		if err := s.lockLanes(ctx, tx); err != nil {
			return err
		}
		var err error
		if batch, err = fn(tx, args); err != nil || len(batch) == 0 {
			return err
		}
		return s.notify(ctx, tx)
	})
	return batch, err
}

func (s *Operator) lockLanes(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, s.sql.lockLanesSQL); err != nil {
		return fmt.Errorf("locking the lanes: %w", err)
	}
	return nil
}

func (s *Operator) notify(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, s.sql.notifySQL, s.tables.Channel()); err != nil {
		return fmt.Errorf("waking the relays: %w", err)
	}
	return nil
}

// taken reads the deliveries a statement took (sink, seq, id, key,
// stops_key).
func (s *Operator) taken(rows pgx.Rows, err error) ([]store.Taken, error) {
	if err != nil {
		return nil, err
	}
	var (
		batch []store.Taken
		x     store.Taken
	)
	_, err = pgx.ForEachRow(rows, []any{&x.Sink, &x.Seq, &x.ID, &x.Key, &x.StopsKey}, func() error {
		batch = append(batch, x)
		return nil
	})
	return batch, err
}

// replay replays a batch (args: the filter, n, allSinks): its dead letters
// rejoin their queues, or (allSinks) their events go back to the routing
// step.
func (s *Operator) replay(ctx context.Context, tx pgx.Tx, args []any, n int, allSinks bool) ([]store.Taken, error) {
	rows, err := tx.Query(ctx, s.sql.replaySQL, args...)
	if err != nil {
		return nil, err
	}
	batch := make([]store.Taken, 0, n)
	var x store.Taken
	if _, err := pgx.ForEachRow(rows, []any{&x.Sink, &x.Seq, &x.ID, &x.Key, &x.StopsKey, &x.Queued}, func() error {
		batch = append(batch, x)
		return nil
	}); err != nil {
		return nil, err
	}
	queues, routeSeqs := store.ReplayedQueues(batch, allSinks)
	if len(routeSeqs) > 0 {
		// The routing step's delivery is copied from the dead letters,
		// which go after it.
		if _, err := tx.Exec(ctx, s.sql.routeSQL, routeSeqs); err != nil {
			return nil, fmt.Errorf("sending events back to the routing step: %w", err)
		}
		rows, err := tx.Query(ctx, s.sql.dropSinkDeadSQL, routeSeqs)
		var (
			sink string
			key  *string
		)
		if err == nil {
			_, err = pgx.ForEachRow(rows, []any{&sink, &key}, func() error {
				queues.Add(key, sink)
				return nil
			})
		}
		if err != nil {
			return nil, fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
	}
	return batch, s.promote(ctx, tx, queues)
}

// DropQueue implements store.Operator.
func (s *Operator) DropQueue(ctx context.Context, sink string, after int64, n int) ([]store.Taken, error) {
	var batch []store.Taken
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.lockLanes(ctx, tx); err != nil {
			return err
		}
		var err error
		if batch, err = s.taken(tx.Query(ctx, s.sql.dropSQL, sink, after, n)); err != nil || len(batch) == 0 {
			return err
		}
		if err := s.promote(ctx, tx, store.DroppedQueues(batch)); err != nil {
			return err
		}
		return s.notify(ctx, tx)
	})
	return batch, err
}

// promote gives each of queues that has deliveries waiting but no head a
// head: its lowest waiting delivery, due at once.
func (s *Operator) promote(ctx context.Context, tx pgx.Tx, queues store.Queues) error {
	if len(queues) == 0 {
		return nil
	}
	keys, sinks := queues.Split()
	if _, err := tx.Exec(ctx, s.sql.promoteSQL, keys, sinks); err != nil {
		return fmt.Errorf("making the heads of %d queues: %w", len(queues), err)
	}
	return nil
}

// QueueSize implements store.Operator.
func (s *Operator) QueueSize(ctx context.Context, sink string) (int64, error) {
	var n int64
	err := s.db.QueryRow(ctx, s.sql.queueSizeSQL, sink).Scan(&n)
	return n, err
}

// Now implements store.Operator.
func (s *Operator) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.db.QueryRow(ctx, s.sql.nowSQL).Scan(&now)
	return now, err
}
