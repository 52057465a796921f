package relay

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/internal/routefilter"
	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/relay/internal/throughput"
	"github.com/heraldhq/herald/sinks"
)

// Relay claims, publishes and records outbox events. Create it with NewPostgres or NewMySQL and
// call Run; several relays (in one process or many) may share a database.
type Relay struct {
	cfg Config
	// store is the database: every worker's session, the vacuum loop and
	// the wake-ups go through it.
	store   store.Store
	routes  []route
	log     *slog.Logger
	workers []*worker

	// routeMu guards routeCache: each topic's candidate routes and metrics
	// label.
	routeMu    sync.Mutex
	routeCache map[string]topicInfo

	// sinkStates holds every sink of every route by name; sinkNames lists
	// them, sorted.
	sinkStates map[string]*sinkState
	sinkNames  []string
	// fanOut is the most sinks a route names.
	fanOut int

	// pausedMu guards pausedSince (sink → paused since), written when a
	// sink is paused or resumed and read by PausedSinks, recordErrs
	// (worker → the failure of its record, since when), read by
	// RecordFailure, and supersededSince, read by Superseded.
	pausedMu    sync.Mutex
	pausedSince map[string]time.Time
	// pauseErr is each paused sink's latest error, under pausedMu.
	pauseErr   map[string]error
	recordErrs map[*worker]recordFailure
	// supersededSince holds, per worker, since when its lane refreshes
	// have found a newer configuration live.
	supersededSince map[*worker]time.Time
	// config is the fingerprint of the routes (see configFingerprint).
	config string
	// throughput counts each sink's deliveries and failures over the
	// recent past, for the admin console's charts.
	throughput *throughput.History

	// tracer is nil when tracing is off.
	tracer trace.Tracer

	// checksMu guards checks, the latest check of each sinks.Checker.
	checksMu sync.Mutex
	checks   map[string]SinkCheck

	// recorded counts events recorded since the vacuum loop was last asked
	// to look at dead tuples (vacuumCheck); queued, deliveries queued since
	// it was last asked to look at the tables' growth.
	recorded    atomic.Int64
	queued      atomic.Int64
	vacuumCheck chan struct{}
	// unconfigured holds, under unconfiguredMu, the deliveries waiting for
	// each sink the routes do not name (reportUnconfigured).
	unconfiguredMu sync.Mutex
	unconfigured   map[string]int64

	// vacuumEvery spaces the vacuum loop's own looks: maintainEvery. Tests
	// change it to tell the vacuums it asks for from those of its looks.
	vacuumEvery time.Duration
}

type route struct {
	index    int // in Config.Routes, for messages
	patterns []string
	where    *routefilter.Filter // nil: every event of the topics
	targets  []routeTarget
	// filterErrs counts evaluations of where that failed; the first is
	// logged.
	filterErrs atomic.Int64
}

type routeTarget struct {
	Target
	state *sinkState
}

