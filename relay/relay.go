package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/migrations"
)

// Relay claims, publishes and records outbox events. Create it with New and
// call Run; several relays (in one process or many) may share a database.
type Relay struct {
	cfg    Config
	pool   *pgxpool.Pool
	store  *store
	routes []route
	log    *slog.Logger

	routeMu    sync.Mutex
	routeCache map[string]*route

	wake chan struct{}
	// sinkNames lists every sink of every route, for the claim's hold lookup.
	sinkNames []string
	// recording receives the result of the batch being recorded in the
	// background; nil when none is.
	recording chan error
	mask      uint64 // lanes held
	// lanesValidUntil: past it, the lane leases may have been taken over and
	// keyed events must not be claimed until they are renewed.
	lanesValidUntil time.Time

	// pausedMu guards pausedSince (sink → paused since), written by the
	// loop when a sink is paused or resumed and read by PausedSinks.
	pausedMu    sync.Mutex
	pausedSince map[string]time.Time

	// stats counts published events per minute, sink and topic; only the
	// loop touches it, and flushes it to the stats table every statsEvery.
	stats map[statKey]int64

	// tracer is nil when tracing is off.
	tracer trace.Tracer
}

type route struct {
	patterns []string
	targets  []routeTarget
}

type routeTarget struct {
	Target
	state *sinkState
}

// New returns a relay publishing through the sinks named in cfg.Routes.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:         cfg,
		pool:        pool,
		store:       newStore(pool, cfg.Tables, cfg.Owner),
		log:         cfg.Logger.With("relay", cfg.Owner),
		routeCache:  map[string]*route{},
		wake:        make(chan struct{}, 1),
		pausedSince: map[string]time.Time{},
		stats:       map[statKey]int64{},
	}
	if cfg.TracerProvider != nil {
		r.tracer = cfg.TracerProvider.Tracer("github.com/heraldhq/herald/relay")
	}
	states := map[string]*sinkState{}
	for _, rc := range cfg.Routes {
		rt := route{patterns: rc.Topics}
		for _, t := range rc.Targets {
			st := states[t.Sink.Name()]
			if st == nil {
				st = &sinkState{Sink: t.Sink, name: t.Sink.Name()}
				states[st.name] = st
				r.sinkNames = append(r.sinkNames, st.name)
			}
			rt.targets = append(rt.targets, routeTarget{Target: t, state: st})
		}
		r.routes = append(r.routes, rt)
	}
	return r, nil
}

// route returns the first route matching topic, or nil.
func (r *Relay) route(topic string) *route {
	r.routeMu.Lock()
	defer r.routeMu.Unlock()
	if rt, ok := r.routeCache[topic]; ok {
		return rt
	}
	var found *route
	for i := range r.routes {
		for _, p := range r.routes[i].patterns {
			if MatchTopic(p, topic) {
				found = &r.routes[i]
				break
			}
		}
		if found != nil {
			break
		}
	}
	if len(r.routeCache) >= 10000 {
		clear(r.routeCache) // bounded memory against unbounded topic names
	}
	r.routeCache[topic] = found
	return found
}

func (r *Relay) maxAttempts(rw *row) int {
	if rw.maxAttempts > 0 {
		return rw.maxAttempts
	}
	return r.cfg.MaxAttempts
}

// retryDelay is the backoff for the given attempt, or the destination's own
// Retry-After when it asked for one (capped at the backoff maximum).
func (r *Relay) retryDelay(err error, attempt int) time.Duration {
	var ra retryAfter
	if errors.As(err, &ra) && ra.RetryAfter() > 0 {
		return min(ra.RetryAfter(), r.cfg.Backoff.Max)
	}
	return r.cfg.Backoff.Delay(attempt)
}

func (r *Relay) pause(s *sinkState, err error) {
	s.failures++
	s.pausedUntil = time.Now().Add(r.cfg.SinkPause.Delay(s.failures))
	if s.failures == 1 {
		r.cfg.Observer.SinkPaused(s.name, true)
		r.pausedMu.Lock()
		r.pausedSince[s.name] = time.Now()
		r.pausedMu.Unlock()
	}
	r.log.Warn("relay: sink is down, pausing it; its events wait without spending attempts",
		"sink", s.name, "until", s.pausedUntil, "consecutive_failures", s.failures, "error", err)
}

func (r *Relay) resume(s *sinkState) {
	if s.failures == 0 {
		return
	}
	r.log.Info("relay: sink is back", "sink", s.name, "after_failures", s.failures)
	s.failures, s.pausedUntil = 0, time.Time{}
	r.cfg.Observer.SinkPaused(s.name, false)
	r.pausedMu.Lock()
	delete(r.pausedSince, s.name)
	r.pausedMu.Unlock()
}

