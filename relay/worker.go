package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldhq/herald/relay/internal/store"
)

// A worker is one claim loop. A relay runs Config.Workers of them; each is a
// relay of its own as far as the database is concerned (its own owner name,
// heartbeat and block of lanes), so their claims and records
// overlap while keys stay with one worker at a time. They share the sinks,
// whose Publish calls are serialised.
type worker struct {
	r     *Relay
	index int
	store *session
	log   *slog.Logger
	wake  chan struct{}
	// relane asks the worker to refresh its lanes now: a sibling released
	// lanes that it may take.
	relane chan struct{}

	mask uint64 // lanes held
	// lanesValidUntil: past it, the lane leases may have been taken over and
	// no event may be claimed until they are renewed.
	lanesValidUntil time.Time
	// lanesExpire is when the lane leases run out unless renewed.
	lanesExpire time.Time
	// quarantine holds lanes taken over from a relay whose lease expired,
	// with the time their events may be claimed. The lanes are the only
	// lease events have: that relay may have claimed a batch up to 2/3 of a
	// lease after it last renewed its lanes, and may still be publishing it
	// for up to PublishTimeout (less than a lease). Claiming the lanes'
	// events before then would publish them alongside it, and newer events
	// of a key could overtake its older ones.
	quarantine map[uint]time.Time

	// stats counts published events per minute, sink and topic, flushed to
	// the stats table every statsEvery.
	stats map[store.StatKey]int64

	// skip holds outbox rows left in place because another transaction
	// held them locked, with when to claim them again (see leave).
	skip map[int64]skipEntry

	// queuesDirty is set when the queues of this worker's lanes may have
	// deliveries due that it has not seen: at start, when its lanes change,
	// after it wrote deliveries or claimed some, and when an operator
	// replayed or purged dead letters (a notification says so). Otherwise
	// it looks at them every poll interval, for retries coming due: nothing
	// else changes the queues of its lanes. The happy path then claims from
	// the outbox alone.
	queuesDirty    atomic.Bool
	nextQueueClaim time.Time
	// queueTurn rotates the order of the sinks in queue claims.
	queueTurn int
	// freshFlowing: the last claim found new events in the outbox.
	freshFlowing bool

	// maintaining is set while a round of upkeep runs in the background.
	maintaining atomic.Bool
	upkeep      sync.WaitGroup
}

const (
	// lingerFor and lingerEvery: after finding work, look again this often
	// for this long, catching events whose notification was debounced.
	lingerFor   = 250 * time.Millisecond
	lingerEvery = 5 * time.Millisecond
	// maintainEvery spaces upkeep: departed relays, the retention cleaner,
	// deliveries for sinks no longer routed and the periodic vacuum check.
	maintainEvery = 10 * time.Second
	// statsEvery spaces the flushes of published counts to the stats table.
	statsEvery = 5 * time.Second
)

// run loops until ctx ends, then finishes its batch in flight and gives
// back its lanes.
func (w *worker) run(ctx, work context.Context) {
	w.loop(ctx, work)
	w.upkeep.Wait() // it stops with ctx
	w.flushStats(work)
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.store.releaseAll(releaseCtx); err != nil {
		w.log.Warn("relay: could not release lanes; they expire on their own", "error", err)
	}
}

