package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/store"
)

// Operator is store.Operator on MySQL 8 and MariaDB 10.6+. Its writes run
// in the store's READ COMMITTED transactions, retried on deadlocks and
// lock wait timeouts, and give queues their heads with the record's own
// statements (promote). Reads go through Query, never Exec: see
// docs/architecture.md on the driver's hang after Exec of a prepared
// SELECT that returns no rows. MySQL has no notifications: the relays
// find what a batch made due at their next poll of the queues.
type Operator struct {
	st  *Store
	sql operatorStatements
}

var _ store.Operator = (*Operator)(nil)

// NewOperator returns the operator of the tables t on db, opened as a
// relay's (Open, or with Configure's settings).
func NewOperator(db *sql.DB, t mysqlmigrations.Tables) *Operator {
	n := names{o: t.Outbox(), dl: t.Deliveries(), l: t.Lanes(), r: t.Relays(), st: t.Stats()}
	return &Operator{st: New(db, t, Config{}), sql: newOperatorStatements(n)}
}

// deadLetterFilter returns stmt with the conditions selecting the dead
// letters (alias d) after p (before it, with before) that match f at its
// filterMarker, and their parameters. A field not set adds no condition:
// MySQL plans "? IS NULL OR ..." for the worst case.
func deadLetterFilter(stmt string, f store.DeadLetterFilter, p store.DeadLetterPosition, before bool) (string, []any, error) {
	op := ">"
	if before {
		op = "<"
	}
	var w strings.Builder
	args := []any{}
	w.WriteString(`d.state = 'dead'`)
	if p.WholeSeq {
		w.WriteString(` AND d.seq ` + op + ` ?`)
		args = append(args, p.Seq)
	} else {
		w.WriteString(` AND d.seq ` + op + `= ? AND (d.seq ` + op + ` ? OR d.sink ` + op + ` ?)`)
		args = append(args, p.Seq, p.Seq, p.Sink)
	}
	if len(f.IDs) > 0 {
		w.WriteString(` AND d.id IN (` + placeholders(len(f.IDs)) + `)`)
		for _, id := range f.IDs {
			u, err := uuid.Parse(id)
			if err != nil {
				return "", nil, fmt.Errorf("event id %q: %w", id, err)
			}
			args = append(args, u.String())
		}
	}
	cond := func(c string, v any) {
		w.WriteString(` AND ` + c)
		args = append(args, v)
	}
	if f.Topic != "" {
		cond(`d.topic LIKE ?`, store.TopicLike(f.Topic))
	}
	if f.Key != "" {
		cond("d.`key` = ?", f.Key)
	}
	if f.Sink != "" {
		cond(`d.sink = ?`, f.Sink)
	}
	if f.Error != "" {
		cond(`locate(lower(?), lower(d.last_error)) > 0`, f.Error)
	}
	if !f.Since.IsZero() {
		cond(`d.dead_at >= ?`, f.Since.UTC())
	}
	if !f.Until.IsZero() {
		cond(`d.dead_at < ?`, f.Until.UTC())
	}
	if f.OlderThan > 0 {
		cond(`d.dead_at < `+now+` - INTERVAL ? MICROSECOND`, f.OlderThan.Microseconds())
	}
	return strings.Replace(stmt, filterMarker, w.String(), 1), args, nil
}

// placeholders returns n ?s, comma separated.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// withSeqs returns stmt with one placeholder per seq at its seqsMarker,
// and the seqs as parameters.
func withSeqs(stmt string, seqs []int64) (string, []any) {
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	return inList(stmt, len(seqs)), args
}

// nullTime is a nullable DATETIME read as the zero time when NULL.
func nullTime(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

// DeadLetters implements store.Operator.
func (s *Operator) DeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, limit int, newest bool) ([]store.DeadLetter, error) {
	stmt := s.sql.list
	if newest {
		stmt = s.sql.listNewest
	}
	stmt, args, err := deadLetterFilter(stmt, f, p, newest)
	if err != nil {
		return nil, err
	}
	page := make([]store.DeadLetter, 0, limit)
	err = each(ctx, s.st.db, stmt, func(rows *sql.Rows) error {
		var d store.DeadLetter
		if err := rows.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Sink, &d.Attempts, &d.CreatedAt, &d.DiedAt, &d.LastError, &d.StopsKey); err != nil {
			return err
		}
		page = append(page, d)
		return nil
	}, append(args, limit)...)
	return page, err
}