// newRelay returns a relay on st publishing through the sinks named in
// cfg.Routes, which has its defaults.
func newRelay(st store.Store, cfg Config) *Relay {
	history := throughput.New(throughputWindow, throughputStep)
	cfg.Observer = Observers(cfg.Observer, throughputObserver{history: history})
	r := &Relay{
		throughput:      history,
		cfg:             cfg,
		store:           st,
		log:             cfg.Logger.With("relay", cfg.Owner),
		routeCache:      map[string]topicInfo{},
		sinkStates:      map[string]*sinkState{},
		checks:          map[string]SinkCheck{},
		pausedSince:     map[string]time.Time{},
		pauseErr:        map[string]error{},
		recordErrs:      map[*worker]recordFailure{},
		supersededSince: map[*worker]time.Time{},
		config:          configFingerprint(cfg.Routes),
		vacuumCheck:     make(chan struct{}, 1),
		vacuumEvery:     maintainEvery,
	}
	for i := range cfg.Workers {
		owner := cfg.Owner
		if cfg.Workers > 1 {
			owner = fmt.Sprintf("%s/%d", cfg.Owner, i)
		}
		r.workers = append(r.workers, &worker{
			r:       r,
			index:   i,
			store:   &session{store: st, owner: owner, config: r.config},
			log:     cfg.Logger.With("relay", owner),
			wake:    make(chan struct{}, 1),
			relane:  make(chan struct{}, 1),
			results: make(chan struct{}, 1),
			stats:   map[store.StatKey]int64{},
			skip:    map[int64]skipEntry{},
		})
	}
	if cfg.TracerProvider != nil {
		r.tracer = cfg.TracerProvider.Tracer("github.com/heraldhq/herald/relay")
	}
	r.routes = make([]route, len(cfg.Routes))
	for i, rc := range cfg.Routes {
		rt := &r.routes[i]
		rt.index, rt.patterns, rt.where = i, rc.Topics, rc.Where
		for _, t := range rc.Targets {
			st := r.sinkStates[t.Sink.Name()]
			if st == nil {
				st = &sinkState{Sink: t.Sink, name: t.Sink.Name(),
					maxInFlight: int64(cfg.MaxInFlight), maxInFlightBytes: cfg.MaxBatchBytes}
				if c, ok := t.Sink.(sinks.ConcurrentPublisher); !ok || !c.PublishesConcurrently() {
					st.turn = make(chan struct{}, 1)
				}
				r.sinkStates[st.name] = st
				r.sinkNames = append(r.sinkNames, st.name)
			}
			rt.targets = append(rt.targets, routeTarget{Target: t, state: st})
		}
		r.fanOut = max(r.fanOut, len(rt.targets))
	}
	slices.Sort(r.sinkNames)
	// Every sink's paused gauge exists from the start, at 0: an alert on
	// it has a series to watch before the first outage.
	for _, name := range r.sinkNames {
		cfg.Observer.SinkPaused(name, false)
		cfg.Observer.SinkInFlight(name, 0)
	}
	return r
}

// has reports whether the route sends to the sink named sink.
func (rt *route) has(sink string) bool { return rt.target(sink) != nil }

// target returns the route's target for the sink named sink, or nil.
func (rt *route) target(sink string) *routeTarget {
	for i := range rt.targets {
		if rt.targets[i].state.name == sink {
			return &rt.targets[i]
		}
	}
	return nil
}

// queueClaim is what a claim takes from the queues: from each of sinks
// (the earlier first when the claim's bytes run short), at most heads due
// heads and rows deliveries, shared between the heads, and at most chain
// rows a head.
type queueClaim struct {
	sinks              []string
	heads, rows, chain []int32
}

func (q *queueClaim) add(sink string, heads, rows, chain int32) {
	q.sinks = append(q.sinks, sink)
	q.heads, q.rows, q.chain = append(q.heads, heads), append(q.rows, rows), append(q.chain, chain)
}

// rotate makes the sink at turn (modulo their number) come first.
func (q *queueClaim) rotate(turn int) {
	turn %= len(q.sinks)
	q.sinks = slices.Concat(q.sinks[turn:], q.sinks[:turn])
	q.heads = slices.Concat(q.heads[turn:], q.heads[:turn])
	q.rows = slices.Concat(q.rows[turn:], q.rows[:turn])
	q.chain = slices.Concat(q.chain[turn:], q.chain[:turn])
}

// queueSinks lists the queues to claim from at now: the routing step's
// ("") and every sink's that is neither paused nor busy, share heads and
// rows each, no more than the sink has room for (one head for a probe),
// and no longer a chain a head than the sink answers in half a publish
// (see sinkState.chainTime).
func (r *Relay) queueSinks(now time.Time, share int32) *queueClaim {
	q := &queueClaim{}
	q.add("", share, share, share)
	for _, name := range r.sinkNames {
		st := r.sinkStates[name]
		room := int32(min(st.room(), int(share)))
		chain := room
		if t := st.chainTime.Load(); t > 0 {
			chain = int32(max(min(int64(r.cfg.PublishTimeout/2)/t, int64(room)), 1))
		}
		switch {
		case st.pausedTill().After(now):
		case room <= 0:
			st.busy.Store(true) // the answer that makes room wakes the workers
		case st.probing(now):
			// A probe claims one queue: if the sink is still down, the
			// heads of the others were not read for nothing. (One
			// delivery would do, but a queue cut short must then have
			// its next delivery made head, a write more.)
			q.add(name, 1, room, chain)
		default:
			q.add(name, room, room, chain)
		}
	}
	return q
}

