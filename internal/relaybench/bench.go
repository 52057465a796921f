package relaybench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
)

// Result is what a run measured.
type Result struct {
	Mode         Mode   `json:"mode"`
	Sink         string `json:"sink"`
	Schema       string `json:"schema"`
	Relays       int    `json:"relays"`
	BatchSize    int    `json:"batch_size"`
	Workers      int    `json:"workers"`
	PollOnly     bool   `json:"poll_only"`
	Keys         int    `json:"keys"`
	PayloadBytes int    `json:"payload_bytes"`

	// Events is the number of events committed in the measured phase.
	Events int `json:"events"`
	// History is Config.History: events drained before the measured phase.
	History int `json:"history,omitempty"`
	// ElapsedSeconds is the measured phase: from the backlog's commit to the
	// last event recorded (drain), or from the producers' start to the last
	// event recorded (live, isolation). In hotkey, from the commit of the
	// other keys' events until the outbox was found empty (polled every
	// 5ms); in outage, until both tables were, the outage included.
	ElapsedSeconds float64 `json:"elapsed_s"`
	// EventsPerSecond is Events over ElapsedSeconds.
	EventsPerSecond float64 `json:"events_per_s"`
	// Latency is commit-to-acknowledgement per event (live mode only).
	Latency *Percentiles `json:"latency_ms,omitempty"`
	// Insert is an application's INSERT during a drain on MySQL.
	Insert *InsertResult `json:"insert,omitempty"`
	// Claim and Record are the relays' per-batch claim and record round
	// trips (batches that claimed nothing are left out of Claim).
	Claim *Percentiles `json:"claim_ms,omitempty"`
	// Publish is the sink's Publish calls, when the engine reports them.
	Publish   *Percentiles `json:"publish_ms,omitempty"`
	Record    *Percentiles `json:"record_ms,omitempty"`
	MeanBatch float64      `json:"mean_batch"`
	// Failures counts deliveries that failed: to retry, not sent because
	// their sink was paused, or dead-lettered (relay.Observer.Failed).
	Failures   int64   `json:"failed_deliveries"`
	CPUSeconds float64 `json:"cpu_s"`
	// CPUCores is CPUSeconds over ElapsedSeconds.
	CPUCores float64 `json:"cpu_cores"`
	// CPUScope says what CPUSeconds includes.
	CPUScope string `json:"cpu_scope"`
	// DatabaseCPUSeconds is the CPU time every process of the PostgreSQL
	// server used over the measured phase (its backends, the WAL sender
	// of a slot, autovacuum, checkpoints), when the server runs on this
	// host; 0 otherwise.
	DatabaseCPUSeconds float64 `json:"db_cpu_s,omitempty"`
	// WriteDatabaseCPUSeconds is the server's CPU time writing a drain's
	// backlog (inserting the rows, or emitting the events into the WAL,
	// server-side, before the commit), on the same terms.
	WriteDatabaseCPUSeconds float64 `json:"db_write_cpu_s,omitempty"`
	PeakRSSBytes            int64   `json:"peak_rss_bytes"`
	// RSSScope says over what PeakRSSBytes is the peak.
	RSSScope string `json:"rss_scope"`
	// RecorderBytes is the memory the recording of deliveries holds
	// (included in PeakRSSBytes).
	RecorderBytes int64 `json:"recorder_bytes"`
	// LanesSettled is whether the relays had shared the lanes out before
	// the measured phase began.
	LanesSettled bool            `json:"lanes_settled"`
	Producers    *ProducerResult `json:"producers,omitempty"`
	// Intervals are the reports every Config.ReportEvery.
	Intervals []Interval `json:"intervals,omitempty"`
	// Minutes are the reports of each minute of the producers' run
	// (ModeIsolation).
	Minutes []Interval `json:"minutes,omitempty"`
	// Outage, Isolation and HotKey are the figures of their modes.
	Outage    *OutageResult    `json:"outage,omitempty"`
	Isolation *IsolationResult `json:"isolation,omitempty"`
	HotKey    *HotKeyResult    `json:"hot_key,omitempty"`
	// Slow, Recovery, Skew, Binary and Idle are the figures of their modes.
	Slow     *SlowResult     `json:"slow,omitempty"`
	Recovery *RecoveryResult `json:"recovery,omitempty"`
	Skew     *SkewResult     `json:"skew,omitempty"`
	Binary   *BinaryResult   `json:"binary,omitempty"`
	Idle     *IdleResult     `json:"idle,omitempty"`
	// RowsLeft is the outbox rows left once the relays stopped.
	RowsLeft int64 `json:"rows_left"`
	// Verification covers every sink: an event counts as delivered when
	// every sink acknowledged it, and duplicates and order violations are
	// summed over the sinks.
	Verification Verification `json:"verification"`
	// Sinks is each sink's own verification, when the route has several.
	Sinks []SinkResult `json:"sinks,omitempty"`
}