// CountDeadLetters implements store.Operator.
func (s *Operator) CountDeadLetters(ctx context.Context, f store.DeadLetterFilter, limit int64) (int64, error) {
	stmt := s.sql.countAll
	if limit > 0 {
		stmt = s.sql.countAtMost
	}
	stmt, args, err := deadLetterFilter(stmt, f, store.DeadLetterPosition{Seq: -1 << 63}, false)
	if err != nil {
		return 0, err
	}
	if limit > 0 {
		args = append(args, limit)
	}
	var n int64
	return n, s.st.db.QueryRowContext(ctx, stmt, args...).Scan(&n)
}

// ShowEvent implements store.Operator, from one snapshot: a relay moving
// the event from the outbox to its deliveries in between would otherwise
// hide it.
func (s *Operator) ShowEvent(ctx context.Context, id string) (store.ShownEvent, error) {
	var e store.ShownEvent
	u, err := uuid.Parse(id)
	if err != nil {
		return e, fmt.Errorf("event id %q: %w", id, err)
	}
	id = u.String()
	tx, err := s.st.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return e, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	var available, finished sql.NullTime
	err = tx.QueryRowContext(ctx, s.sql.showEvent, id).Scan(&e.Seq, &e.ID, &e.Topic, &e.Key, &e.OutboxStatus,
		&e.Columns.Payload, &e.Columns.PayloadBin, &e.ContentType, &e.Columns.Headers, &e.CreatedAt, &available,
		&e.Columns.MaxAttempts, &finished)
	switch {
	case err == nil:
		e.AvailableAt, e.FinishedAt = nullTime(available), nullTime(finished)
	case !errors.Is(err, sql.ErrNoRows):
		return e, err
	}
	e.Deliveries = map[string]store.ShownDelivery{}
	err = each(ctx, tx, s.sql.showDeliveries, func(rows *sql.Rows) error {
		var (
			sink, topic, key, contentType string
			seq                           int64
			d                             store.ShownDelivery
			created                       time.Time
			next, dead                    sql.NullTime
			headSeq                       sql.NullInt64
			headID, headState             sql.NullString
			c                             store.EventColumns
		)
		if err := rows.Scan(&sink, &seq, &topic, &key, &c.Payload, &c.PayloadBin, &contentType, &c.Headers,
			&created, &c.MaxAttempts, &d.State, &d.StopsKey, &d.Attempts, &next, &d.Error, &d.QueuedAt, &dead,
			&headSeq, &headID, &headState); err != nil {
			return err
		}
		d.NextAt, d.DeadAt = nullTime(next), nullTime(dead)
		if headSeq.Valid {
			d.Head = &store.ShownHead{Seq: headSeq.Int64, ID: headID.String, State: headState.String}
		}
		e.Deliveries[sink] = d
		if e.OutboxStatus == "" && e.ID == "" {
			e.Seq, e.ID, e.Topic, e.Key, e.ContentType, e.CreatedAt, e.Columns = seq, id, topic, key, contentType, created, c
		}
		return nil
	}, id)
	if err != nil {
		return e, err
	}
	return e, tx.Commit()
}

// ReplayDeadLetters implements store.Operator.
func (s *Operator) ReplayDeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, n int, allSinks bool) ([]store.Taken, error) {
	stmt := s.sql.selectBatch
	if allSinks {
		stmt = s.sql.selectQueued
	}
	stmt, args, err := deadLetterFilter(stmt, f, p, false)
	if err != nil {
		return nil, err
	}
	return s.batch(ctx, stmt, append(args, n), func(tx *sql.Tx, batch []store.Taken) error {
		queues, routeSeqs := store.ReplayedQueues(batch, allSinks)
		rejoin := func(x store.Taken) bool { return !allSinks || x.Queued }
		if doc := pairsJSON(batch, rejoin); doc != "[]" {
			if _, err := tx.ExecContext(ctx, s.sql.rejoin, doc); err != nil {
				return fmt.Errorf("putting dead letters back in their queues: %w", err)
			}
		}
		if len(routeSeqs) > 0 {
			if err := s.routeBack(ctx, tx, routeSeqs, queues); err != nil {
				return err
			}
		}
		return s.promote(ctx, tx, queues)
	})
}

// PurgeDeadLetters implements store.Operator.
func (s *Operator) PurgeDeadLetters(ctx context.Context, f store.DeadLetterFilter, p store.DeadLetterPosition, n int) ([]store.Taken, error) {
	stmt, args, err := deadLetterFilter(s.sql.selectBatch, f, p, false)
	if err != nil {
		return nil, err
	}
	return s.batch(ctx, stmt, append(args, n), func(tx *sql.Tx, batch []store.Taken) error {
		if _, err := tx.ExecContext(ctx, s.sql.purge, pairsJSON(batch, nil)); err != nil {
			return err
		}
		return s.promote(ctx, tx, store.PurgedQueues(batch))
	})
}