// handOffAfter is how long a batch waits for its sinks' answers: at least
// Config.HandOffAfter, and four times what the relay's fastest sink
// usually takes to answer an event. A sink is slow next to the others: on
// a host where everything takes longer (a loaded machine, a pause of the
// runtime), the fastest sink takes longer too, and handing events off
// would only write rows for nothing.
func (r *Relay) handOffAfter() time.Duration {
	var fastest int64
	for _, s := range r.sinkStates {
		if t := s.answerTime.Load(); t > 0 && (fastest == 0 || t < fastest) {
			fastest = t
		}
	}
	return max(r.cfg.HandOffAfter, 4*time.Duration(fastest))
}

// now is this host's time (Config.Clock).
func (r *Relay) now() time.Time { return r.cfg.Clock() }

// sinkFreed tells every worker that a sink that was busy has room again:
// its queue is worth claiming now.
func (r *Relay) sinkFreed() { r.signal(true) }

// topicInfo is what the relay knows of a topic: the routes whose patterns
// match it, in order (the first whose filter passes applies to an event),
// and its label in metrics and published counts.
type topicInfo struct {
	routes []*route
	label  string
}

// topic returns what the relay knows of topic, from a bounded cache. Only
// the candidate routes are cached: with filters, which one applies depends
// on the event.
func (r *Relay) topic(topic string) topicInfo {
	r.routeMu.Lock()
	defer r.routeMu.Unlock()
	if info, ok := r.routeCache[topic]; ok {
		return info
	}
	info := topicInfo{label: OtherTopics}
	for i := range r.routes {
		if slices.ContainsFunc(r.routes[i].patterns, func(p string) bool { return MatchTopic(p, topic) }) {
			info.routes = append(info.routes, &r.routes[i])
			if r.routes[i].where == nil {
				break // the later ones are never reached
			}
		}
	}
	for _, p := range r.cfg.MetricsTopics {
		if MatchTopic(p, topic) {
			info.label = p
			break
		}
	}
	if len(r.routeCache) >= 10000 {
		clear(r.routeCache) // bounded memory against unbounded topic names
	}
	r.routeCache[topic] = info
	return info
}

// route returns the route that applies to it: the first whose topic
// patterns match and whose filter, if any, passes. With none it returns
// nil and why, naming the routes whose filters did not pass and the
// errors of those that failed. A filter that fails on an event (a missing
// field, the cost limit) does not apply to it; the first failure of each
// route is logged and all are counted (FilterErrors).
func (r *Relay) route(it *item) (*route, error) {
	candidates := r.topic(it.topic).routes
	if len(candidates) == 0 {
		return nil, fmt.Errorf("no route matches topic %q", it.topic)
	}
	if candidates[0].where == nil {
		return candidates[0], nil // the common case: no event data read
	}
	ev := routefilter.Event{Topic: it.topic, Key: it.key, Headers: it.headers,
		Payload: it.payload, JSON: sinks.IsJSON(it.contentType)}
	var why []string
	for _, rt := range candidates {
		if rt.where == nil {
			return rt, nil
		}
		ok, err := rt.where.Match(&ev)
		switch {
		case err != nil:
			if rt.filterErrs.Add(1) == 1 {
				r.log.Warn("relay: a route's where filter failed on an event, so the route does not apply to it (logged once per route; FilterErrors counts them)",
					"route", rt.index, "where", rt.where.String(), "event", it.id, "error", err)
			}
			why = append(why, fmt.Sprintf("routes[%d] where failed: %v", rt.index, err))
		case ok:
			return rt, nil
		default:
			why = append(why, fmt.Sprintf("routes[%d] where is false", rt.index))
		}
	}
	return nil, fmt.Errorf("no route matches event %s of topic %q: %s", it.id, it.topic, strings.Join(why, "; "))
}