// PausedSinks returns the sinks paused because they are down, each with the
// time it was paused. It is safe to call from any goroutine.
func (r *Relay) PausedSinks() map[string]time.Time {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	out := make(map[string]time.Time, len(r.pausedSince))
	for name, since := range r.pausedSince {
		out[name] = since
	}
	return out
}

func (r *Relay) logEvent(rw *row, sink, msg string, err error, attrs ...any) {
	attrs = append(attrs, "event_id", rw.id, "topic", rw.topic)
	if sink != "" {
		attrs = append(attrs, "sink", sink)
	}
	if rw.key != "" {
		attrs = append(attrs, "key", rw.key)
	}
	attrs = append(attrs, "error", err)
	r.log.Warn(msg, attrs...)
}

// Run delivers events until ctx ends, then stops claiming, finishes and
// records the batch in flight (within ShutdownTimeout), gives back its
// leases and returns nil. It returns an error only when it cannot start:
// the schema is missing or newer than this relay.
func (r *Relay) Run(ctx context.Context) error {
	if err := migrations.Check(ctx, r.pool, r.cfg.Tables); err != nil {
		return err
	}
	// Work in flight may outlive ctx by ShutdownTimeout.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopAfter := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, cancelWork)
	})
	defer stopAfter()

	var listening sync.WaitGroup
	if !r.cfg.PollOnly {
		listening.Add(1)
		go func() {
			defer listening.Done()
			r.listen(ctx)
		}()
	}
	r.log.Info("relay: started", "tables", r.cfg.Tables.Outbox(), "batch_size", r.cfg.BatchSize,
		"lease", r.cfg.Lease, "poll_only", r.cfg.PollOnly)

	r.loop(ctx, work)
	if err := r.awaitRecord(); err != nil {
		r.log.Warn("relay: last batch not recorded; it will be redelivered", "error", err)
	}
	r.flushStats(work)

	listening.Wait()
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.store.releaseAll(releaseCtx); err != nil {
		r.log.Warn("relay: could not release leases; they expire on their own", "error", err)
	}
	r.log.Info("relay: stopped")
	return nil
}

const (
	// lingerFor and lingerEvery: after finding work, look again this often
	// for this long, catching events whose notification was debounced.
	lingerFor   = 250 * time.Millisecond
	lingerEvery = 5 * time.Millisecond
	// maintainEvery spaces stale-hold cleanup and the retention cleaner.
	maintainEvery = 10 * time.Second
	// statsEvery spaces the flushes of published counts to the stats table.
	statsEvery = 5 * time.Second
)

