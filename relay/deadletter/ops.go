package deadletter

import (
	"context"
	"fmt"
	"slices"

	"github.com/heraldhq/herald/relay/internal/store"
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

// Plan counts the dead letters f matches now and returns f fixed to them:
// narrowed (Until) to those that died before the database's current time.
// A Replay or Purge of the returned filter changes the dead letters
// counted, and none that die after the count: new events refused, or
// replayed ones failing again. (One that died in a transaction begun
// before the count and committed after it is changed without having been
// counted: the count cannot see it, and it did die before.)
func (s *Store) Plan(ctx context.Context, f Filter) (Filter, int64, error) {
	if err := f.Validate(); err != nil {
		return f, 0, err
	}
	f, err := s.fixed(ctx, f)
	if err != nil {
		return f, 0, err
	}
	n, err := s.db.CountDeadLetters(ctx, store.DeadLetterFilter(f), 0)
	if err != nil {
		return f, 0, fmt.Errorf("counting dead letters of %s: %w", s.outbox, err)
	}
	return f, n, nil
}

// fixed narrows f to the dead letters that died before the database's
// current time.
func (s *Store) fixed(ctx context.Context, f Filter) (Filter, error) {
	now, err := s.db.Now(ctx)
	if err != nil {
		return f, fmt.Errorf("reading the time of %s's database: %w", s.outbox, err)
	}
	if f.Until.IsZero() || now.Before(f.Until) {
		f.Until = now
	}
	return f, nil
}

// Replay puts the dead letters matching f back in their queues,
// DefaultBatchSize rows per transaction. Each rejoins its key's queue on
// its sink with its attempts reset: the queue's head, due at once, when
// the queue has none (the lowest seq of the key's replayed dead letters
// there, or an earlier delivery already waiting), and otherwise waiting
// behind the head. A dead letter without a key is due at once. Replaying
// a dead letter that stopped its key lets the deliveries waiting behind it
// follow it, in seq order. Relays are woken after each batch: on
// PostgreSQL by a NOTIFY; on MySQL, which has none, the replayed
// deliveries are due at once and the relays find them at their next poll
// of the queues (relay.poll_interval).
//
// It replays those that died before it started (see Plan), and returns
// how many it replayed; on error, the batches before it stay replayed.
func (s *Store) Replay(ctx context.Context, f Filter, opts ReplayOpts) (Result, error) {
	return s.run(ctx, f, "replaying", opts.Progress, func(f store.DeadLetterFilter, after store.DeadLetterPosition, n int) ([]store.Taken, error) {
		return s.db.ReplayDeadLetters(ctx, f, after, n, opts.AllSinks)
	})
}

// PurgeOpts tunes a Purge.
type PurgeOpts struct {
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// Purge deletes the dead letters matching f that died before it started
// (see Plan), DefaultBatchSize rows per transaction. The deliveries
// waiting behind a purged dead letter that stopped its key move on (the
// lowest becomes the head of the queue), and relays are woken.
func (s *Store) Purge(ctx context.Context, f Filter, opts PurgeOpts) (Result, error) {
	return s.run(ctx, f, "purging", opts.Progress, func(f store.DeadLetterFilter, after store.DeadLetterPosition, n int) ([]store.Taken, error) {
		return s.db.PurgeDeadLetters(ctx, f, after, n)
	})
}

// run walks the dead letters matching f that died before it started in
// batches, each in its own transaction under the lock of every lane: it
// replays or purges a batch (batch), then wakes the relays. It stops after
// a short batch. A dead letter that dies during the run is
// left alone: a replayed one failing again would otherwise be replayed
// twice by one run, and the progress would pass what was counted.
func (s *Store) run(ctx context.Context, f Filter, doing string, progress ProgressFunc,
	batch func(store.DeadLetterFilter, store.DeadLetterPosition, int) ([]store.Taken, error)) (Result, error) {
	var res Result
	if err := f.Validate(); err != nil {
		return res, err
	}
	f, err := s.fixed(ctx, f)
	if err != nil {
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
		taken, err := batch(store.DeadLetterFilter(f), after, s.batchSize)
		if err != nil {
			return res, fmt.Errorf("%s dead letters of %s (after %d done): %w", doing, s.outbox, res.Count, err)
		}
		for _, x := range taken {
			delete(wanted, x.ID)
			if before(after, x.Seq, x.Sink) {
				after = at(x.Seq, x.Sink)
			}
		}
		res.Count += int64(len(taken))
		if len(taken) > 0 && progress != nil {
			progress(res.Count)
		}
		if len(taken) < s.batchSize {
			break
		}
	}
	for id := range wanted {
		res.Missing = append(res.Missing, id)
	}
	slices.Sort(res.Missing)
	return res, nil
}

// DropOpts tune DropQueue.
type DropOpts struct {
	// Progress, when set, is called after each batch.
	Progress ProgressFunc
}

// QueueSize counts the deliveries of sink: waiting, due or dead.
func (s *Store) QueueSize(ctx context.Context, sink string) (int64, error) {
	n, err := s.db.QueueSize(ctx, sink)
	if err != nil {
		return 0, fmt.Errorf("counting the deliveries of sink %s: %w", sink, err)
	}
	return n, nil
}

// DropQueue removes every delivery of sink, its dead letters included, in
// batches in seq order, each under the lock of every lane: what waits for
// a sink removed from the configuration for good, which the relays keep
// until an operator says otherwise. A queue cut into by a batch gets its
// next head in the same transaction, so a run stopped half way leaves the
// queues whole. Dropping the queue of a sink relays still deliver to
// loses those events for it: check the configuration first.
func (s *Store) DropQueue(ctx context.Context, sink string, opts DropOpts) (Result, error) {
	var res Result
	if sink == "" {
		return res, &InputError{"sink", "the routing step's queue cannot be dropped; purge its dead letters"}
	}
	var after int64
	for {
		batch, err := s.db.DropQueue(ctx, sink, after, s.batchSize)
		if err != nil {
			return res, fmt.Errorf("dropping the deliveries of sink %s of %s (after %d dropped): %w", sink, s.outbox, res.Count, err)
		}
		for _, x := range batch {
			after = max(after, x.Seq)
		}
		res.Count += int64(len(batch))
		if len(batch) > 0 && opts.Progress != nil {
			opts.Progress(res.Count)
		}
		if len(batch) < s.batchSize {
			return res, nil
		}
	}
}