// FilterErrors returns, for each route in Config.Routes order, how many
// times its where filter failed on an event (an evaluation error: a
// missing field, a type mismatch, the cost limit) since the relay started.
// Filters run again when a delivery is retried, so a retried event may
// count more than once.
func (r *Relay) FilterErrors() []int64 {
	out := make([]int64, len(r.routes))
	for i := range r.routes {
		out[i] = r.routes[i].filterErrs.Load()
	}
	return out
}

// label returns topic's label in metrics and published counts.
func (r *Relay) label(topic string) string { return r.topic(topic).label }

func (r *Relay) maxAttempts(it *item) int {
	if it.maxAttempts > 0 {
		return it.maxAttempts
	}
	return r.cfg.MaxAttempts
}

// retryDelay is the backoff for the given attempt, or the destination's own
// delay when the sink marked the error with sinks.RetryAfter (capped at the
// backoff maximum, so a hostile Retry-After cannot park an event for years).
func (r *Relay) retryDelay(err error, attempt int) time.Duration {
	if d, ok := sinks.RetryDelay(err); ok && d > 0 {
		return min(d, r.cfg.Backoff.Max)
	}
	return r.cfg.Backoff.Delay(attempt)
}

func (r *Relay) pause(s *sinkState, err error) {
	s.mu.Lock()
	s.failures++
	failures := s.failures
	s.pausedUntil = r.now().Add(r.cfg.SinkPause.Delay(failures))
	s.down.Store(true)
	s.pauses.Add(1)
	until := s.pausedUntil
	s.mu.Unlock()
	if failures == 1 {
		r.cfg.Observer.SinkPaused(s.name, true)
	}
	r.pausedMu.Lock()
	if failures == 1 {
		r.pausedSince[s.name] = time.Now()
	}
	r.pauseErr[s.name] = err
	r.pausedMu.Unlock()
	r.log.Warn("relay: sink is down, pausing it; its events wait without spending attempts",
		"sink", s.name, "until", until, "consecutive_failures", failures, "error", err)
}

func (r *Relay) resume(s *sinkState) {
	s.mu.Lock()
	failures := s.failures
	s.failures, s.pausedUntil = 0, time.Time{}
	s.down.Store(false)
	s.mu.Unlock()
	if failures == 0 {
		return
	}
	r.log.Info("relay: sink is back", "sink", s.name, "after_failures", failures)
	r.cfg.Observer.SinkPaused(s.name, false)
	r.pausedMu.Lock()
	delete(r.pausedSince, s.name)
	delete(r.pauseErr, s.name)
	r.pausedMu.Unlock()
	// Its queue drains from now, not from the workers' next poll.
	r.signal(true)
}

// probeStarted re-arms the pause of a sink whose pause is over, as a call
// to it starts: that call is its probe. Until the probe answers (a
// delivery resumes the sink, a refusal pauses it again) or the pause ends
// once more, no other call goes to the sink, however long the probe takes
// to fail: a sink that is down gets one call per pause, not one per batch.
func (r *Relay) probeStarted(s *sinkState) {
	if !s.down.Load() {
		return
	}
	now := r.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures > 0 && !s.pausedUntil.After(now) {
		s.pausedUntil = now.Add(r.cfg.SinkPause.Delay(s.failures))
	}
}

// nextProbe is the earliest end of a sink's pause (Config.Clock), when the
// sink's queue is claimed again to find out whether it is back; zero when
// no sink is paused.
func (r *Relay) nextProbe() time.Time {
	var next time.Time
	for _, s := range r.sinkStates {
		s.mu.Lock()
		if s.failures > 0 && (next.IsZero() || s.pausedUntil.Before(next)) {
			next = s.pausedUntil
		}
		s.mu.Unlock()
	}
	return next
}

// recordFailure is a worker's record failing since a time.
type recordFailure struct {
	since time.Time
	err   error
}

