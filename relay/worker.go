package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
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

	// leases are the lanes held, with their epochs; block are the lanes
	// this worker should hold: it claims only in both. A lane outside the
	// block is released once no event of it is in flight.
	leases store.Leases
	block  uint64
	// lanesValidUntil: past it, the lane leases may have been taken over and
	// no event may be claimed until they are renewed. It, lanesExpire and
	// quarantine are times of Config.Clock (Relay.now).
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
	// probed is the end of the sink pause whose probe the worker last
	// claimed for (Relay.nextProbe).
	probed time.Time
	// queueTurn rotates the order of the sinks in queue claims.
	queueTurn int
	// freshFlowing: the last claim found new events in the outbox.
	freshFlowing bool
	// position is where the next claim of the outbox starts its walk of
	// the claim index: after the last row of a full batch, so that a long
	// backlog's drain does not walk, at every claim, the entries of the
	// rows it delivered (dead until a vacuum). A row behind it (a
	// transaction that committed late, a delayed event come due, a row
	// set aside) is found by a walk from the beginning: when a claim is
	// not full, and at least every poll interval (nextWalk).
	position store.Position
	nextWalk time.Time

	// flights are events handed off while their calls run (see flight),
	// calls counts the calls running, and results is signalled (without
	// blocking) when a call has a new result.
	flights []*flight
	calls   sync.WaitGroup
	results chan struct{}
	// clockSkew is the database's clock minus this host's, as the last
	// renewal of the lanes found it: event ages (created_at is the
	// database's time) are measured on the database's clock.
	clockSkew time.Duration

	// capture reads the database's log (CaptureWAL); nil otherwise.
	capture *capture
	// taken are the events of the batch read from the log, settled once
	// the batch is recorded.
	taken []store.LogEvent

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
	// the count of deliveries waiting for sinks no route names, and the
	// periodic vacuum check.
	maintainEvery = 10 * time.Second
	// statsEvery spaces the flushes of published counts to the stats table.
	statsEvery = 5 * time.Second
)

// run loops until ctx ends, then finishes its batch in flight and gives
// back its lanes.
func (w *worker) run(ctx, work context.Context) {
	w.loop(ctx, work)
	w.upkeep.Wait() // it stops with ctx
	w.land(work)
	if w.capture != nil {
		w.capture.stop() // confirming what was settled
	}
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
		// The lanes' lease is timed on Config.Clock, which a test moves on
		// instead of waiting for a lease; the rest of the loop on the
		// monotonic clock.
		if hostNow := w.r.now(); !hostNow.Before(nextLanes) {
			if err := w.refreshLanes(work); err != nil {
				w.log.Warn("relay: renewing lanes failed", "error", err)
			}
			nextLanes = hostNow.Add(laneEvery)
		}
		// A paused sink's pause has ended: claim its queue now, to probe
		// it, rather than at the next poll.
		if p := w.r.nextProbe(); !p.IsZero() && !p.Equal(w.probed) && !w.r.now().Before(p) {
			w.probed = p
			w.queuesDirty.Store(true)
		}
		now := time.Now()
		if !now.Before(nextMaintain) {
			if w.index == 0 {
				w.maintainInBackground(ctx)
			}
			if w.capture != nil && w.capture.reader != nil {
				if err := w.r.checkSlot(work, false); err != nil {
					w.log.Warn("relay: reading the replication slot's state failed", "error", err)
				}
			}
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
		wait = min(wait, nextLanes.Sub(w.r.now()), time.Until(nextStats), time.Until(nextMaintain))
		if p := w.r.nextProbe(); !p.IsZero() && !p.Equal(w.probed) {
			wait = min(wait, p.Sub(w.r.now()))
		}
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-w.results:
		case <-w.captureArrived():
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

// maintainInBackground runs one round of upkeep off the claim loop, unless
// the previous round is still running: departed relays, delivered rows
// past retention, and the deliveries waiting for sinks the configuration
// does not name.
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
		w.r.reportUnconfigured(ctx)
	}()
}