// SinkResult is one sink of a run whose route has several.
type SinkResult struct {
	Name         string       `json:"name"`
	Verification Verification `json:"verification"`
}

// Percentiles summarises durations, in milliseconds.
type Percentiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// ProducerResult is the producers' side of a live run.
type ProducerResult struct {
	Producers int `json:"producers"`
	// TxEvents is the number of events each transaction commits.
	TxEvents int `json:"tx_events"`
	// TargetRate is the rate asked for, in events per second; -1 for as
	// fast as they can.
	TargetRate int `json:"target_rate"`
	// CommitRate is the events committed per second with the relays running.
	CommitRate float64 `json:"commit_rate"`
	Errors     int64   `json:"errors"`
	// BaselineCommitRate is the commit rate with no relay (0 without
	// Config.Baseline).
	BaselineCommitRate float64 `json:"baseline_commit_rate,omitempty"`
	// Ratio is CommitRate over BaselineCommitRate.
	Ratio float64 `json:"ratio,omitempty"`
}

// Interval is one periodic report. With two sinks, EventsPerSecond and the
// latencies are the sink "up"'s.
type Interval struct {
	AtSeconds       float64 `json:"at_s"`
	EventsPerSecond float64 `json:"events_per_s"`
	LatencyP50      float64 `json:"latency_p50_ms,omitempty"`
	LatencyP99      float64 `json:"latency_p99_ms,omitempty"`
	// ClaimP50 and ClaimP99 are the claims that returned events in the
	// interval, in milliseconds: a claim that slows as the table ages
	// shows here.
	ClaimP50   float64 `json:"claim_p50_ms,omitempty"`
	ClaimP99   float64 `json:"claim_p99_ms,omitempty"`
	Backlog    int64   `json:"backlog"`
	TableBytes int64   `json:"table_bytes"`
	DeadTuples int64   `json:"dead_tuples"`
	// HistoryLength is InnoDB's history list length (MySQL), in place of
	// DeadTuples.
	HistoryLength *int64  `json:"history_list_length,omitempty"`
	CommitRate    float64 `json:"commit_rate,omitempty"`
	// Phase places the interval against the outage (ModeOutage,
	// ModeIsolation): before, during, after, or mixed when it spans the
	// outage's start or end.
	Phase string `json:"phase,omitempty"`
	// P99Ratio is LatencyP99 over the p99 of the whole phase before the
	// outage (ModeIsolation).
	P99Ratio float64 `json:"p99_ratio,omitempty"`
	// DownQueue is the deliveries waiting for the sink "down" at the
	// interval's end (those in flight included, until their results are
	// recorded); DownEventsPerSecond, the events it acknowledged.
	DownQueue           *int64  `json:"down_queue,omitempty"`
	DownEventsPerSecond float64 `json:"down_events_per_s,omitempty"`
	// DownBacklog is, with live producers, the events committed that
	// "down" had not received yet at the interval's end: what it has to
	// catch up on, counted by the bench rather than from the queue's rows
	// (a delivery in flight stays a row until its call's results are
	// recorded).
	DownBacklog *int64 `json:"down_backlog,omitempty"`
}

// run is one benchmark run's state.
type run struct {
	cfg    Config
	log    *slog.Logger
	ids    idCodec
	name   string // unique run name (hex)
	tables migrations.Tables
	// admin is the bench's pool on PostgreSQL; my is nil there and holds
	// the run's state on MySQL, where admin is nil.
	admin  *pgxpool.Pool
	my     *mysqlRun
	dest   *destinationEnv
	origin time.Time
	// sinks are the route's sinks; rec is the first one's recording (the
	// sink "bench", or "up"), whose latencies are reported.
	sinks []*benchSink
	rec   *Recording
	obs   *observer
	// statements counts what the relays' connections send (ModeIdle).
	statements statementCounter
	// before is the distinct events delivered before the measured phase
	// (Config.History), which checkFinished does not count toward target.
	before atomic.Int64
	res    *Result
	// appName is the application_name of every connection that writes the
	// outbox or deliveries tables (relays, backlog inserts), so that the
	// bench can wait for them to be gone before it reads their counters.
	appName string
	// outageFrom and outageTo bound the outage in nanoseconds since origin
	// (0: none, or not begun or ended yet), to place interval reports.
	outageFrom, outageTo atomic.Int64

	// target is the number of distinct events whose delivery ends the
	// measured phase; finished is closed (at finishedAt) once they are
	// delivered and recorded.
	target     atomic.Int64
	finishOnce sync.Once
	finished   chan struct{}
	finishedAt atomic.Int64

	committed   atomic.Int64
	commitNanos []int64 // live: by index, when tx.Commit returned; 0 = not committed
	// producersStart is when the live producers started (nanoseconds since
	// origin).
	producersStart int64
}

