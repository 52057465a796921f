package deadletter

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Result is what a Replay or Purge did.
type Result struct {
	// Count is the number of dead letters replayed or purged (matching
	// the filter).
	Count int64 `json:"count"`
	// Missing lists the ids of Filter.IDs that matched no dead letter
	// (unknown, delivered, still queued, or filtered out).
	Missing []string `json:"missing,omitempty"`
}

// ProgressFunc is told the running total after each batch.
type ProgressFunc func(done int64)

// ReplayOpts tunes a Replay.
type ReplayOpts struct {
	// AllSinks sends the events back to the routing step instead of
	// replaying each dead letter on its own sink: the relay routes each
	// event again and sends it to every sink of its route, including those
	// that delivered it (consumers dedupe on the event id). An event's
	// dead letters on every sink go (the routing step replaces them), and
	// the event waits in its key's queue on the routing step like any
	// other delivery. An event still queued on some sink (not all of its
	// deliveries are dead) cannot go through the routing step without
	// being sent there twice: its dead letters are replayed on their own
	// sinks, as without AllSinks.
	AllSinks bool
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// Replay puts the dead letters matching f back in their queues,
// DefaultBatchSize rows per transaction. Each rejoins its key's queue on
// its sink with its attempts reset: the queue's head, due at once, when
// the queue has none (the lowest seq of the key's replayed dead letters
// there, or an earlier delivery already waiting), and otherwise waiting
// behind the head. A dead letter without a key is due at once. Replaying
// a dead letter that stopped its key lets the deliveries waiting behind it
// follow it, in seq order. Relays are woken (NOTIFY) after each batch.
//
// It returns how many dead letters it replayed; on error, the batches
// before it stay replayed.
func (s *Store) Replay(ctx context.Context, f Filter, opts ReplayOpts) (Result, error) {
	return s.run(ctx, f, "replaying", opts.Progress, &opts)
}

// PurgeOpts tunes a Purge.
type PurgeOpts struct {
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// Purge deletes the dead letters matching f, DefaultBatchSize rows per
// transaction. The deliveries waiting behind a purged dead letter that
// stopped its key move on (the lowest becomes the head of the queue), and
// relays are woken.
func (s *Store) Purge(ctx context.Context, f Filter, opts PurgeOpts) (Result, error) {
	return s.run(ctx, f, "purging", opts.Progress, nil)
}

// selected is a dead letter taken by a batch.
type selected struct {
	sink     string
	seq      int64
	id       string
	key      pgtype.Text
	stopsKey bool
	// queued: the event has a delivery on a sink that is not dead.
	queued bool
}

// run walks the dead letters matching f in batches, each in its own
// transaction under the lock of every lane: it replays (or, without
// replay, purges) a batch, then wakes the relays. It stops after a short
// batch.
func (s *Store) run(ctx context.Context, f Filter, doing string, progress ProgressFunc, replay *ReplayOpts) (Result, error) {
	var res Result
	if err := f.Validate(); err != nil {
		return res, err
	}
	var wanted map[string]bool
	if len(f.IDs) > 0 {
		wanted = make(map[string]bool, len(f.IDs))
		for _, id := range f.IDs {
			wanted[canonicalID(id)] = true
		}
	}
	after := start
	for {
		var batch []selected
		err := s.inPage(ctx, f, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, s.lockLanesSQL); err != nil {
				return fmt.Errorf("locking the lanes: %w", err)
			}
			var err error
			if replay != nil {
				batch, err = s.replay(ctx, tx, f, after, replay.AllSinks)
			} else {
				batch, err = s.purge(ctx, tx, f, after)
			}
			if err != nil || len(batch) == 0 {
				return err
			}
			_, err = tx.Exec(ctx, s.notifySQL, s.tables.Channel())
			return err
		})
		if err != nil {
			return res, fmt.Errorf("%s dead letters of %s (after %d done): %w", doing, s.tables.Outbox(), res.Count, err)
		}
		for _, x := range batch {
			delete(wanted, x.id)
			if after.before(x.seq, x.sink) {
				after = at(x.seq, x.sink)
			}
		}
		res.Count += int64(len(batch))
		if len(batch) > 0 && progress != nil {
			progress(res.Count)
		}
		if len(batch) < s.batchSize {
			break
		}
	}
	for id := range wanted {
		res.Missing = append(res.Missing, id)
	}
	slices.Sort(res.Missing)
	return res, nil
}