func (w *worker) refreshLanes(ctx context.Context) error {
	start := w.r.now()
	v, err := w.store.refreshLanes(ctx, w.r.cfg.Lease, w.r.pausedSinkNames(), w.flightLanes())
	if err != nil {
		return err
	}
	w.r.setSuperseded(w, v.superseded)
	if w.block&^v.block != 0 {
		// Lanes given up (the blocks moved): siblings may take them now
		// rather than at their next refresh.
		w.r.relaneSiblings(w)
	}
	for lane := range uint(laneCount) {
		if v.takenOver&(1<<lane) != 0 {
			if w.quarantine == nil {
				w.quarantine = map[uint]time.Time{}
			}
			w.quarantine[lane] = start.Add(w.r.cfg.Lease * 2 / 3)
			w.log.Info("relay: took over a lane from a relay whose lease expired; waiting for its leases",
				"lane", lane, "until", w.quarantine[lane])
		}
	}
	if v.held.Mask&v.block != w.leases.Mask&w.block {
		w.log.Debug("relay: lanes changed", "held", bits.OnesCount64(v.held.Mask&v.block))
		w.queuesDirty.Store(true)
		w.position = store.Position{} // the new lanes' rows may be anywhere
	}
	w.leases, w.block = v.held, v.block
	w.dropStaleFlights()
	if !v.now.IsZero() {
		w.clockSkew = v.now.Sub(w.r.now())
	}
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
	mask := w.leases.Mask & w.block
	for lane, until := range w.quarantine {
		if now.Before(until) {
			mask &^= 1 << lane
		} else {
			delete(w.quarantine, lane)
		}
	}
	return mask
}

// age is how old an event created at created (the database's time) is at
// now (this host's), on the database's clock.
func (w *worker) age(created, now time.Time) time.Duration {
	return now.Add(w.clockSkew).Sub(created)
}

// resultArrived wakes the worker (its batch's wait, or its idle loop): a
// call has a new result.
func (w *worker) resultArrived() {
	select {
	case w.results <- struct{}{}:
	default:
	}
}

// cycle claims one batch, publishes it, waits for its results at most
// HandOffAfter and records the outcome, with the results of earlier
// batches' flights that arrived meanwhile. It returns the number of events
// and deliveries claimed.
func (w *worker) cycle(ctx context.Context) (int, error) {
	cfg := w.r.cfg
	start := time.Now()
	fence := w.leases // the leases the claim is made under: the record is fenced by them
	mask := w.claimableLanes(w.r.now())
	var queues *queueClaim
	if w.queuesDirty.Swap(false) || !start.Before(w.nextQueueClaim) {
		// While new events flow, a queue claim takes a quarter of a
		// batch per sink: catching up after an outage then costs each
		// cycle, and so the new events' latency, little.
		share := cfg.BatchSize
		if w.freshFlowing {
			share = max(1, share/4)
		}
		queues = w.r.queueSinks(w.r.now(), int32(share))
		// The sinks take turns at coming first: when the claim's bytes
		// run short, the first ones get them.
		w.queueTurn = (w.queueTurn + 1) % len(queues.sinks)
		queues.rotate(w.queueTurn)
		w.nextQueueClaim = start.Add(cfg.PollInterval)
	}
	limits := claimLimits{rows: cfg.BatchSize, bytes: cfg.MaxBatchBytes, eventBytes: cfg.MaxEventBytes}
	after := w.position
	if !start.Before(w.nextWalk) {
		after = store.Position{}
		w.nextWalk = start.Add(cfg.PollInterval)
	}
	fresh, queued, err := w.store.claim(ctx, mask, limits, after, queues, w.skipped(start))
	if err != nil {
		if queues != nil {
			w.queuesDirty.Store(true)
		}
		return 0, err
	}
	if len(queued) > 0 {
		w.queuesDirty.Store(true) // more may wait behind what it claimed
	}
	w.freshFlowing = len(fresh) > 0
	w.position = store.Position{}
	if len(fresh) == limits.rows {
		w.position = lastPosition(fresh)
	}
	logged, err := w.takeLogged(ctx, mask == allLanes, limits)
	if err != nil {
		return 0, err
	}
	fresh = append(fresh, logged...)
	n := len(fresh) + len(queued)
	cfg.Observer.Claimed(n, time.Since(start))
	if n == 0 && !w.anyLanded() {
		return 0, nil
	}
	b := w.newBatch(fresh, queued, w.r.now())
	b.plan()
	// A publish ends when the lanes' lease would: past it, another relay
	// may own them and publish the same keys. The lease is timed on
	// Config.Clock, the call's deadline on the monotonic clock.
	budget := min(cfg.PublishTimeout, w.lanesExpire.Sub(w.r.now()))
	b.publish(ctx, time.Now().Add(budget), w.r.handOffAfter())
	b.now = w.r.now()
	b.settle()
	b.late = w.landedTargets()
	o, flights := b.outcome()
	o.Fence = fence.Only(b.lanes())
	if c := b.counts; c.retried+c.dead+c.paused+c.waiting+c.busy+c.inFlight > 0 {
		w.log.Debug("relay: batch settled", "events", len(fresh), "deliveries", len(queued), "landed", len(b.late),
			"done", c.done, "retried", c.retried, "dead", c.dead, "waiting", c.waiting, "paused", c.paused,
			"busy", c.busy, "in_flight", c.inFlight)
	}

	// The record is not overlapped with the next claim: that claim would
	// walk this batch's rows again while their DELETE runs.
	fenced, err := w.record(ctx, o, n+len(b.late))
	if w.capture != nil {
		w.capture.settle(w.taken, err == nil && fenced == 0)
		w.taken = nil
	}
	if err != nil {
		return n, err
	}
	for _, f := range flights {
		if fenced&(1<<uint(f.lane)) == 0 { // in a lane fenced out, it was not handed off
			w.flights = append(w.flights, f)
			cfg.Observer.SinkHandedOff(f.call.sink.name, len(f.targets))
		}
	}
	for _, c := range b.order {
		cfg.Observer.SinkInFlight(c.sink.name, int(c.sink.inFlight.Load()))
	}
	return n, nil
}