// benchSink is one sink of the run's route. Every relay has an instance of
// it under the same name (as relays sharing a configuration do), and every
// instance records into the sink's own Recording.
type benchSink struct {
	name string
	rec  *Recording
	// newSink makes the instance of one relay.
	newSink func() (sinks.Sink, error)
	// destination is the route's destination template for the sink (nil:
	// the event's topic).
	destination *template.Template
	// fault, when not nil, makes the sink fail on purpose.
	fault *fault
	// recordedByReceiver means a receiver in the bench's process records
	// the sink's deliveries as they arrive, in place of a Recorder.
	recordedByReceiver bool
}

// addSink adds a sink to the run's route, with a Recording for events whose
// index is below events.
func (r *run) addSink(name string, events int, newSink func() (sinks.Sink, error), dest *template.Template, f *fault) *benchSink {
	s := &benchSink{name: name, rec: newRecording(r.ids, r.origin, events), newSink: newSink, destination: dest, fault: f}
	r.sinks = append(r.sinks, s)
	if r.rec == nil {
		r.rec = s.rec
	}
	return s
}

// sink returns the run's sink called name, or nil.
func (r *run) sink(name string) *benchSink {
	for _, s := range r.sinks {
		if s.name == name {
			return s
		}
	}
	return nil
}

// runSink adds the run's sink type (Config.Sink) to the route as name.
func (r *run) runSink(name string, events int, f *fault) *benchSink {
	newSink := func() (sinks.Sink, error) { return r.dest.newSink(name) }
	if f != nil {
		newSink = func() (sinks.Sink, error) {
			s, err := r.dest.newSink(name)
			if err != nil {
				return nil, err
			}
			return &faultSink{Sink: s, f: f}, nil
		}
	}
	return r.addSink(name, events, newSink, r.dest.destination, f)
}

// downSink adds the sink "down" to the route: an in-process sink that
// refuses every event while f is down and acknowledges them otherwise.
func (r *run) downSink(events int, f *fault) *benchSink {
	return r.addSink(SinkDown, events, func() (sinks.Sink, error) {
		return &faultSink{Sink: sinks.NewDiscard(SinkDown), f: f}, nil
	}, nil, f)
}

