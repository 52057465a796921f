package relaybench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
)

// live runs the producers (first alone for cfg.Baseline, then with the
// relays for cfg.Duration) and measures commit-to-acknowledgement latency.
func (r *run) live(ctx context.Context) error {
	cfg := r.cfg
	newProducers, closeProducers, err := r.producerConns(ctx)
	if err != nil {
		return err
	}
	defer closeProducers()
	r.res.Producers = &ProducerResult{Producers: cfg.Producers, TxEvents: cfg.TxEvents, TargetRate: cfg.Rate}

	if cfg.Baseline > 0 {
		fmt.Fprintf(cfg.Progress, "baseline: %d producers for %s with no relay...\n", cfg.Producers, cfg.Baseline)
		p := newProducers(true)
		n, elapsed := p.run(ctx, cfg.Baseline)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.res.Producers.BaselineCommitRate = float64(n) / elapsed.Seconds()
		r.res.Producers.Errors += p.errors.Load()
		// The baseline's rows are not part of the measurement.
		if err := r.truncateOutbox(ctx); err != nil {
			return fmt.Errorf("removing the baseline's events: %w", err)
		}
	}

	capacity := cfg.liveCapacity()
	r.commitNanos = make([]int64, capacity)
	rs, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()

	rate := "as fast as they can"
	if cfg.Rate > 0 {
		rate = fmt.Sprintf("%d events/s", cfg.Rate)
	}
	fmt.Fprintf(cfg.Progress, "%s: %d producers at %s for %s, %d relay(s)...\n", cfg.Mode, cfg.Producers, rate, cfg.Duration, cfg.Relays)
	m := r.startMeasuring("the measured phase (VmHWM reset at its start); includes producers and the recorder")
	r.producersStart = m.start
	committedSoFar := func() int64 { return r.committed.Load() }
	stopReports := r.startReports(ctx, m.start, committedSoFar)
	var iso *isolation
	if cfg.Mode == ModeIsolation {
		iso = r.startIsolation(ctx, m.start, committedSoFar)
	}
	p := newProducers(false)
	n, elapsed := p.run(ctx, cfg.Duration)
	producersEnd := time.Since(r.origin).Nanoseconds()
	if iso != nil {
		iso.producersStopped()
		defer iso.stop()
	}
	r.res.Producers.Errors += p.errors.Load()
	r.res.Producers.CommitRate = float64(n) / elapsed.Seconds()
	if b := r.res.Producers.BaselineCommitRate; b > 0 {
		r.res.Producers.Ratio = r.res.Producers.CommitRate / b
	}
	if ctx.Err() != nil {
		stopReports()
		return ctx.Err()
	}
	r.target.Store(n)
	measured, cpu, err := r.awaitDelivery(ctx, rs, m, stopReports, stop)
	if err != nil {
		return err
	}
	committed := make([]bool, len(r.commitNanos))
	for i, c := range r.commitNanos {
		committed[i] = c != 0
	}
	r.finish(ctx, committed, measured, cpu, "the whole process: relays, producers, sink client, recorder; not PostgreSQL or the sink's peer")
	r.res.Latency = r.latencies(r.rec.all())
	if iso != nil {
		iso.finish(producersEnd)
	}
	return nil
}

// latencies is ack minus commit of each event's first delivery. An event
// acknowledged before its producer saw tx.Commit return counts as 0.
func (r *run) latencies(records []Record) *Percentiles {
	seen := make([]bool, len(r.commitNanos))
	ns := make([]int64, 0, len(records))
	for _, rec := range records {
		if rec.Index < 0 || rec.Index >= int64(len(seen)) || seen[rec.Index] {
			continue
		}
		seen[rec.Index] = true
		c := atomic.LoadInt64(&r.commitNanos[rec.Index])
		if c == 0 {
			continue
		}
		ns = append(ns, max(rec.AckNanos-c, 0))
	}
	return percentiles(ns)
}

// producerConns connects the producers: on PostgreSQL a pool and the
// outbox library, on MySQL a *sql.DB and plain INSERTs (what any
// application, in any language, writes). newProducers makes producers on
// them; closeConns disconnects.
func (r *run) producerConns(ctx context.Context) (newProducers func(baseline bool) *producers, closeConns func(), err error) {
	conns := r.cfg.Producers + 1
	if r.my != nil {
		db, err := mysqlurl.Open(r.cfg.DatabaseURL)
		if err != nil {
			return nil, nil, fmt.Errorf("--database-url: %w", err)
		}
		db.SetMaxOpenConns(conns)
		db.SetMaxIdleConns(conns)
		return func(baseline bool) *producers {
			return &producers{r: r, db: db, baseline: baseline}
		}, func() { db.Close() }, nil
	}
	capture := outbox.Table
	if r.cfg.Capture == relay.CaptureWAL {
		capture = outbox.WAL
	}
	writer, err := outbox.NewWriter(outbox.Config{Tables: r.tables, Capture: capture})
	if err != nil {
		return nil, nil, err
	}
	pool, err := newPool(ctx, r.cfg.DatabaseURL, int32(conns), nil)
	if err != nil {
		return nil, nil, err
	}
	return func(baseline bool) *producers {
		return &producers{r: r, writer: writer, pool: pool, baseline: baseline}
	}, pool.Close, nil
}