// replay replays the next batch of dead letters after p matching f: they
// rejoin their queues, or (allSinks) their events go back to the routing
// step.
func (s *Store) replay(ctx context.Context, tx pgx.Tx, f Filter, p position, allSinks bool) ([]selected, error) {
	rows, err := tx.Query(ctx, s.replaySQL, append(f.args(p), s.batchSize, allSinks)...)
	if err != nil {
		return nil, err
	}
	batch := make([]selected, 0, s.batchSize)
	var x selected
	if _, err := pgx.ForEachRow(rows, []any{&x.sink, &x.seq, &x.id, &x.key, &x.stopsKey, &x.queued}, func() error {
		batch = append(batch, x)
		return nil
	}); err != nil {
		return nil, err
	}
	var (
		routeSeqs []int64
		routed    = map[int64]bool{}
		pairs     = pairSet{}
	)
	for _, x := range batch {
		switch {
		case !allSinks || x.queued:
			pairs.add(x.key, x.sink)
		case !routed[x.seq]:
			routed[x.seq] = true
			routeSeqs = append(routeSeqs, x.seq)
			pairs.add(x.key, RoutingStep)
		}
	}
	if len(routeSeqs) > 0 {
		// The routing step's delivery is copied from the dead letters,
		// which go after it.
		if _, err := tx.Exec(ctx, s.routeSQL, routeSeqs); err != nil {
			return nil, fmt.Errorf("sending events back to the routing step: %w", err)
		}
		rows, err := tx.Query(ctx, s.dropSinkDeadSQL, routeSeqs)
		if err != nil {
			return nil, fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
		var (
			sink string
			key  pgtype.Text
		)
		if _, err := pgx.ForEachRow(rows, []any{&sink, &key}, func() error {
			pairs.add(key, sink)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("removing the dead letters of events sent back to the routing step: %w", err)
		}
	}
	return batch, s.promote(ctx, tx, pairs)
}

// purge deletes the next batch of dead letters after p matching f and
// lets the queues they stopped move on.
func (s *Store) purge(ctx context.Context, tx pgx.Tx, f Filter, p position) ([]selected, error) {
	rows, err := tx.Query(ctx, s.purgeSQL, append(f.args(p), s.batchSize)...)
	if err != nil {
		return nil, err
	}
	batch := make([]selected, 0, s.batchSize)
	pairs := pairSet{}
	var x selected
	if _, err := pgx.ForEachRow(rows, []any{&x.sink, &x.seq, &x.id, &x.key, &x.stopsKey}, func() error {
		batch = append(batch, x)
		if x.stopsKey {
			pairs.add(x.key, x.sink)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return batch, s.promote(ctx, tx, pairs)
}

// pairSet is a set of queues: (key, sink) pairs, keys not null.
type pairSet map[[2]string]bool

func (p pairSet) add(key pgtype.Text, sink string) {
	if key.Valid {
		p[[2]string{key.String, sink}] = true
	}
}

// promote gives each queue in pairs that has deliveries waiting but no
// head a head: its lowest waiting delivery, due at once.
func (s *Store) promote(ctx context.Context, tx pgx.Tx, pairs pairSet) error {
	if len(pairs) == 0 {
		return nil
	}
	keys, sinks := make([]string, 0, len(pairs)), make([]string, 0, len(pairs))
	for p := range pairs {
		keys = append(keys, p[0])
		sinks = append(sinks, p[1])
	}
	if _, err := tx.Exec(ctx, s.promoteSQL, keys, sinks); err != nil {
		return fmt.Errorf("making the heads of %d queues: %w", len(pairs), err)
	}
	return nil
}