// recordFailed notes that w's record failed with err, or succeeded (nil).
func (r *Relay) recordFailed(w *worker, err error) {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	switch f, failing := r.recordErrs[w]; {
	case err == nil && failing:
		delete(r.recordErrs, w)
		w.log.Info("relay: recording works again; publishing resumes", "after", time.Since(f.since).Round(time.Millisecond))
	case err != nil && failing:
		r.recordErrs[w] = recordFailure{f.since, err}
	case err != nil:
		r.recordErrs[w] = recordFailure{time.Now(), err}
	}
}

// setSuperseded notes whether a relay with a newer configuration than
// this one's is live, as w's last lane refresh found.
func (r *Relay) setSuperseded(w *worker, superseded bool) {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	since, was := r.supersededSince[w]
	switch {
	case superseded && !was:
		r.supersededSince[w] = time.Now()
		w.log.Warn("relay: a relay with a newer configuration (routes and sinks) is live; this relay claims nothing until it is the newest again",
			"config", r.config)
	case !superseded && was:
		delete(r.supersededSince, w)
		w.log.Info("relay: this relay's configuration is the newest live again; claiming resumes",
			"config", r.config, "after", time.Since(since).Round(time.Millisecond))
	}
}

// Superseded reports since when a relay with a newer configuration (other
// routes or sinks) has been live on this outbox, the zero time when none
// is. While one is, this relay claims nothing: during a rolling change of
// routes, no event is routed by the configuration being replaced. It is
// safe to call from any goroutine.
func (r *Relay) Superseded() time.Time {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	var since time.Time
	for _, s := range r.supersededSince {
		if since.IsZero() || s.Before(since) {
			since = s
		}
	}
	return since
}

// ConfigFingerprint returns the fingerprint of the relay's routes and sinks
// that relays sharing its outbox compare.
func (r *Relay) ConfigFingerprint() string { return r.config }

// SinkNames returns the names of the sinks the relay's routes send to,
// sorted.
func (r *Relay) SinkNames() []string { return slices.Clone(r.sinkNames) }

// RouteSinks returns the sinks an event of topic may be sent to: those of
// the first route whose patterns match it and has no where filter, and of
// every route with a filter before it (which one applies depends on the
// event). It returns none when no route matches.
func (r *Relay) RouteSinks(topic string) []string {
	var names []string
	for _, rt := range r.topic(topic).routes {
		for _, t := range rt.targets {
			if !slices.Contains(names, t.state.name) {
				names = append(names, t.state.name)
			}
		}
	}
	return names
}

// Retention returns how long the relay keeps a delivered event's row
// (Config.Retention, after defaults).
func (r *Relay) Retention() time.Duration { return r.cfg.Retention }