func (r *Relay) loop(ctx, work context.Context) {
	var (
		lastWork     time.Time
		nextLanes    time.Time
		nextMaintain = time.Now().Add(maintainEvery)
		nextStats    = time.Now().Add(statsEvery)
		failures     int
		timer        = time.NewTimer(0)
	)
	defer timer.Stop()
	<-timer.C
	laneEvery := min(r.cfg.Lease/3, 2*time.Second)
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(nextLanes) {
			if err := r.refreshLanes(work); err != nil {
				r.log.Warn("relay: renewing lanes failed", "error", err)
			}
			nextLanes = now.Add(laneEvery)
		}
		if !now.Before(nextMaintain) {
			if purged, err := r.store.maintain(work, r.cfg.Retention); err != nil {
				r.log.Warn("relay: maintenance failed", "error", err)
			} else if purged > 0 {
				r.log.Info("relay: removed delivered events past retention", "count", purged)
			}
			nextMaintain = now.Add(maintainEvery)
		}
		if !now.Before(nextStats) {
			r.flushStats(work)
			nextStats = now.Add(statsEvery)
		}
		n, err := r.cycle(work)
		if err != nil {
			failures++
			delay := min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)
			r.log.Warn("relay: cycle failed; retrying", "error", err, "retry_in", delay)
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
		wait := r.cfg.PollInterval
		if time.Since(lastWork) < lingerFor {
			wait = min(wait, lingerEvery)
		}
		wait = min(wait, time.Until(nextLanes), time.Until(nextMaintain), time.Until(nextStats))
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
		case <-r.wake:
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

func (r *Relay) refreshLanes(ctx context.Context) error {
	start := time.Now()
	mask, err := r.store.refreshLanes(ctx, r.cfg.Lease)
	if err != nil {
		return err
	}
	if mask != r.mask {
		r.log.Debug("relay: lanes changed", "held", popcount(mask))
	}
	r.mask = mask
	// Leases were renewed at or after start; trust them for most of a lease.
	r.lanesValidUntil = start.Add(r.cfg.Lease * 2 / 3)
	return nil
}

func popcount(m uint64) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// cycle claims one batch, publishes it and records the outcome. It returns
// the number of events claimed.
func (r *Relay) cycle(ctx context.Context) (int, error) {
	mask := r.mask
	if time.Now().After(r.lanesValidUntil) {
		mask = 0 // lane leases may have lapsed: only events without a key
	}
	start := time.Now()
	rows, err := r.store.claim(ctx, mask, r.cfg.BatchSize, r.cfg.Lease, r.sinkNames)
	if err != nil {
		return 0, err
	}
	r.cfg.Observer.Claimed(len(rows), time.Since(start))
	if len(rows) == 0 {
		return 0, r.awaitRecord()
	}
	leaseEnd := start.Add(r.cfg.Lease)

	b := r.newBatch(rows, time.Now())
	b.plan()
	pubCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	b.publish(pubCtx)
	cancel()
	b.now = time.Now()
	b.settle()
	o := b.outcome()
	if b.counts.retried+b.counts.dead+b.counts.paused > 0 {
		r.log.Debug("relay: batch settled", "claimed", len(rows), "done", b.counts.done,
			"retried", b.counts.retried, "dead", b.counts.dead, "parked", b.counts.parked, "paused", b.counts.paused)
	}

	// The previous batch's record must be in before this one's.
	if err := r.awaitRecord(); err != nil {
		return len(rows), err
	}
	if o.onlyDone() {
		// Nothing in this outcome affects what the next claim may take (no
		// holds, no retry times; these rows stay leased until deleted), so
		// the DELETE runs while the next batch is claimed and published.
		r.recording = make(chan error, 1)
		go func() { r.recording <- r.record(ctx, o, leaseEnd, len(rows)) }()
		return len(rows), nil
	}
	return len(rows), r.record(ctx, o, leaseEnd, len(rows))
}

// awaitRecord waits for the batch being recorded in the background, if any.
func (r *Relay) awaitRecord() error {
	if r.recording == nil {
		return nil
	}
	err := <-r.recording
	r.recording = nil
	return err
}

// record writes a batch's outcome. A passing database failure must not lose
// it: it is retried until the batch's lease would run out (after that,
// another relay delivers the events again).
func (r *Relay) record(ctx context.Context, o *outcome, leaseEnd time.Time, n int) error {
	for attempt := 1; ; attempt++ {
		start := time.Now()
		err := r.store.record(ctx, o, r.cfg.Retention > 0)
		if err == nil {
			r.cfg.Observer.Recorded(n, time.Since(start))
			return nil
		}
		delay := min(time.Duration(attempt)*200*time.Millisecond, 2*time.Second)
		if time.Now().Add(delay).After(leaseEnd) || ctx.Err() != nil {
			return fmt.Errorf("recording batch of %d events (they will be redelivered after their lease): %w", n, err)
		}
		r.log.Warn("relay: recording failed; retrying", "error", err, "attempt", attempt)
		if !sleep(ctx, delay) {
			return fmt.Errorf("recording batch of %d events: %w", n, err)
		}
	}
}

// statKey is one row of the stats table.
type statKey struct {
	minute      time.Time
	sink, topic string
}

// countPublished adds one published event to the in-memory counts.
func (r *Relay) countPublished(sink, topic string, at time.Time) {
	r.stats[statKey{at.UTC().Truncate(time.Minute), sink, topic}]++
}

// flushStats adds the in-memory counts to the stats table and removes rows
// older than a day. Counts that could not be written are kept for the next
// flush.
func (r *Relay) flushStats(ctx context.Context) {
	if len(r.stats) == 0 {
		return
	}
	if err := r.store.flushStats(ctx, r.stats); err != nil {
		r.log.Warn("relay: writing published counts failed; will retry", "error", err)
		if len(r.stats) > 100000 {
			clear(r.stats) // bounded memory while the database is away
		}
		return
	}
	clear(r.stats)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// listen holds a connection LISTENing on the outbox channel and wakes the
// loop on each notification, reconnecting with backoff when it drops.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		failures++
		delay := min(time.Duration(failures)*250*time.Millisecond, 5*time.Second)
		r.log.Warn("relay: LISTEN connection lost; polling until it is back", "error", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connecting to listen: %w", err)
	}
	// A LISTENing session must not go back to the pool.
	defer func() {
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+r.cfg.Tables.ChannelIdent()); err != nil {
		return fmt.Errorf("listening on %s: %w", r.cfg.Tables.Channel(), err)
	}
	r.signal() // events may have arrived while not listening
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		r.signal()
	}
}

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
