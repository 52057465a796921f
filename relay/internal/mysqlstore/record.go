package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/heraldhq/herald/relay/internal/store"
)

// Record implements store.Store: one READ COMMITTED transaction, retried on
// a deadlock or a lock wait timeout. It share-locks the lanes owner holds
// (the fence: every write is limited to them). The happy path then deletes
// the batch's rows of those lanes at once, as PostgreSQL's does: a row
// another transaction holds (an operator's UPDATE left open) is waited for
// up to the lock wait timeout. After a timeout, and on every other path, the
// record first locks the batch's rows with SKIP LOCKED: a row another
// transaction holds is left in place rather than waited for, and on a
// fan-out the other rows of its key stay too (recorded now, they would go
// before it on the sinks where it failed). The rows left are returned.
func (s *Store) Record(ctx context.Context, owner string, o *store.Outcome, keepDone bool) (store.Recorded, error) {
	if o.FromEvents.Len() > 0 {
		return store.Recorded{}, errors.New("recording events read from a write-ahead log: WAL capture is PostgreSQL's (MySQL's binary log is not read)")
	}
	var removed int
	var held uint64
	skipLocked := !o.Happy()
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		removed, held, err = s.record(ctx, tx, owner, o, keepDone, skipLocked)
		if lockWaitTimeout(err) {
			skipLocked = true // inTx runs it again: then around the row held
		}
		return err
	})
	if err != nil {
		n := len(o.OutboxSeqs) + len(o.DeleteSeqs) + o.Demote.Len() + o.Heads.Len()
		return store.Recorded{}, fmt.Errorf("recording the outcome of %d events and deliveries: %w", n, dataError(err))
	}
	rec := store.Recorded{Fenced: o.Fence.Mask &^ held}
	if held&o.Fence.Mask == 0 {
		return rec, store.ErrFenced
	}
	if removed < len(o.OutboxSeqs) {
		if rec.Left, err = s.left(ctx, o.OutboxSeqs, held); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// record writes o in tx and returns how many outbox rows it removed and
// the lanes of its fence it held; with skipLocked it locks the outbox rows
// first (lockRows), else it removes them directly (only on the happy path,
// which needs no row left behind for its key's sake).
func (s *Store) record(ctx context.Context, tx *sql.Tx, owner string, o *store.Outcome, keepDone, skipLocked bool) (int, uint64, error) {
	mask, err := s.fence(ctx, tx, owner, &o.Fence)
	if err != nil {
		return 0, 0, err
	}
	if mask == 0 {
		return 0, 0, nil // fenced out of every lane: their owner records
	}
	n, err := s.recordIn(ctx, tx, o, lanes(mask), keepDone, skipLocked)
	return n, mask, err
}

// recordIn writes o in tx, in the lanes of fence, and returns how many
// outbox rows it removed.
func (s *Store) recordIn(ctx context.Context, tx *sql.Tx, o *store.Outcome, fence []any, keepDone, skipLocked bool) (int, error) {
	var err error
	remove := o.OutboxSeqs
	if skipLocked && len(o.OutboxSeqs) > 0 {
		if remove, err = s.lockRows(ctx, tx, fence, o); err != nil {
			return 0, err
		}
	}
	if o.FromOutbox.Len() > 0 && len(remove) > 0 {
		if err := s.execOutcomes(ctx, tx, s.sql.insertFromOutbox, &o.FromOutbox, remove, nil, fence); err != nil {
			return 0, fmt.Errorf("inserting deliveries of outbox rows: %w", err)
		}
	}
	removed := 0
	if len(remove) > 0 {
		stmt := s.sql.deleteRows
		if keepDone {
			stmt = s.sql.markDone
		}
		args := make([]any, 0, len(remove)+4)
		for _, seq := range remove {
			args = append(args, seq)
		}
		args = append(append(args, fence...), len(remove))
		res, err := tx.ExecContext(ctx, inList(stmt, len(remove)), args...)
		if err != nil {
			return 0, fmt.Errorf("removing %d outbox rows: %w", len(remove), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("removing %d outbox rows: %w", len(remove), err)
		}
		removed = int(n)
	}
	if o.FromRouting.Len() > 0 {
		if err := s.execOutcomes(ctx, tx, s.sql.insertFromRouting, &o.FromRouting, nil, nil, fence); err != nil {
			return 0, fmt.Errorf("routing deliveries of the routing step: %w", err)
		}
	}
	if len(o.DeleteSeqs) > 0 {
		rows := make([]outcomeRow, len(o.DeleteSeqs))
		for i := range rows {
			rows[i] = outcomeRow{Seq: o.DeleteSeqs[i], Sink: o.DeleteSinks[i]}
		}
		if err := s.execRows(ctx, tx, s.sql.deleteDeliveries, rows, fence); err != nil {
			return 0, fmt.Errorf("removing %d deliveries: %w", len(rows), err)
		}
	}
	if o.Demote.Len() > 0 {
		if err := s.execOutcomes(ctx, tx, s.sql.demote, &o.Demote, nil, nil, fence); err != nil {
			return 0, fmt.Errorf("updating %d deliveries: %w", o.Demote.Len(), err)
		}
	}
	if o.Heads.Len() > 0 {
		taken, err := s.takenHeads(ctx, tx, &o.Heads)
		if err != nil {
			return 0, fmt.Errorf("looking up the heads of %d deliveries' queues: %w", o.Heads.Len(), err)
		}
		if err := s.execOutcomes(ctx, tx, s.sql.heads, &o.Heads, nil, taken, fence); err != nil {
			return 0, fmt.Errorf("updating %d heads: %w", o.Heads.Len(), err)
		}
	}
	if len(o.PromoteKeys) > 0 {
		if err := s.promote(ctx, tx, o.PromoteKeys, o.PromoteSinks, fence); err != nil {
			return 0, fmt.Errorf("promoting the next deliveries of %d queues: %w", len(o.PromoteKeys), err)
		}
	}
	return removed, nil
}

// lockRows locks the batch's outbox rows of the lanes held, skipping those
// another transaction holds, and returns those to remove.
func (s *Store) lockRows(ctx context.Context, tx *sql.Tx, fence []any, o *store.Outcome) ([]int64, error) {
	args := make([]any, 0, len(o.OutboxSeqs)+len(fence))
	for _, seq := range o.OutboxSeqs {
		args = append(args, seq)
	}
	args = append(args, fence...)
	rows, err := tx.QueryContext(ctx, inList(s.sql.lockRows, len(o.OutboxSeqs)), args...)
	if err != nil {
		return nil, fmt.Errorf("locking %d outbox rows: %w", len(o.OutboxSeqs), err)
	}
	defer rows.Close()
	locked := make([]int64, 0, len(o.OutboxSeqs))
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("locking %d outbox rows: %w", len(o.OutboxSeqs), err)
		}
		locked = append(locked, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("locking %d outbox rows: %w", len(o.OutboxSeqs), err)
	}
	if o.Happy() || len(locked) == len(o.OutboxSeqs) {
		return locked, nil
	}
	// A fan-out: the keys of rows not locked are held, all their rows stay.
	held := map[string]bool{}
	keyOf := make(map[int64]string, len(o.OutboxSeqs))
	for i, seq := range o.OutboxSeqs {
		if i < len(o.OutboxKeys) {
			keyOf[seq] = o.OutboxKeys[i]
		}
	}
	for _, seq := range o.OutboxSeqs {
		if _, ok := slices.BinarySearch(locked, seq); !ok && keyOf[seq] != "" {
			held[keyOf[seq]] = true
		}
	}
	remove := locked[:0]
	for _, seq := range locked {
		if !held[keyOf[seq]] {
			remove = append(remove, seq)
		}
	}
	return remove, nil
}

// outcomeRow is one delivery's outcome as outcomeTable reads it.
type outcomeRow struct {
	Seq       int64   `json:"seq"`
	Sink      string  `json:"sink"`
	State     string  `json:"state,omitempty"`
	Stops     bool    `json:"stops"`
	Attempts  int32   `json:"attempts"`
	Delay     int64   `json:"delay"` // µs after the database's clock
	LastError *string `json:"last_error,omitempty"`
	Taken     bool    `json:"taken"`
}

// execOutcomes runs stmt (parameters: outcomes, lanes) on the deliveries
// of d, those of the outbox rows in only when only is not nil, marking as
// taken those in taken.
func (s *Store) execOutcomes(ctx context.Context, tx *sql.Tx, stmt string, d *store.Deliveries, only []int64, taken map[deliveryKey]bool, fence []any) error {
	rows := make([]outcomeRow, 0, d.Len())
	for i := range d.Len() {
		if only != nil {
			if _, ok := slices.BinarySearch(only, d.Seqs[i]); !ok {
				continue
			}
		}
		r := outcomeRow{Seq: d.Seqs[i], Sink: d.Sinks[i], State: d.States[i], Stops: d.Stops[i], Attempts: d.Attempts[i],
			Delay: d.Delays[i].Microseconds()}
		if e := d.LastErrors[i]; e.Valid {
			r.LastError = &e.String
		}
		r.Taken = taken[deliveryKey{r.Sink, r.Seq}]
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil
	}
	return s.execRows(ctx, tx, stmt, rows, fence)
}

func (s *Store) execRows(ctx context.Context, tx *sql.Tx, stmt string, rows []outcomeRow, fence []any) error {
	doc, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, stmt, append([]any{string(doc)}, fence...)...)
	return err
}