// allLanes is the mask of every lane.
const allLanes = 1<<laneCount - 1

// captureArrived is signalled when events read from the log arrive (nil,
// never, without a reader).
func (w *worker) captureArrived() <-chan struct{} {
	if w.capture == nil {
		return nil
	}
	return w.capture.arrived()
}

// takeLogged takes up to a batch of events read from the database's log
// (CaptureWAL), while the worker holds every lane (all), each joining its
// key's queues. They are settled when the batch is recorded.
func (w *worker) takeLogged(ctx context.Context, all bool, limits claimLimits) ([]item, error) {
	if w.capture == nil {
		return nil, nil
	}
	events := w.capture.take(ctx, all, limits.rows)
	if len(events) == 0 {
		return nil, nil
	}
	queues, err := w.r.store.QueuedSinks(ctx, keysOf(events))
	if err != nil {
		w.capture.settle(events, false)
		return nil, err
	}
	w.taken = events
	return logItems(events, queues, limits), nil
}

// lastPosition is the last of rows in the claim's order (available_at,
// seq).
func lastPosition(rows []item) store.Position {
	var p store.Position
	for i := range rows {
		it := &rows[i]
		if it.availableAt.After(p.AvailableAt) || it.availableAt.Equal(p.AvailableAt) && it.seq > p.Seq {
			p = store.Position{AvailableAt: it.availableAt, Seq: it.seq}
		}
	}
	return p
}

// anyLanded reports whether a flight has all its results, to be recorded.
func (w *worker) anyLanded() bool {
	for _, f := range w.flights {
		if f.landed() {
			return true
		}
	}
	return false
}

// land waits for the calls still running (they end by their deadline, or
// when the work context ends) and records their results, when the worker
// stops: its flights are then settled before it gives its lanes back,
// rather than sent again by their next owner.
func (w *worker) land(ctx context.Context) {
	if len(w.flights) == 0 {
		return
	}
	done := make(chan struct{})
	go func() {
		w.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return
	}
	b := w.newBatch(nil, nil, w.r.now())
	b.late = w.landedTargets()
	o, _ := b.outcome()
	o.Fence = w.leases.Only(b.lanes())
	if _, err := w.record(ctx, o, len(b.late)); err != nil {
		w.log.Warn("relay: could not record the results of events in flight at shutdown; their next owner sends them again", "error", err)
	}
}