func (w *worker) loop(ctx, work context.Context) {
	var (
		cfg          = w.r.cfg
		lastWork     time.Time
		nextLanes    time.Time
		nextMaintain time.Time // the first round at start
		nextStats    = time.Now().Add(statsEvery)
		failures     int
		timer        = time.NewTimer(0)
	)
	defer timer.Stop()
	<-timer.C
	laneEvery := min(cfg.Lease/3, 2*time.Second)
	for ctx.Err() == nil {
		select {
		case <-w.relane:
			nextLanes = time.Time{}
		default:
		}
		now := time.Now()
		if !now.Before(nextLanes) {
			if err := w.refreshLanes(work); err != nil {
				w.log.Warn("relay: renewing lanes failed", "error", err)
			}
			nextLanes = now.Add(laneEvery)
		}
		if !now.Before(nextMaintain) {
			if w.index == 0 {
				w.maintainInBackground(ctx)
			}
			w.deadLetterUnrouted(work)
			nextMaintain = now.Add(maintainEvery)
		}
		if !now.Before(nextStats) {
			w.flushStats(work)
			nextStats = now.Add(statsEvery)
		}
		cycleStart := time.Now()
		n, err := w.cycle(work)
		if err != nil {
			failures++
			delay := min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)
			w.log.Warn("relay: cycle failed; retrying", "error", err, "retry_in", delay)
			if !sleep(ctx, delay) {
				return
			}
			continue
		}
		failures = 0
		if n > 0 {
			lastWork = time.Now()
			continue
		}
		wait := cfg.PollInterval
		if time.Since(lastWork) < lingerFor {
			// An empty claim walks the due entries of other relays' lanes:
			// while they have a backlog, it is not cheap, so lingering
			// spends at most a third of the time on it.
			wait = min(wait, max(lingerEvery, 2*time.Since(cycleStart)))
		}
		wait = min(wait, time.Until(nextLanes), time.Until(nextStats), time.Until(nextMaintain))
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-w.relane:
			nextLanes = time.Time{}
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// deadLetterUnrouted turns deliveries of this worker's lanes that wait for
// a sink no route names any more into dead letters.
func (w *worker) deadLetterUnrouted(ctx context.Context) {
	n, err := w.store.deadLetterUnrouted(ctx, w.r.sinkNames)
	switch {
	case err != nil && ctx.Err() == nil:
		w.log.Warn("relay: dead-lettering deliveries for sinks no route names failed", "error", err)
	case n > 0:
		w.log.Warn("relay: deliveries waiting for sinks no route names are dead letters now", "count", n)
	}
}

// maintainInBackground runs one round of upkeep off the claim loop, unless
// the previous round is still running: departed relays, and delivered rows
// past retention.
func (w *worker) maintainInBackground(ctx context.Context) {
	if !w.maintaining.CompareAndSwap(false, true) {
		return
	}
	w.upkeep.Add(1)
	go func() {
		defer w.upkeep.Done()
		defer w.maintaining.Store(false)
		if purged, err := w.store.maintain(ctx, w.r.cfg.Retention); err != nil {
			if ctx.Err() == nil {
				w.log.Warn("relay: maintenance failed", "error", err)
			}
		} else if purged > 0 {
			w.log.Info("relay: removed delivered events past retention", "count", purged)
		}
	}()
}

func (w *worker) refreshLanes(ctx context.Context) error {
	start := time.Now()
	mask, takenOver, superseded, err := w.store.refreshLanes(ctx, w.r.cfg.Lease, w.r.pausedSinkNames())
	if err != nil {
		return err
	}
	w.r.setSuperseded(w, superseded)
	if w.mask&^mask != 0 {
		// Lanes given up (the blocks moved): siblings may take them now
		// rather than at their next refresh.
		w.r.relaneSiblings(w)
	}
	for lane := range uint(laneCount) {
		if takenOver&(1<<lane) != 0 {
			if w.quarantine == nil {
				w.quarantine = map[uint]time.Time{}
			}
			w.quarantine[lane] = start.Add(w.r.cfg.Lease * 2 / 3)
			w.log.Info("relay: took over a lane from a relay whose lease expired; waiting for its leases",
				"lane", lane, "until", w.quarantine[lane])
		}
	}
	if mask != w.mask {
		w.log.Debug("relay: lanes changed", "held", bits.OnesCount64(mask))
		w.queuesDirty.Store(true)
	}
	w.mask = mask
	// Leases were renewed at or after start; trust them for most of a lease.
	w.lanesValidUntil = start.Add(w.r.cfg.Lease * 2 / 3)
	w.lanesExpire = start.Add(w.r.cfg.Lease)
	return nil
}

// claimableLanes is the mask of lanes whose events may be claimed now.
func (w *worker) claimableLanes(now time.Time) uint64 {
	if now.After(w.lanesValidUntil) {
		return 0 // lane leases may have lapsed: claim nothing until renewed
	}
	mask := w.mask
	for lane, until := range w.quarantine {
		if now.Before(until) {
			mask &^= 1 << lane
		} else {
			delete(w.quarantine, lane)
		}
	}
	return mask
}

// cycle claims one batch, publishes it and records the outcome. It returns
// the number of events and deliveries claimed.
func (w *worker) cycle(ctx context.Context) (int, error) {
	cfg := w.r.cfg
	now := time.Now()
	mask := w.claimableLanes(now)
	var queueSinks []string
	var queueHeads []int32
	var queueRows int
	if w.queuesDirty.Swap(false) || !now.Before(w.nextQueueClaim) {
		// While new events flow, a queue claim takes a quarter of a
		// batch per sink: catching up after an outage then costs each
		// cycle, and so the new events' latency, little.
		queueRows = cfg.BatchSize
		if w.freshFlowing {
			queueRows = max(1, queueRows/4)
		}
		queueSinks, queueHeads = w.r.queueSinks(now, int32(queueRows))
		// The sinks take turns at coming first: when the claim's bytes
		// run short, the first ones get them.
		w.queueTurn = (w.queueTurn + 1) % len(queueSinks)
		queueSinks = slices.Concat(queueSinks[w.queueTurn:], queueSinks[:w.queueTurn])
		queueHeads = slices.Concat(queueHeads[w.queueTurn:], queueHeads[:w.queueTurn])
		w.nextQueueClaim = now.Add(cfg.PollInterval)
	}
	limits := claimLimits{rows: cfg.BatchSize, bytes: cfg.MaxBatchBytes, eventBytes: cfg.MaxEventBytes}
	fresh, queued, err := w.store.claim(ctx, mask, limits, queueSinks, queueHeads, queueRows, w.skipped(now))
	if err != nil {
		if queueSinks != nil {
			w.queuesDirty.Store(true)
		}
		return 0, err
	}
	if len(queued) > 0 {
		w.queuesDirty.Store(true) // more may wait behind what it claimed
	}
	w.freshFlowing = len(fresh) > 0
	n := len(fresh) + len(queued)
	cfg.Observer.Claimed(n, time.Since(now))
	if n == 0 {
		return 0, nil
	}
	b := w.newBatch(fresh, queued, time.Now())
	b.plan()
	// A publish ends when the lanes' lease would: past it, another relay
	// may own them and publish the same keys.
	deadline := time.Now().Add(cfg.PublishTimeout)
	if w.lanesExpire.Before(deadline) {
		deadline = w.lanesExpire
	}
	pubCtx, cancel := context.WithDeadline(ctx, deadline)
	b.publish(pubCtx)
	cancel()
	b.now = time.Now()
	b.settle()
	o := b.outcome()
	if b.counts.retried+b.counts.dead+b.counts.paused+b.counts.waiting > 0 {
		w.log.Debug("relay: batch settled", "events", len(fresh), "deliveries", len(queued), "done", b.counts.done,
			"retried", b.counts.retried, "dead", b.counts.dead, "waiting", b.counts.waiting, "paused", b.counts.paused)
	}

	// The record is not overlapped with the next claim: that claim would
	// walk this batch's rows again while their DELETE runs, and measured
	// drains were no faster for it (docs/benchmarks.md).
	return n, w.record(ctx, o, n)
}

// record writes a batch's outcome. A database that refuses the record (it
// is down, the relay's role lost a privilege) must not turn the batch into
// duplicates: the worker publishes nothing more and retries the record,
// renewing its lanes meanwhile so that the outcome stays its own, until it
// succeeds or the lanes are lost (another relay then delivers the events
// again). A record refused because of one row's data is recorded event by
// event instead (recordEach). A batch not recorded stays where it was, and
// its events are delivered again.
func (w *worker) record(ctx context.Context, o *outcome, n int) error {
	for attempt := 1; ; attempt++ {
		if time.Now().After(w.lanesExpire) {
			return fmt.Errorf("not recording a batch of %d events: the lanes' lease ran out (they stay where they were and will be delivered again)", n)
		}
		start := time.Now()
		left, err := w.store.record(ctx, o, w.r.cfg.Retention > 0)
		if err == nil {
			if !o.Happy() {
				w.queuesDirty.Store(true)
			}
			w.r.cfg.Observer.Recorded(n, time.Since(start))
			w.r.countRecorded(n)
			w.r.countQueued(o.FromOutbox.Len() + o.FromRouting.Len())
			w.r.recordFailed(w, nil)
			w.leave(left)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("recording batch of %d events (they stay where they were and will be delivered again): %w", n, err)
		}
		if refusedData(err) {
			return w.recordEach(ctx, o, n, err)
		}
		w.r.recordFailed(w, err)
		delay := min(time.Duration(attempt)*200*time.Millisecond, 5*time.Second)
		w.log.Warn("relay: recording failed; publishing nothing until it succeeds", "error", err, "attempt", attempt, "retry_in", delay)
		if !sleep(ctx, delay) {
			return fmt.Errorf("recording batch of %d events: %w", n, err)
		}
		if err := w.refreshLanes(ctx); err != nil {
			w.log.Warn("relay: renewing lanes failed", "error", err)
		}
	}
}

// refusedData reports whether the database refused a statement because of
// the data it was given (a data exception, a constraint, a limit), rather
// than because it could not run it.
func refusedData(err error) bool {
	var dataErr *store.DataError
	return errors.As(err, &dataErr)
}

// recordEach records a batch the database refused (first) event by event,
// so that one event whose record the database refuses stops nothing but
// itself: it is set aside as a dead letter saying why, and the others are
// recorded as they went.
func (w *worker) recordEach(ctx context.Context, o *outcome, n int, first error) error {
	w.log.Warn("relay: the database refused a batch's record; recording it event by event", "events", n, "error", first)
	keep := w.r.cfg.Retention > 0
	for _, one := range o.split() {
		left, err := w.store.record(ctx, one, keep)
		if err == nil {
			w.leave(left)
			continue
		}
		if !refusedData(err) {
			return fmt.Errorf("recording a batch event by event (the rest stays where it was and will be delivered again): %w", err)
		}
		seq := one.seq
		aside := one.setAside(seq, w.r.cfg.StopKeyOnDeadLetter, fmt.Errorf("the database refused to record this event: %w", err))
		w.log.Error("relay: the database refused to record an event; it is a dead letter now", "seq", seq, "error", err)
		if _, err := w.store.record(ctx, aside, keep); err != nil {
			w.log.Error("relay: could not set aside an event the database refused to record; it will be claimed again", "seq", seq, "error", err)
			if len(one.OutboxSeqs) > 0 {
				w.leave(one.OutboxSeqs)
			}
		}
	}
	w.queuesDirty.Store(true)
	w.r.cfg.Observer.Recorded(n, 0)
	w.r.countRecorded(n)
	return nil
}

// leave sets aside outbox rows a record could not remove because another
// transaction held them locked: they were published, and are claimed (and
// published) again once their set-aside time has passed, 1s doubling to a
// minute while they stay locked.
func (w *worker) leave(seqs []int64) {
	now := time.Now()
	for _, seq := range seqs {
		e := w.skip[seq]
		e.wait = min(max(2*e.wait, time.Second), time.Minute)
		e.until = now.Add(e.wait)
		if len(w.skip) >= maxSkipped {
			break // bounded memory: the rest are claimed again sooner
		}
		w.skip[seq] = e
		w.log.Warn("relay: an event was published but another transaction holds its row locked; it is left in the outbox and sent again later",
			"seq", seq, "retry_in", e.wait)
	}
}

// skipped lists the rows set aside until after now, forgetting those whose
// time passed long ago.
func (w *worker) skipped(now time.Time) []int64 {
	var out []int64
	for seq, e := range w.skip {
		switch {
		case e.until.After(now):
			out = append(out, seq)
		case now.Sub(e.until) > time.Minute:
			delete(w.skip, seq)
		}
	}
	return out
}

// skipEntry is a row set aside by leave.
type skipEntry struct {
	until time.Time
	wait  time.Duration
}

// maxSkipped bounds the rows set aside at once.
const maxSkipped = 10000

// countPublished adds one published event to the in-memory counts.
func (w *worker) countPublished(sink, topic string, at time.Time) {
	w.stats[store.StatKey{Minute: at.UTC().Truncate(time.Minute), Sink: sink, Topic: topic}]++
}

// flushStats adds the in-memory counts to the stats table and removes rows
// older than a day. Counts that could not be written are kept for the next
// flush.
func (w *worker) flushStats(ctx context.Context) {
	if len(w.stats) == 0 {
		return
	}
	if err := w.r.store.AddPublished(ctx, w.stats); err != nil {
		w.log.Warn("relay: writing published counts failed; will retry", "error", err)
		if len(w.stats) > 100000 {
			clear(w.stats) // bounded memory while the database is away
		}
		return
	}
	clear(w.stats)
}