// DropQueue implements store.Operator.
func (s *Operator) DropQueue(ctx context.Context, sink string, after int64, n int) ([]store.Taken, error) {
	return s.batch(ctx, s.sql.selectQueue, []any{sink, after, n}, func(tx *sql.Tx, batch []store.Taken) error {
		if _, err := tx.ExecContext(ctx, s.sql.purge, pairsJSON(batch, nil)); err != nil {
			return err
		}
		return s.promote(ctx, tx, store.DroppedQueues(batch))
	})
}

// batch runs one batch of a replay, purge or drop in a transaction under
// the lock of every lane: it takes the rows selectStmt locks, then fn
// changes them when there are any.
func (s *Operator) batch(ctx context.Context, selectStmt string, args []any, fn func(*sql.Tx, []store.Taken) error) ([]store.Taken, error) {
	var batch []store.Taken
	err := s.st.inTx(ctx, func(tx *sql.Tx) error {
		batch = nil
		if err := drain(tx.QueryContext(ctx, s.sql.lockAllLanes)); err != nil {
			return fmt.Errorf("locking the lanes: %w", err)
		}
		err := each(ctx, tx, selectStmt, func(rows *sql.Rows) error {
			var x store.Taken
			if err := rows.Scan(&x.Sink, &x.Seq, &x.ID, &x.Key, &x.StopsKey, &x.Queued); err != nil {
				return err
			}
			batch = append(batch, x)
			return nil
		}, args...)
		if err != nil || len(batch) == 0 {
			return err
		}
		return fn(tx, batch)
	})
	return batch, err
}

// routeBack sends events (seqs) back to the routing step and removes their
// dead letters on the sinks, adding the queues those leave to queues.
func (s *Operator) routeBack(ctx context.Context, tx *sql.Tx, seqs []int64, queues store.Queues) error {
	stmt, args := withSeqs(s.sql.route, seqs)
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("sending events back to the routing step: %w", err)
	}
	stmt, args = withSeqs(s.sql.sinkDead, seqs)
	err := each(ctx, tx, stmt, func(rows *sql.Rows) error {
		var (
			sink string
			key  *string
		)
		if err := rows.Scan(&sink, &key); err != nil {
			return err
		}
		queues.Add(key, sink)
		return nil
	}, args...)
	if err == nil {
		stmt, args = withSeqs(s.sql.dropSinkDead, seqs)
		_, err = tx.ExecContext(ctx, stmt, args...)
	}
	if err != nil {
		return fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
	}
	return nil
}

// promote gives each of queues that has waiting deliveries and no head its
// lowest waiting delivery as head, due at once, in any lane: the batch
// holds every lane.
func (s *Operator) promote(ctx context.Context, tx *sql.Tx, queues store.Queues) error {
	if len(queues) == 0 {
		return nil
	}
	keys, sinks := queues.Split()
	if err := s.st.promote(ctx, tx, keys, sinks, lanes(^uint64(0))); err != nil {
		return fmt.Errorf("making the heads of %d queues: %w", len(queues), err)
	}
	return nil
}

// pairsJSON is the (sink, seq) pairs of the deliveries of batch that keep
// (all when keep is nil) as pairsTable reads them.
func pairsJSON(batch []store.Taken, keep func(store.Taken) bool) string {
	type pair struct {
		Sink string `json:"sink"`
		Seq  int64  `json:"seq"`
	}
	pairs := make([]pair, 0, len(batch))
	for _, x := range batch {
		if keep == nil || keep(x) {
			pairs = append(pairs, pair{x.Sink, x.Seq})
		}
	}
	b, _ := json.Marshal(pairs) // strings and numbers always encode
	return string(b)
}

// drain reads a query's rows to the end and closes them.
func drain(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// each runs a query on q and calls fn for each of its rows.
func each(ctx context.Context, q queryer, query string, fn func(*sql.Rows) error, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// QueueSize implements store.Operator.
func (s *Operator) QueueSize(ctx context.Context, sink string) (int64, error) {
	var n int64
	err := s.st.db.QueryRowContext(ctx, s.sql.countQueue, sink).Scan(&n)
	return n, err
}

// Now implements store.Operator.
func (s *Operator) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := s.st.db.QueryRowContext(ctx, `SELECT `+now).Scan(&t)
	return t, err
}