// record writes a batch's outcome, and returns the lanes it was fenced out
// of. A database that refuses the record (it is down, the relay's role lost
// a privilege) must not turn the batch into duplicates: the worker
// publishes nothing more and retries the record until it succeeds or the
// lanes' lease runs out; the record is fenced by the leases the batch was
// claimed under, so once those are lost (even if the lanes come back) it
// writes nothing, and the lanes' owner delivers the events again. A record
// refused because of one row's data is recorded event by event instead
// (recordEach). A batch not recorded stays where it was, and its events are
// delivered again.
func (w *worker) record(ctx context.Context, o *outcome, n int) (fenced uint64, err error) {
	for attempt := 1; ; attempt++ {
		if w.r.now().After(w.lanesExpire) {
			return 0, fmt.Errorf("not recording a batch of %d events: the lanes' lease ran out (they stay where they were and will be delivered again)", n)
		}
		start := time.Now()
		rec, err := w.store.record(ctx, o, w.r.cfg.Retention > 0)
		if err == nil || errors.Is(err, store.ErrFenced) {
			if !o.Happy() {
				w.queuesDirty.Store(true)
			}
			w.r.cfg.Observer.Recorded(n, time.Since(start))
			w.r.countRecorded(n)
			w.r.countQueued(o.FromOutbox.Len() + o.FromRouting.Len())
			w.r.recordFailed(w, nil)
			w.fenced(rec.Fenced)
			w.leave(rec.Left)
			return rec.Fenced, nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("recording batch of %d events (they stay where they were and will be delivered again): %w", n, err)
		}
		if refusedData(err) {
			return 0, w.recordEach(ctx, o, n, err)
		}
		w.r.recordFailed(w, err)
		delay := min(time.Duration(attempt)*200*time.Millisecond, 5*time.Second)
		w.log.Warn("relay: recording failed; publishing nothing until it succeeds", "error", err, "attempt", attempt, "retry_in", delay)
		if !sleep(ctx, delay) {
			return 0, fmt.Errorf("recording batch of %d events: %w", n, err)
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
		rec, err := w.store.record(ctx, one, keep)
		if err == nil || errors.Is(err, store.ErrFenced) {
			w.fenced(rec.Fenced)
			w.leave(rec.Left)
			continue
		}
		if !refusedData(err) {
			return fmt.Errorf("recording a batch event by event (the rest stays where it was and will be delivered again): %w", err)
		}
		seq := one.seq
		aside := one.setAside(seq, w.r.cfg.StopKeyOnDeadLetter, fmt.Errorf("the database refused to record this event: %w", err))
		w.log.Error("relay: the database refused to record an event; it is a dead letter now", "seq", seq, "error", err)
		if rec, err := w.store.record(ctx, aside, keep); err != nil {
			if len(one.Events) > 0 {
				// It has no row to be claimed from again: it is read
				// again from the log.
				return fmt.Errorf("setting aside event %d, read from the WAL, which the database refused to record: %w", seq, err)
			}
			w.log.Error("relay: could not set aside an event the database refused to record; it will be claimed again", "seq", seq, "error", err)
			if len(one.OutboxSeqs) > 0 {
				w.leave(one.OutboxSeqs)
			}
		} else {
			w.fenced(rec.Fenced)
		}
	}
	w.queuesDirty.Store(true)
	w.r.cfg.Observer.Recorded(n, 0)
	w.r.countRecorded(n)
	return nil
}

// fenced reports lanes a record was fenced out of: the worker no longer held
// them under the lease its work was claimed with (they changed hands, even
// if they came back), so nothing of them was written, and their events are
// their owner's to send again.
func (w *worker) fenced(lanes uint64) {
	if lanes == 0 {
		return
	}
	w.r.cfg.Observer.RecordFenced(bits.OnesCount64(lanes))
	w.log.Warn("relay: a record was fenced out of lanes this relay no longer holds under the lease it claimed with; their events are sent again by their owner",
		"lanes", bits.OnesCount64(lanes))
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