// deliveryKey is a delivery's primary key.
type deliveryKey struct {
	sink string
	seq  int64
}

// takenHeads returns the deliveries of heads (sink, seq) that are to be a
// head while their queue has another head.
func (s *Store) takenHeads(ctx context.Context, tx *sql.Tx, heads *store.Deliveries) (map[deliveryKey]bool, error) {
	rows := make([]outcomeRow, heads.Len())
	for i := range rows {
		rows[i] = outcomeRow{Seq: heads.Seqs[i], Sink: heads.Sinks[i], State: heads.States[i], Stops: heads.Stops[i]}
	}
	doc, err := json.Marshal(rows)
	if err != nil {
		return nil, err
	}
	res, err := tx.QueryContext(ctx, s.sql.taken, string(doc))
	if err != nil {
		return nil, err
	}
	defer res.Close()
	taken := map[deliveryKey]bool{}
	for res.Next() {
		var sink string
		var seq int64
		if err := res.Scan(&sink, &seq); err != nil {
			return nil, err
		}
		taken[deliveryKey{sink, seq}] = true
	}
	return taken, res.Err()
}

// queuePair is a (key, sink) queue as queueTable reads it.
type queuePair struct {
	Key  string `json:"key"`
	Sink string `json:"sink"`
}

// promote gives each queue (keys[i], sinks[i]) of the lanes of fence that
// has waiting deliveries and no head its lowest waiting delivery as head,
// due at once.
func (s *Store) promote(ctx context.Context, tx *sql.Tx, keys, sinks []string, fence []any) error {
	pairs := make([]queuePair, len(keys))
	for i := range pairs {
		pairs[i] = queuePair{Key: keys[i], Sink: sinks[i]}
	}
	doc, err := json.Marshal(pairs)
	if err != nil {
		return err
	}
	res, err := tx.QueryContext(ctx, s.sql.promoteFind, string(doc))
	if err != nil {
		return err
	}
	var next []outcomeRow
	for res.Next() {
		var sink string
		var seq sql.NullInt64
		if err := res.Scan(&sink, &seq); err != nil {
			res.Close()
			return err
		}
		if seq.Valid {
			next = append(next, outcomeRow{Seq: seq.Int64, Sink: sink})
		}
	}
	res.Close()
	if err := res.Err(); err != nil {
		return err
	}
	if len(next) == 0 {
		return nil
	}
	return s.execRows(ctx, tx, s.sql.promote, next, fence)
}

// left returns which of seqs, in the lanes of mask, are still pending
// outbox rows after a record.
func (s *Store) left(ctx context.Context, seqs []int64, mask uint64) ([]int64, error) {
	args := make([]any, 0, len(seqs)+3)
	for _, seq := range seqs {
		args = append(args, seq)
	}
	args = append(args, lanes(mask)...)
	rows, err := s.db.QueryContext(ctx, inList(s.sql.left, len(seqs)), args...)
	if err != nil {
		return nil, fmt.Errorf("finding events left in the outbox: %w", err)
	}
	defer rows.Close()
	var left []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("finding events left in the outbox: %w", err)
		}
		left = append(left, seq)
	}
	return left, rows.Err()
}
