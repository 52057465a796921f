package deadletter

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Result is what a Replay or Purge did.
type Result struct {
	// Count is the number of events replayed or purged.
	Count int64 `json:"count"`
	// Missing lists the ids of Filter.IDs that were not dead letters
	// matching the filter (unknown, delivered, pending or filtered out).
	Missing []string `json:"missing,omitempty"`
}

// ProgressFunc is told the running total after each batch.
type ProgressFunc func(done int64)

// ReplayOpts tunes a Replay.
type ReplayOpts struct {
	// AllSinks sends the events to every sink of their route again,
	// including those that delivered them. By default only the sinks that
	// did not deliver them get them.
	AllSinks bool
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// Replay makes the dead letters matching f pending again, DefaultBatchSize
// rows per statement (each its own transaction). It returns how many it
// replayed; on error, the batches before it stay replayed.
func (s *Store) Replay(ctx context.Context, f Filter, opts ReplayOpts) (Result, error) {
	return s.run(ctx, f, "replaying", s.replaySQL, []any{opts.AllSinks}, opts.Progress)
}

// PurgeOpts tunes a Purge.
type PurgeOpts struct {
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// Purge deletes the dead letters matching f, DefaultBatchSize rows per
// statement (each its own transaction).
func (s *Store) Purge(ctx context.Context, f Filter, opts PurgeOpts) (Result, error) {
	return s.run(ctx, f, "purging", s.purgeSQL, nil, opts.Progress)
}

// run applies a batch statement (parameters: the filter's, the batch size,
// the wake-up time, then extra) until a batch comes back short.
func (s *Store) run(ctx context.Context, f Filter, doing, sql string, extra []any, progress ProgressFunc) (Result, error) {
	var res Result
	if err := f.Validate(); err != nil {
		return res, err
	}
	// One due time for every batch: replayed events and woken followers are
	// then claimed in seq order, whichever batch moved them.
	var at time.Time
	if err := s.db.QueryRow(ctx, s.nowSQL).Scan(&at); err != nil {
		return res, fmt.Errorf("%s dead letters of %s: %w", doing, s.tables.Outbox(), err)
	}
	var wanted map[string]bool
	if len(f.IDs) > 0 {
		wanted = make(map[string]bool, len(f.IDs))
		for _, id := range f.IDs {
			wanted[canonicalID(id)] = true
		}
	}
	var after int64
	for {
		args := append(f.args(after), s.batchSize, at)
		args = append(args, extra...)
		n, last, err := s.batch(ctx, sql, args, wanted)
		if err != nil {
			return res, fmt.Errorf("%s dead letters of %s (after %d done): %w", doing, s.tables.Outbox(), res.Count, err)
		}
		res.Count += n
		if n > 0 && progress != nil {
			progress(res.Count)
		}
		if n < int64(s.batchSize) {
			break
		}
		after = last
	}
	for id := range wanted {
		res.Missing = append(res.Missing, id)
	}
	slices.Sort(res.Missing)
	return res, nil
}

// batch runs one batch statement and returns the rows it changed and the
// highest seq among them, striking their ids from wanted.
func (s *Store) batch(ctx context.Context, sql string, args []any, wanted map[string]bool) (n, last int64, err error) {
	err = s.inPage(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		var (
			seq int64
			id  string
		)
		for rows.Next() {
			if err := rows.Scan(&seq, &id); err != nil {
				return err
			}
			n++
			last = max(last, seq)
			delete(wanted, id)
		}
		return rows.Err()
	})
	if err != nil {
		return 0, 0, err
	}
	return n, last, nil
}