// Run performs one benchmark run as cfg describes and returns its result.
// When the verification fails, it returns the Result and the verification's
// error; other errors mean the run could not be carried out.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Reports, phase messages and the outage's goroutines write at once.
	cfg.Progress = &lockedWriter{w: cfg.Progress}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("drawing the run's id: %w", err)
	}
	r := &run{
		cfg:      cfg,
		log:      cfg.Logger,
		ids:      newIDCodec(nonce),
		name:     hex.EncodeToString(nonce[:6]),
		finished: make(chan struct{}),
		obs:      &observer{},
	}
	r.tables = migrations.Tables{Schema: "herald_bench_" + r.name, Table: cfg.Table}
	r.appName = "herald-bench-" + r.name
	if err := r.tables.Validate(); err != nil {
		return nil, fmt.Errorf("--table: %w", err)
	}
	r.res = &Result{Mode: cfg.Mode, Sink: cfg.Sink, Schema: r.tables.Schema, Relays: cfg.Relays, BatchSize: cfg.BatchSize,
		PollOnly: cfg.PollOnly, Keys: cfg.Keys, PayloadBytes: cfg.PayloadBytes, History: cfg.History}
	if r.res.BatchSize == 0 {
		r.res.BatchSize = relay.Config{}.WithDefaults().BatchSize
	}
	r.res.Workers = cfg.Workers
	if r.res.Workers == 0 {
		r.res.Workers = relay.Config{Capture: r.cfg.Capture}.WithDefaults().Workers
	}

	if cfg.isMySQL() {
		if err := r.openMySQL(ctx); err != nil {
			return nil, err
		}
		defer r.closeMySQL(ctx)
	} else {
		admin, err := newPool(ctx, cfg.DatabaseURL, 4, nil)
		if err != nil {
			return nil, err
		}
		defer admin.Close()
		r.admin = admin
		if err := r.createSchema(ctx); err != nil {
			return nil, err
		}
		defer r.dropSchema(ctx)
		if cfg.Capture == relay.CaptureWAL {
			// The slot exists before any event is emitted, as a relay's
			// first start makes it; waiting for the relay to make it
			// would leave the run at the mercy of the server's other
			// transactions, which the slot's creation waits for.
			if _, err := r.admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", r.tables.SlotName()); err != nil {
				return nil, fmt.Errorf("creating the replication slot %s: %w", r.tables.SlotName(), err)
			}
		}
	}

	dest, err := startDestination(ctx, cfg, r.name, r.log)
	if err != nil {
		return nil, err
	}
	r.dest = dest
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := dest.close(closeCtx); err != nil {
			r.log.Warn("relaybench: tearing down the sink's destination", "error", err)
		}
	}()

	r.origin = time.Now()
	switch cfg.Mode {
	case ModeDrain:
		r.runSink("bench", cfg.Events+cfg.History, nil)
		if r.my != nil {
			err = r.drainMySQL(ctx)
		} else {
			err = r.drain(ctx)
		}
	case ModeLive:
		r.runSink("bench", cfg.liveCapacity(), nil)
		err = r.live(ctx)
	case ModeOutage:
		r.runSink(SinkUp, cfg.Events, nil)
		r.downSink(cfg.Events, &fault{})
		err = r.outage(ctx)
	case ModeIsolation:
		r.runSink(SinkUp, cfg.liveCapacity(), nil)
		if cfg.AnswerAfter > 0 {
			var rv *receiver
			if rv, err = r.startReceiver(cfg.AnswerAfter, cfg.liveCapacity()); err != nil {
				return nil, err
			}
			defer r.closeReceiver(ctx, rv)
			r.webhookSink(SinkDown, rv, cfg.liveCapacity(), &fault{})
		} else {
			r.downSink(cfg.liveCapacity(), &fault{})
		}
		err = r.live(ctx)
	case ModeHotKey:
		r.runSink("bench", cfg.Events+cfg.HotEvents, &fault{key: keyName(hotKeyNumber(cfg))})
		err = r.hotKey(ctx)
	case ModeSlow:
		err = r.slow(ctx)
	case ModeRecovery:
		err = r.recovery(ctx)
	case ModeSkew:
		err = r.skew(ctx)
	case ModeBinary:
		err = r.binary(ctx)
	case ModeIdle:
		r.runSink("bench", 0, nil)
		err = r.idle(ctx)
	}
	if err != nil {
		return nil, err
	}
	for _, s := range r.sinks {
		r.res.RecorderBytes += s.rec.bytes()
	}
	if err := r.res.Verification.Err(); err != nil {
		return r.res, err
	}
	return r.res, nil
}

// newPool connects a pool of at most maxConns connections (0: pgxpool's
// default), adjusted by configure when given.
func newPool(ctx context.Context, url string, maxConns int32, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("--database-url: not a valid PostgreSQL connection string")
	}
	if configure != nil {
		configure(pc)
	}
	if maxConns > 0 {
		pc.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	return pool, nil
}

func (r *run) createSchema(ctx context.Context) error {
	m, err := migrations.NewMigrator(r.admin, r.tables, r.log)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, 0); err != nil {
		r.dropSchema(ctx)
		return fmt.Errorf("migrating the bench schema %s: %w", r.tables.Schema, err)
	}
	return nil
}

func (r *run) dropSchema(ctx context.Context) {
	if r.cfg.Keep {
		fmt.Fprintf(r.cfg.Progress, "keeping schema %s (--keep)\n", r.tables.Schema)
		return
	}
	dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := migrations.DropSchema(dropCtx, r.admin, r.tables); err != nil {
		r.log.Warn("relaybench: dropping the bench schema", "schema", r.tables.Schema, "error", err)
	}
}

// relays is the set of running in-process relays.
type relays struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	pools  []*pgxpool.Pool
	dbs    []*sql.DB // MySQL's
	relays []*relay.Relay
	sinks  []sinks.Sink
	errs   chan error
}

