package relay

import (
	"context"
	"time"
)

const (
	// vacuumAfterDeadTuples is the dead-tuple count past which the relay
	// vacuums the outbox itself. Autovacuum, with the table's settings from
	// the migration, acts after half as many, but it looks at a database
	// only once per autovacuum_naptime (a minute by default) and may be off.
	vacuumAfterDeadTuples = 20000
	// vacuumCheckEvery is how many events this relay records in batches
	// that were not full (it is keeping up with a flow) between two looks at
	// the outbox's dead tuples (each recorded event leaves one), besides the
	// look every maintainEvery.
	vacuumCheckEvery = 5000
)

// countRecorded adds a recorded batch of n events and asks the vacuum loop
// for a look at the dead tuples every vacuumCheckEvery events of batches
// that were not full.
func (r *Relay) countRecorded(n int) {
	if n >= r.cfg.BatchSize || r.recorded.Add(int64(n)) < vacuumCheckEvery {
		return
	}
	r.recorded.Store(0)
	select {
	case r.vacuumCheck <- struct{}{}:
	default:
	}
}

// vacuumLoop vacuums the outbox and deliveries tables whenever either holds
// more than vacuumAfterDeadTuples dead tuples, looking every maintainEvery
// and whenever countRecorded asks. Every delivered event leaves a dead tuple
// that claims walk past until a vacuum removes it: at 10,000 events/s a
// look every 10 s let 100,000 pile up between vacuums, and the claims of the
// last seconds before each one drove the p99 latency up. Full batches (a
// backlog draining) do not ask: a vacuum reads the whole table, most of it
// still live then, and looking every 5,000 of them made a 200,000-event
// drain 25 % slower.
func (r *Relay) vacuumLoop(ctx context.Context) {
	tick := time.NewTicker(maintainEvery)
	defer tick.Stop()
	s := r.workers[0].store
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.vacuumCheck:
		}
		start := time.Now()
		vacuumed, err := s.vacuumIfNeeded(ctx, vacuumAfterDeadTuples)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("relay: vacuum failed", "error", err)
		case vacuumed:
			r.log.Debug("relay: vacuumed the outbox tables", "took", time.Since(start))
		}
	}
}