// pausedSinkNames returns the names of the sinks paused now, sorted.
func (r *Relay) pausedSinkNames() []string {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	names := make([]string, 0, len(r.pausedSince))
	for name := range r.pausedSince {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// RecordFailure reports since when the relay has been unable to record what
// it published (the database refuses, or its role lost a privilege), and the
// latest error; the zero time when it records fine. While it cannot, it
// publishes nothing more. It is safe to call from any goroutine.
func (r *Relay) RecordFailure() (since time.Time, err error) {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	for _, f := range r.recordErrs {
		if since.IsZero() || f.since.Before(since) {
			since, err = f.since, f.err
		}
	}
	return since, err
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

// PauseErrors returns, for each sink paused because it is down, the error
// of its latest failed publish or probe. It is safe to call from any
// goroutine.
func (r *Relay) PauseErrors() map[string]error {
	r.pausedMu.Lock()
	defer r.pausedMu.Unlock()
	return maps.Clone(r.pauseErr)
}

func (r *Relay) logEvent(it *item, sink, msg string, err error, attrs ...any) {
	attrs = append(attrs, "event_id", it.id, "topic", it.topic)
	if sink != "" {
		attrs = append(attrs, "sink", sink)
	}
	if it.key != "" {
		attrs = append(attrs, "key", it.key)
	}
	attrs = append(attrs, "error", err)
	r.log.Warn(msg, attrs...)
}

// Run delivers events until ctx ends, then stops claiming, finishes and
// records the batch in flight (within ShutdownTimeout), gives back its
// lanes and returns nil. It returns an error only when it cannot start:
// the schema is missing or newer than this relay, or a relay with the same
// owner name is running (the two would share lanes).
func (r *Relay) Run(ctx context.Context) error {
	if err := r.store.CheckSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	for _, w := range r.workers {
		until, err := w.store.ownerLive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !until.IsZero() {
			return fmt.Errorf("relay.owner: a relay named %q is already running (its heartbeat lasts until %s); "+
				"two relays with one name would share lanes", w.store.owner, until.UTC().Format(time.RFC3339))
		}
	}
	if err := r.prepareLog(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// Work in flight may outlive ctx by ShutdownTimeout.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopAfter := context.AfterFunc(ctx, func() {
		time.AfterFunc(r.cfg.ShutdownTimeout, cancelWork)
	})
	defer stopAfter()

	// Connect to the sinks now, so that a wrong address shows at start
	// (in the log and on /readyz), not at the first event.
	r.checkSinks(ctx)
	var background sync.WaitGroup
	background.Add(1)
	go func() {
		defer background.Done()
		r.sinkCheckLoop(ctx)
	}()
	if !r.cfg.PollOnly {
		background.Add(1)
		go func() {
			defer background.Done()
			r.listen(ctx)
		}()
	}
	background.Add(1)
	go func() {
		defer background.Done()
		r.vacuumLoop(ctx)
	}()
	r.log.Info("relay: started", "tables", r.cfg.Tables.Outbox(), "workers", len(r.workers),
		"batch_size", r.cfg.BatchSize, "lease", r.cfg.Lease, "poll_only", r.cfg.PollOnly, "config", r.config)

	// Announce every worker before any takes lanes, so that the first
	// split into blocks already counts them all.
	for _, w := range r.workers {
		if err := w.store.heartbeat(ctx, r.cfg.Lease); err != nil {
			r.log.Warn("relay: announcing worker failed; it will retry", "error", err)
		}
	}
	var working sync.WaitGroup
	for _, w := range r.workers {
		working.Add(1)
		go func() {
			defer working.Done()
			w.run(ctx, work)
		}()
	}
	working.Wait()
	background.Wait()
	r.log.Info("relay: stopped")
	return nil
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

// listen wakes the workers whenever the store says work may have arrived
// (LISTEN on PostgreSQL), starting again with backoff when it loses its
// means of knowing; the workers poll meanwhile.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := r.store.Listen(ctx, r.signal)
		if ctx.Err() != nil {
			return
		}
		failures++
		delay := min(time.Duration(failures)*250*time.Millisecond, 5*time.Second)
		r.log.Warn("relay: lost the database's wake-ups (LISTEN on PostgreSQL); polling until they are back", "error", err, "retry_in", delay)
		if !sleep(ctx, delay) {
			return
		}
	}
}

// Wake tells the relay that events were just committed, so that its idle
// workers claim them now rather than at their next look. An application
// that runs the relay in its own process calls it after the Commit of a
// transaction that enqueued events: on MySQL, which has no LISTEN/NOTIFY,
// the relay otherwise finds them by polling, up to Config.PollInterval
// later while it is idle. On PostgreSQL the commit's notification does the
// same, and Wake only saves its round trip. Wake never blocks, is safe for
// concurrent use and costs nothing when the workers are busy; a call before
// Run only makes the first look come sooner.
func (r *Relay) Wake() { r.signal(false) }

// relaneSiblings asks the other workers to refresh their lanes now.
func (r *Relay) relaneSiblings(from *worker) {
	for _, w := range r.workers {
		if w != from {
			select {
			case w.relane <- struct{}{}:
			default:
			}
		}
	}
}

// signal wakes every worker that is waiting for work, telling it to look at
// its queues too when queues is set.
func (r *Relay) signal(queues bool) {
	for _, w := range r.workers {
		if queues {
			w.queuesDirty.Store(true)
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}
