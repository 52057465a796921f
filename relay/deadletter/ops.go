package deadletter

import (
	"context"
	"fmt"
	"slices"
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
// follow it, in seq order. Relays are woken after each batch: on
// PostgreSQL by a NOTIFY; on MySQL, which has none, the replayed
// deliveries are due at once and the relays find them at their next poll
// of the queues (relay.poll_interval).
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
	key      *string // nil: no key
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
		batch, err := s.db.batch(ctx, f, after, s.batchSize, replay)
		if err != nil {
			return res, fmt.Errorf("%s dead letters of %s (after %d done): %w", doing, s.outbox, res.Count, err)
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

// replayPlan returns the queues a replayed batch changes and the seqs of
// the events that go back to the routing step (allSinks, and not queued
// on a sink): a dead letter replayed on its own sink rejoins its queue
// there; an event sent to the routing step joins its key's queue there
// and its dead letters on the sinks go, which can free their queues too
// (the caller adds those).
func replayPlan(batch []selected, allSinks bool) (pairSet, []int64) {
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
	return pairs, routeSeqs
}

// purgePlan returns the queues a purged batch lets move on: those its dead
// letters stopped.
func purgePlan(batch []selected) pairSet {
	pairs := pairSet{}
	for _, x := range batch {
		if x.stopsKey {
			pairs.add(x.key, x.sink)
		}
	}
	return pairs
}

// pairSet is a set of queues: (key, sink) pairs, keys not null.
type pairSet map[[2]string]bool

func (p pairSet) add(key *string, sink string) {
	if key != nil {
		p[[2]string{*key, sink}] = true
	}
}

// split returns the pairs' keys and sinks, in the same order.
func (p pairSet) split() (keys, sinks []string) {
	keys, sinks = make([]string, 0, len(p)), make([]string, 0, len(p))
	for q := range p {
		keys = append(keys, q[0])
		sinks = append(sinks, q[1])
	}
	return keys, sinks
}
