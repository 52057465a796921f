package relay

import (
	"context"
	"fmt"
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
	// whole: the first live relay holds every lane, the others none
	// (CaptureWAL: the relay reading the log delivers every key).
	whole bool
}

// laneRefresh is what a refresh of the lanes found and did.
type laneRefresh struct {
	// held are the lanes held after it, with their epochs; block the
	// lanes the relay should hold (those of its rank).
	held  store.Leases
	block uint64
	// takenOver are lanes just taken over from an owner whose lease had
	// expired.
	takenOver uint64
	// superseded: a relay with a newer configuration is live.
	superseded bool
	// now is the database's clock.
	now time.Time
}

// refreshLanes renews this relay's heartbeat (with the sinks it holds
// paused) and lanes, then moves towards holding its block: the live relays
// with the newest configuration, ordered by owner name, split the
// lanes into consecutive blocks of 64 / live (the first ones a lane smaller
// when it does not divide). Lanes outside the block are released, but for
// those in keep (events of them are in flight: they go once recorded);
// free lanes inside it are acquired (those still held by a relay that has
// not yet seen the change come at a later refresh). A block of neighbours,
// rather than any set of lanes, keeps the claim's lane range (lowest to
// highest lane held) free of other relays' lanes. A relay whose
// configuration is not the newest gives up its block and reports that it
// is superseded.
func (s *session) refreshLanes(ctx context.Context, lease time.Duration, paused []string, keep uint64) (laneRefresh, error) {
	v, err := s.store.Renew(ctx, s.owner, s.config, lease, paused)
	if err != nil {
		return laneRefresh{}, err
	}
	out := laneRefresh{held: v.Held, now: v.Now}
	if !v.Current {
		// A relay with a newer configuration is live: it takes the lanes.
		out.superseded = true
	} else {
		first, last := s.block(v.Rank, v.Live)
		out.block = laneRange(first, last)
	}
	if extra := v.Held.Mask &^ out.block &^ keep; extra != 0 {
		if err := s.store.ReleaseLanes(ctx, s.owner, extra); err != nil {
			return laneRefresh{}, fmt.Errorf("releasing lanes outside this relay's block: %w", err)
		}
		out.held.Mask &^= extra
	}
	if out.block != 0 && out.held.Mask&out.block != out.block {
		first, last := s.block(v.Rank, v.Live)
		acquired, taken, err := s.store.AcquireLanes(ctx, s.owner, lease, first, last)
		if err != nil {
			return laneRefresh{}, err
		}
		for lane := range laneCount {
			if acquired.Mask&(1<<uint(lane)) != 0 {
				out.held.Add(lane, acquired.Epochs[lane])
			}
		}
		out.takenOver = taken
	}
	return out, nil
}

// block is the first and last lane of the block of the relay of rank rank
// among live ones; first > last when it has none.
func (s *session) block(rank, live int) (first, last int) {
	if !s.whole {
		return laneBlock(rank, live)
	}
	if rank == 0 {
		return 0, laneCount - 1
	}
	return 1, 0
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
