package relay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// laneCount is the number of lanes the key space is hashed into.
const laneCount = store.Lanes

// session is one worker as the database knows it: its owner name and the
// fingerprint of its routes, on the relay's store. Its methods hold what the
// engine decides about lanes and upkeep; the store only runs each step.
type session struct {
	store  store.Store
	owner  string
	config string
}

// refreshLanes renews this relay's heartbeat (with the sinks it holds
// paused) and lanes, then moves towards holding its block: the live relays
// with the newest configuration, ordered by owner name, split the
// lanes into consecutive blocks of 64 / live (the first ones a lane smaller
// when it does not divide). Lanes outside the block are released; free
// lanes inside it are acquired (those still held by a relay that has not
// yet seen the change come at a later refresh). A block of neighbours,
// rather than any set of lanes, keeps the claim's lane range (lowest to
// highest lane held) free of other relays' lanes. It returns the lanes
// held, and those just taken over from an owner whose lease had expired, as
// bit masks. A relay whose configuration is not the newest releases its
// lanes and reports that it is superseded.
func (s *session) refreshLanes(ctx context.Context, lease time.Duration, paused []string) (held, takenOver uint64, superseded bool, err error) {
	v, err := s.store.Renew(ctx, s.owner, s.config, lease, paused)
	if err != nil {
		return 0, 0, false, err
	}
	if !v.Current {
		// A relay with a newer configuration is live: it takes the lanes.
		if v.Held != 0 {
			if err := s.store.ReleaseLanes(ctx, s.owner, v.Held); err != nil {
				return 0, 0, true, fmt.Errorf("giving lanes to relays with a newer configuration: %w", err)
			}
		}
		return 0, 0, true, nil
	}
	first, last := laneBlock(v.Rank, v.Live)
	block := laneRange(first, last)
	held = v.Held & block
	if extra := v.Held &^ block; extra != 0 {
		if err := s.store.ReleaseLanes(ctx, s.owner, extra); err != nil {
			return 0, 0, false, err
		}
	}
	if held != block {
		acquired, taken, err := s.store.AcquireLanes(ctx, s.owner, lease, first, last)
		if err != nil {
			return 0, 0, false, err
		}
		held |= acquired
		takenOver = taken
	}
	return held, takenOver, false, nil
}

// laneBlock is the first and last lane of block rank (from 0) when live
// relays split the lanes.
func laneBlock(rank, live int) (first, last int) {
	live = max(live, 1)
	rank = min(max(rank, 0), live-1)
	return rank * laneCount / live, (rank+1)*laneCount/live - 1
}

// laneRange is the mask of lanes first to last.
func laneRange(first, last int) uint64 {
	if last-first+1 >= laneCount {
		return ^uint64(0)
	}
	return (uint64(1)<<uint(last-first+1) - 1) << uint(first)
}

// heartbeat announces this relay as live until lease from now.
func (s *session) heartbeat(ctx context.Context, lease time.Duration) error {
	return s.store.Heartbeat(ctx, s.owner, s.config, lease, nil)
}

// releaseAll gives back this relay's lanes and removes its heartbeat: other
// relays take over at once instead of after the lease.
func (s *session) releaseAll(ctx context.Context) error {
	return s.store.ReleaseAll(ctx, s.owner)
}

// ownerLive returns until when a relay named as this one announced itself
// live, or the zero time when none is.
func (s *session) ownerLive(ctx context.Context) (time.Time, error) {
	return s.store.OwnerLive(ctx, s.owner)
}

// upkeepChunk bounds the rows one statement of upkeep writes, so that none
// holds locks or builds a transaction for long.
const upkeepChunk = 5000

// maintain removes forgotten relays and, with a retention period, delivered
// rows older than it, in bounded batches.
func (s *session) maintain(ctx context.Context, retention time.Duration) (purged int64, err error) {
	if err := s.store.RemoveDeparted(ctx); err != nil {
		return 0, err
	}
	if retention <= 0 {
		return 0, nil
	}
	for {
		n, err := s.store.PurgeDone(ctx, retention, upkeepChunk)
		purged += n
		if err != nil {
			return purged, err
		}
		if n < upkeepChunk || ctx.Err() != nil {
			return purged, nil
		}
	}
}

// deadLetterUnrouted turns the deliveries of this relay's lanes that wait
// for a sink outside routed (the sinks the routes name, and "" for the
// routing step) into dead letters, in bounded batches. It returns how many.
func (s *session) deadLetterUnrouted(ctx context.Context, routed []string) (int64, error) {
	present, err := s.store.SinksWithDeliveries(ctx)
	if err != nil {
		return 0, err
	}
	var gone []string
	for _, sink := range present {
		if sink != "" && !slices.Contains(routed, sink) {
			gone = append(gone, sink)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	var total int64
	for {
		n, err := s.store.DeadLetterSinks(ctx, s.owner, gone, upkeepChunk)
		total += n
		if err != nil {
			return total, err
		}
		if n < upkeepChunk || ctx.Err() != nil {
			return total, nil
		}
	}
}