// startRelays starts cfg.Relays relays, each with its own pool and its own
// instance of every sink.
func (r *run) startRelays(ctx context.Context) (*relays, error) {
	runCtx, cancel := context.WithCancel(ctx)
	rs := &relays{cancel: cancel, errs: make(chan error, r.cfg.Relays)}
	for i := range r.cfg.Relays {
		var targets []relay.Target
		for _, s := range r.sinks {
			inner, err := s.newSink()
			if err != nil {
				rs.stop(ctx, r.log)
				return nil, fmt.Errorf("creating sink %s of relay %d: %w", s.name, i, err)
			}
			var sink sinks.Sink = &Recorder{Sink: inner, rec: s.rec}
			if s.recordedByReceiver {
				sink = inner
			}
			rs.sinks = append(rs.sinks, sink)
			targets = append(targets, relay.Target{Sink: sink, Destination: s.destination})
		}
		rcfg := relay.Config{
			Tables:          r.tables,
			Owner:           fmt.Sprintf("bench-%s-%d", r.name, i),
			BatchSize:       r.cfg.BatchSize,
			Workers:         r.cfg.Workers,
			Lease:           r.cfg.Lease,
			PollInterval:    r.cfg.PollInterval,
			PollOnly:        r.cfg.PollOnly,
			HandOffAfter:    r.cfg.HandOffAfter,
			Capture:         r.cfg.Capture,
			ShutdownTimeout: 10 * time.Second,
			Routes:          []relay.Route{{Topics: []string{"*"}, Targets: targets}},
			Logger:          r.log,
			Observer:        r.obs,
		}
		if m := r.cfg.PauseMax; m > 0 {
			rcfg.SinkPause = relay.Backoff{Initial: min(relay.Config{}.WithDefaults().SinkPause.Initial, m), Max: m}
		}
		if m := r.cfg.BackoffMax; m > 0 {
			rcfg.Backoff = relay.Backoff{Initial: min(time.Second, m), Max: m}
		}
		if r.cfg.Mode == ModeSkew {
			offset := r.cfg.ClockOffset
			rcfg.Clock = func() time.Time { return time.Now().Add(offset) }
			rcfg.Backoff = r.cfg.skewBackoff()
		}
		if r.cfg.Mode == ModeHotKey {
			// The hot key's head keeps failing: it must not become a
			// dead letter and let the key's queue move on.
			rcfg.MaxAttempts = math.MaxInt32
		}
		rl, err := r.newRelay(ctx, rs, rcfg)
		if err != nil {
			rs.stop(ctx, r.log)
			return nil, fmt.Errorf("starting relay %d: %w", i, err)
		}
		rs.relays = append(rs.relays, rl)
		rs.wg.Add(1)
		go func() {
			defer rs.wg.Done()
			if err := rl.Run(runCtx); err != nil {
				rs.errs <- fmt.Errorf("relay %d: %w", i, err)
			}
		}()
	}
	return rs, nil
}

// newRelay makes a relay on a pool of its own, added to rs.
func (r *run) newRelay(ctx context.Context, rs *relays, cfg relay.Config) (*relay.Relay, error) {
	if r.my != nil {
		rl, db, err := r.newMySQLRelay(cfg)
		if err != nil {
			return nil, err
		}
		rs.dbs = append(rs.dbs, db)
		return rl, nil
	}
	// The relay's own session settings, as relay run uses them, under the
	// run's application name.
	pool, err := newPool(ctx, r.cfg.DatabaseURL, 0, func(pc *pgxpool.Config) {
		r.writerPool(pc)
		if r.cfg.Mode == ModeIdle {
			pc.ConnConfig.Tracer = &r.statements
		}
	})
	if err != nil {
		return nil, err
	}
	rs.pools = append(rs.pools, pool)
	return relay.NewPostgres(pool, cfg)
}

// wake wakes every relay (Relay.Wake).
func (rs *relays) wake() {
	for _, rl := range rs.relays {
		rl.Wake()
	}
}

// stop stops the relays (they finish the batch in flight), then closes
// their sinks and pools.
func (rs *relays) stop(ctx context.Context, log *slog.Logger) {
	rs.cancel()
	rs.wg.Wait()
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, s := range rs.sinks {
		if err := s.Close(closeCtx); err != nil {
			log.Warn("relaybench: closing sink", "sink", s.Name(), "error", err)
		}
	}
	for _, p := range rs.pools {
		p.Close()
	}
	for _, db := range rs.dbs {
		db.Close()
	}
}

// failed returns the first error a relay stopped with, if any.
func (rs *relays) failed() error {
	select {
	case err := <-rs.errs:
		return err
	default:
		return nil
	}
}

// writerPool configures the pool of a relay: the relay's session settings,
// under the run's application name.
func (r *run) writerPool(pc *pgxpool.Config) {
	pc.ConnConfig.RuntimeParams["application_name"] = r.appName
	relay.ConfigurePool(pc)
}

// runRelays starts the relays, reporting every recorded batch to
// checkFinished (nothing finishes before the target is set), and waits until
// they have shared out the lanes. stop may be called more than once.
func (r *run) runRelays(ctx context.Context) (rs *relays, stop func(), err error) {
	for _, s := range r.sinks {
		s.rec.onRecord = func(int) { r.checkFinished() }
	}
	r.obs.onRecorded = r.checkFinished
	if rs, err = r.startRelays(ctx); err != nil {
		return nil, nil, err
	}
	stop = sync.OnceFunc(func() { rs.stop(ctx, r.log) })
	if r.res.LanesSettled, err = r.awaitLanes(ctx, rs); err != nil {
		stop()
		return nil, nil, err
	}
	return rs, stop, nil
}