// truncateOutbox empties the outbox table.
func (r *run) truncateOutbox(ctx context.Context) error {
	if r.my != nil {
		_, err := r.my.admin.ExecContext(ctx, "TRUNCATE TABLE "+r.my.tables.Outbox())
		return err
	}
	_, err := r.admin.Exec(ctx, "TRUNCATE "+r.tables.Outbox())
	return err
}

// producers commit events through the outbox library (PostgreSQL) or
// plain INSERTs (MySQL).
type producers struct {
	r        *run
	writer   *outbox.Writer
	pool     *pgxpool.Pool
	db       *sql.DB // MySQL's, instead of writer and pool
	baseline bool    // ids outside the run's index space, commit times not kept
	errors   atomic.Int64
}

// run runs cfg.Producers producers for d and returns the events committed
// and the time it took.
func (p *producers) run(ctx context.Context, d time.Duration) (int64, time.Duration) {
	cfg := p.r.cfg
	// Waits end at the deadline; a transaction under way finishes with ctx,
	// so that no commit's outcome is left unknown.
	stopCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	start := time.Now()
	for i := range cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			total.Add(p.produce(ctx, stopCtx, i, start))
		}()
	}
	wg.Wait()
	return total.Load(), time.Since(start)
}

// produce is producer i: its e-th event has index e*P+i and a key of its
// own (the keys below cfg.Keys ≡ i mod P, in turn), so that each key's
// commits are sequential. Each transaction commits cfg.TxEvents
// consecutive events of the producer.
func (p *producers) produce(ctx, stopCtx context.Context, i int, start time.Time) int64 {
	cfg := p.r.cfg
	P, k := int64(cfg.Producers), int64(cfg.TxEvents)
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(P*k) / float64(cfg.Rate))
	}
	keysEach := max((int64(cfg.Keys)-int64(i)+P-1)/P, 1) // the keys ≡ i mod P below cfg.Keys
	pl := []byte(payload(cfg.PayloadBytes))
	events := make([]outbox.Event, 0, k)
	indexes := make([]int64, 0, k)
	var done int64
	for j := int64(0); ; j++ {
		if interval > 0 {
			if wait := time.Until(start.Add(time.Duration(j) * interval)); wait > 0 && !sleep(stopCtx, wait) {
				return done
			}
		}
		if stopCtx.Err() != nil {
			return done
		}
		events, indexes = events[:0], indexes[:0]
		for e := j * k; e < (j+1)*k; e++ {
			idx := e*P + int64(i)
			if !p.baseline && idx >= int64(len(p.r.commitNanos)) {
				break
			}
			key := idx
			if cfg.Keys > 0 {
				key = (e%keysEach)*P + int64(i)
			}
			id := p.r.ids.id(idx)
			if p.baseline {
				id[0] ^= 0xff // not one of the measured events
			}
			events = append(events, outbox.Event{ID: uuid.UUID(id), Topic: "bench", Key: keyName(key), Payload: pl})
			indexes = append(indexes, idx)
		}
		if len(events) == 0 {
			return done
		}
		err := p.commit(ctx, events)
		if err != nil {
			if ctx.Err() == nil {
				p.errors.Add(1)
				p.r.log.Warn("relaybench: producer commit failed", "producer", i, "error", err)
			}
			continue
		}
		if !p.baseline {
			at := max(time.Since(p.r.origin).Nanoseconds(), 1)
			for _, idx := range indexes {
				atomic.StoreInt64(&p.r.commitNanos[idx], at)
			}
			p.r.committed.Add(int64(len(indexes)))
		}
		done += int64(len(events))
	}
}

// commit commits events in one transaction.
func (p *producers) commit(ctx context.Context, events []outbox.Event) error {
	if p.db != nil {
		ids, keys := make([]string, len(events)), make([]string, len(events))
		for i, e := range events {
			ids[i], keys[i] = e.ID.String(), e.Key
		}
		return p.r.my.produce(ctx, p.db, ids, keys, string(events[0].Payload))
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		_, err := p.writer.Enqueue(ctx, tx, events...)
		return err
	})
}
