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
	// queuedCheckEvery is how many deliveries this relay queues (while a
	// sink fails) between two looks at the tables' growth.
	queuedCheckEvery = 2000
)

// countRecorded adds a recorded batch of n events and asks the vacuum loop
// for a look at the dead tuples every vacuumCheckEvery events of batches
// that were not full.
func (r *Relay) countRecorded(n int) {
	if n >= r.cfg.BatchSize || r.recorded.Add(int64(n)) < vacuumCheckEvery {
		return
	}
	r.recorded.Store(0)
	r.askVacuumLoop()
}

// countQueued adds n deliveries queued by a record, and asks the vacuum
// loop for a look at the tables' growth every queuedCheckEvery of them: a
// sink that is down grows the deliveries table by thousands of rows a
// second.
func (r *Relay) countQueued(n int) {
	if n == 0 || r.queued.Add(int64(n)) < queuedCheckEvery {
		return
	}
	r.queued.Store(0)
	r.askVacuumLoop()
}

func (r *Relay) askVacuumLoop() {
	select {
	case r.vacuumCheck <- struct{}{}:
	default:
	}
}

// vacuumLoop vacuums the outbox and deliveries tables whenever either holds
// more than vacuumAfterDeadTuples dead tuples, and analyzes either when it
// has grown (store.MaintainTables), looking at start, every vacuumEvery and whenever
// countRecorded or countQueued asks. Every delivered event leaves a dead tuple
// that claims walk past until a vacuum removes it: at a high rate, looks on
// a fixed period alone let so many pile up between vacuums that the claims
// before each one drive the tail latency up. Full batches (a backlog
// draining) do not ask: a vacuum reads the whole table, most of it still
// live then, and asking that often slows the drain (docs/benchmarks.md has
// both measurements).
func (r *Relay) vacuumLoop(ctx context.Context) {
	tick := time.NewTicker(r.vacuumEvery)
	defer tick.Stop()
	// The first look is at start: a table left to grow while no relay ran
	// is maintained at once, and the store's observer has its figures
	// (the MySQL history list length) from the start.
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-r.vacuumCheck:
			}
		}
		start := time.Now()
		done, err := r.store.MaintainTables(ctx, vacuumAfterDeadTuples)
		if err == nil && done.MySQL {
			r.cfg.Observer.HistoryLength(done.HistoryLength)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("relay: vacuum failed", "error", err)
		case len(done.Vacuumed)+len(done.Analyzed) > 0:
			r.log.Debug("relay: maintained the outbox tables", "vacuumed", done.Vacuumed, "analyzed", done.Analyzed, "took", time.Since(start))
		}
	}
}