// awaitLanes waits (up to 15s) until every lane is leased and every claim
// loop (each worker of each relay leases lanes of its own) holds a fair
// share, so that the measured phase does not include the first
// rebalancing. It reports whether they got there.
func (r *run) awaitLanes(ctx context.Context, rs *relays) (bool, error) {
	loops := r.cfg.Relays * r.res.Workers
	fair := (64 + loops - 1) / loops
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := rs.failed(); err != nil {
			return false, err
		}
		held, err := r.leases(ctx)
		if err != nil {
			return false, fmt.Errorf("reading lane leases: %w", err)
		}
		owners, total, most := len(held), 0, 0
		for _, n := range held {
			total += n
			most = max(most, n)
		}
		if owners == loops && total == 64 && most <= fair {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return false, ctx.Err()
		}
	}
}

// leases counts the lanes each owner holds now.
func (r *run) leases(ctx context.Context) (map[string]int, error) {
	if r.my != nil {
		return r.my.leases(ctx)
	}
	rows, err := r.admin.Query(ctx, `SELECT owner, count(*) FROM `+r.tables.Lanes()+` WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner`)
	if err != nil {
		return nil, err
	}
	held := map[string]int{}
	var (
		owner string
		n     int
	)
	_, err = pgx.ForEachRow(rows, []any{&owner, &n}, func() error {
		held[owner] = n
		return nil
	})
	return held, err
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

// checkFinished closes finished once target distinct events (besides the
// delivered events of an earlier phase, before) are delivered to every sink
// and at least target outcomes recorded.
func (r *run) checkFinished() {
	target := r.target.Load()
	if target <= 0 || !r.delivered(target+r.before.Load()) || r.obs.recorded.Load() < target {
		return
	}
	r.finishOnce.Do(func() {
		r.finishedAt.Store(time.Since(r.origin).Nanoseconds())
		close(r.finished)
	})
}

// delivered reports whether every sink acknowledged at least n distinct
// events of the run.
func (r *run) delivered(n int64) bool {
	for _, s := range r.sinks {
		if int64(s.rec.Unique()) < n {
			return false
		}
	}
	return true
}

// waitFinished waits for finished, a relay failure or the timeout.
func (r *run) waitFinished(ctx context.Context, rs *relays, timeout time.Duration) error {
	r.checkFinished()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.finished:
		return nil
	case err := <-rs.errs:
		return err
	case <-t.C:
		fmt.Fprintf(r.cfg.Progress, "timed out after %s: %s of %d events delivered\n", timeout, r.uniqueText(), r.target.Load())
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// uniqueText is the distinct events each sink acknowledged.
func (r *run) uniqueText() string {
	if len(r.sinks) == 1 {
		return strconv.Itoa(r.rec.Unique())
	}
	parts := make([]string, len(r.sinks))
	for i, s := range r.sinks {
		parts[i] = fmt.Sprintf("%s %d", s.name, s.rec.Unique())
	}
	return strings.Join(parts, ", ")
}

// insertSQL writes events $1 to $2 of the backlog; ids, keys and payload
// follow idCodec and keyName. Every event has the key $6 when it is not
// NULL.
func (r *run) insertSQL() string {
	if r.cfg.Capture == relay.CaptureWAL {
		// Emitted into the WAL in i's order, as many transactions' calls
		// of outbox_emit would be.
		return `SELECT count(` + r.tables.EmitEvent() + `(($5::text || lpad(to_hex(i), 16, '0'))::uuid, 'bench',
       coalesce($6::text, 'k' || CASE WHEN $3::bigint > 0 THEN i % $3::bigint ELSE i END), $4::jsonb,
       NULL, NULL, '{}'::jsonb, NULL, NULL))
FROM (SELECT i FROM generate_series($1::bigint, $2::bigint) AS i ORDER BY i) g`
	}
	return `INSERT INTO ` + r.tables.Outbox() + ` (id, topic, key, payload)
SELECT ($5::text || lpad(to_hex(i), 16, '0'))::uuid, 'bench',
       coalesce($6::text, 'k' || CASE WHEN $3::bigint > 0 THEN i % $3::bigint ELSE i END), $4::json
FROM generate_series($1::bigint, $2::bigint) AS i
ORDER BY i`
}

// insertEvents inserts the events of index lo to hi-1 in tx, in chunks,
// over cfg.Keys keys, or all of key when it is not empty.
func (r *run) insertEvents(ctx context.Context, tx pgx.Tx, lo, hi int, key string) error {
	const chunk = 50_000
	pl := payload(r.cfg.PayloadBytes)
	var fixed *string
	if key != "" {
		fixed = &key
	}
	for from := lo; from < hi; from += chunk {
		to := min(from+chunk, hi) - 1
		if _, err := tx.Exec(ctx, r.insertSQL(), from, to, r.cfg.Keys, pl, r.ids.nonceHex(), fixed); err != nil {
			return fmt.Errorf("inserting events %d to %d: %w", from, to, err)
		}
	}
	return nil
}

func payload(size int) string {
	return `{"pad":"` + strings.Repeat("x", size-minPayloadBytes) + `"}`
}

// drain commits the backlog in one transaction once the relays are ready,
// and times its delivery.
func (r *run) drain(ctx context.Context) error {
	cfg := r.cfg
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if cfg.History > 0 {
		if err := r.history(ctx, rs); err != nil {
			return err
		}
	}

	fmt.Fprintf(cfg.Progress, "inserting %d events over %s in schema %s...\n", cfg.Events, keysText(cfg.Keys), r.tables.Schema)
	insertStart := time.Now()
	tx, err := r.admin.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	defer tx.Rollback(ctx)
	postmaster := r.postmaster()
	written, _ := serverCPU(postmaster)
	if err := r.insertEvents(ctx, tx, 0, cfg.Events, ""); err != nil {
		return fmt.Errorf("inserting the backlog: %w", err)
	}
	if db, ok := serverCPU(postmaster); ok && postmaster != 0 {
		r.res.WriteDatabaseCPUSeconds = (db - written).Seconds()
	}
	// Fresh statistics, as autovacuum would have gathered for a backlog;
	// after a history, the statistics it left.
	if cfg.History == 0 {
		if _, err := tx.Exec(ctx, "ANALYZE "+r.tables.Outbox()); err != nil {
			return fmt.Errorf("analyzing the backlog: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", r.tables.Channel()); err != nil {
		return fmt.Errorf("notifying the relays: %w", err)
	}
	m := r.startMeasuring("the measured phase (VmHWM reset at its start); includes the recorder")
	r.target.Store(int64(cfg.Events))
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing the backlog: %w", err)
	}
	m.start = time.Since(r.origin).Nanoseconds()
	fmt.Fprintf(cfg.Progress, "inserted in %s; draining with %d relay(s)...\n", time.Since(insertStart).Round(time.Millisecond), cfg.Relays)

	stopReports := r.startReports(ctx, m.start, nil)
	elapsed, cpu, err := r.awaitDelivery(ctx, rs, m, stopReports, stop)
	if err != nil {
		return err
	}
	committed := make([]bool, cfg.Events+cfg.History)
	for i := range committed {
		committed[i] = true
	}
	r.finish(ctx, committed, elapsed, cpu, cpuScopeDrain)
	return nil
}

// history runs Config.History events through the relays before a drain's
// measured phase: committed in one transaction (indexes from Config.Events
// on), the outbox and deliveries tables analysed once half of them are
// delivered, then drained to the end. The relays are idle when it returns,
// with the statistics of a half-drained table and the dead entries the
// drain left.
func (r *run) history(ctx context.Context, rs *relays) error {
	cfg := r.cfg
	n := cfg.History
	fmt.Fprintf(cfg.Progress, "history: %d events through the relays, the tables analysed mid-drain...\n", n)
	if err := r.commitEvents(ctx, cfg.Events, cfg.Events+n, "", false); err != nil {
		return err
	}
	deadline := time.Now().Add(cfg.Timeout)
	for !r.delivered(int64(n / 2)) {
		if err := rs.failed(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("history: %s of %d events delivered after --timeout %s", r.uniqueText(), n, cfg.Timeout)
		}
		if !sleep(ctx, 5*time.Millisecond) {
			return ctx.Err()
		}
	}
	if _, err := r.admin.Exec(ctx, "ANALYZE "+r.tables.Outbox()+", "+r.tables.Deliveries()); err != nil {
		return fmt.Errorf("history: analyzing the tables mid-drain: %w", err)
	}
	end, err := r.waitEmpty(ctx, rs, nil, int64(n), false, time.Since(r.origin).Nanoseconds()+cfg.Timeout.Nanoseconds())
	if err != nil {
		return err
	}
	if end == 0 {
		return fmt.Errorf("history: %s of %d events delivered after --timeout %s", r.uniqueText(), n, cfg.Timeout)
	}
	r.obs.reset()
	r.before.Store(int64(n))
	return nil
}

// cpuScopeDrain is what the CPU time of a run without producers covers.
const cpuScopeDrain = "the whole process: relays, sink client, recorder; not PostgreSQL or the sink's peer"

// measurement is the measured phase of a run, from start (nanoseconds since
// the run's origin) until every event's outcome is recorded.
type measurement struct {
	start    int64
	cpu0     time.Duration
	rssScope string
	// postmaster is the local PostgreSQL server's postmaster (0: not
	// readable here), and db0 the server's CPU time at the start.
	postmaster int
	db0        time.Duration
}

// startMeasuring resets the peak RSS, reads the CPU time so far and starts
// the phase now (a drain moves start to its backlog's commit). rssScope says
// what the peak RSS covers when it could be reset.
func (r *run) startMeasuring(rssScope string) measurement {
	if !resetPeakRSS() {
		rssScope = "the whole process (peak RSS could not be reset)"
	}
	m := measurement{rssScope: rssScope, postmaster: r.postmaster()}
	if m.postmaster != 0 {
		m.db0, _ = serverCPU(m.postmaster)
	}
	m.start, m.cpu0 = time.Since(r.origin).Nanoseconds(), cpuTime()
	return m
}

// postmaster returns the pid of the PostgreSQL server's postmaster when the
// server runs on this host and its processes are readable, else 0.
func (r *run) postmaster() int {
	if r.admin == nil {
		return 0
	}
	var backend int
	if err := r.admin.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	if _, ppid, ok := procCPU(strconv.Itoa(backend), false); ok {
		if _, ok := serverCPU(ppid); ok {
			return ppid
		}
	}
	return 0
}

// awaitDelivery waits until the relays have recorded every target event,
// stops the reports and then the relays, and returns the measured phase's
// duration in nanoseconds and the CPU time it used; it sets the peak RSS.
func (r *run) awaitDelivery(ctx context.Context, rs *relays, m measurement, stopReports, stopRelays func()) (int64, time.Duration, error) {
	err := r.waitFinished(ctx, rs, r.cfg.Timeout)
	stopReports()
	if err != nil {
		return 0, 0, err
	}
	end := r.finishedAt.Load()
	if end == 0 {
		end = time.Since(r.origin).Nanoseconds()
	}
	cpu := cpuTime() - m.cpu0
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	if m.postmaster != 0 {
		if db, ok := serverCPU(m.postmaster); ok {
			r.res.DatabaseCPUSeconds = (db - m.db0).Seconds()
		}
	}
	stopRelays()
	return end - m.start, cpu, nil
}

// finish fills the result's common fields once the relays stopped.
func (r *run) finish(ctx context.Context, committed []bool, elapsedNanos int64, cpu time.Duration, cpuScope string) {
	res := r.res
	res.Events = int(r.target.Load())
	res.ElapsedSeconds = float64(elapsedNanos) / 1e9
	if res.ElapsedSeconds > 0 {
		res.EventsPerSecond = float64(res.Events) / res.ElapsedSeconds
		res.CPUCores = cpu.Seconds() / res.ElapsedSeconds
	}
	res.CPUSeconds, res.CPUScope = cpu.Seconds(), cpuScope
	res.Claim, res.Publish, res.Record, res.MeanBatch = r.obs.summary()
	res.Failures = r.obs.failed.Load()
	if err := r.rowsLeft(ctx, &res.RowsLeft); err != nil {
		r.log.Warn("relaybench: counting rows left", "error", err)
		res.RowsLeft = -1
	}
	if len(r.sinks) == 1 {
		res.Verification = Verify(r.rec.all(), committed)
		return
	}
	names, recordings := make([]string, len(r.sinks)), make([][]Record, len(r.sinks))
	for i, s := range r.sinks {
		names[i], recordings[i] = s.name, s.rec.all()
	}
	var each []Verification
	res.Verification, each = verifyEach(names, recordings, committed)
	for i, s := range r.sinks {
		res.Sinks = append(res.Sinks, SinkResult{Name: s.name, Verification: each[i]})
	}
}

// rowsLeft counts the outbox's rows into n.
func (r *run) rowsLeft(ctx context.Context, n *int64) error {
	if r.my != nil {
		return r.my.admin.QueryRowContext(ctx, "SELECT count(*) FROM "+r.my.tables.Outbox()).Scan(n)
	}
	return r.admin.QueryRow(ctx, "SELECT count(*) FROM "+r.tables.Outbox()).Scan(n)
}

func keysText(keys int) string {
	if keys == 0 {
		return "one key per event"
	}
	return fmt.Sprintf("%d keys", keys)
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// warnHandler passes on warnings and errors only.
type warnHandler struct{ slog.Handler }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnHandler{h.Handler.WithAttrs(attrs)}
}

func (h warnHandler) WithGroup(name string) slog.Handler {
	return warnHandler{h.Handler.WithGroup(name)}
}
