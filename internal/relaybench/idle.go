package relaybench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// IdleResult is what ModeIdle measured: the load idle relays put on the
// database, counted on the relays' own connections.
type IdleResult struct {
	// Seconds is the measured window.
	Seconds float64 `json:"seconds"`
	// RoundTrips is the requests the relays sent on their pools (a
	// statement, a batch of statements, a prepare), and Statements the
	// statements in them. A relay reading the WAL also sends the slot's
	// status, about once a second, on its replication connection: not
	// counted here.
	RoundTrips int64 `json:"round_trips"`
	Statements int64 `json:"statements"`
	// RoundTripsPerSecond and StatementsPerSecond are those over Seconds.
	RoundTripsPerSecond float64 `json:"round_trips_per_s"`
	StatementsPerSecond float64 `json:"statements_per_s"`
	// DatabaseCPUPercent is the local server's processes' CPU time over
	// the window, in percent of one core (0 when it runs elsewhere); it
	// includes whatever else the server did meanwhile.
	DatabaseCPUPercent float64 `json:"database_cpu_percent"`
	// RelayCPUPercent is this process's CPU time over the window, in
	// percent of one core.
	RelayCPUPercent float64 `json:"relay_cpu_percent"`
}

// statementCounter is a pgx tracer counting what the relays' connections
// send. Its methods are called on the connections' goroutines.
type statementCounter struct {
	roundTrips atomic.Int64
	statements atomic.Int64
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	c.statements.Add(1)
	return ctx
}

func (*statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (*statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *statementCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (*statementCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *statementCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.roundTrips.Add(1)
	c.statements.Add(1)
	return ctx
}

func (*statementCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// idle starts the relays on the run's empty tables with the settings given
// (relay run's defaults unless set), waits until they share the lanes,
// then counts for Duration what their connections send.
func (r *run) idle(ctx context.Context) error {
	cfg := r.cfg
	_, stop, err := r.runRelays(ctx)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(cfg.Progress, "idle: %d relay(s) on empty tables in schema %s, counting for %s...\n", cfg.Relays, r.tables.Schema, cfg.Duration)
	m := r.startMeasuring("the idle window (VmHWM reset at its start)")
	trips0, stmts0 := r.statements.roundTrips.Load(), r.statements.statements.Load()
	start := time.Now()
	if !sleep(ctx, cfg.Duration) {
		return ctx.Err()
	}
	seconds := time.Since(start).Seconds()
	out := &IdleResult{
		Seconds:    seconds,
		RoundTrips: r.statements.roundTrips.Load() - trips0,
		Statements: r.statements.statements.Load() - stmts0,
	}
	cpu := cpuTime() - m.cpu0
	out.RoundTripsPerSecond = float64(out.RoundTrips) / seconds
	out.StatementsPerSecond = float64(out.Statements) / seconds
	out.RelayCPUPercent = 100 * cpu.Seconds() / seconds
	if m.postmaster != 0 {
		if db, ok := serverCPU(m.postmaster); ok {
			out.DatabaseCPUPercent = 100 * (db - m.db0).Seconds() / seconds
		}
	}
	r.res.Idle = out
	r.res.ElapsedSeconds = seconds
	r.res.CPUSeconds, r.res.CPUScope = cpu.Seconds(), "the whole process: the idle relays"
	r.res.CPUCores = cpu.Seconds() / seconds
	r.res.PeakRSSBytes, r.res.RSSScope = peakRSS(), m.rssScope
	return nil
}

// writeIdle writes ModeIdle's figures.
func writeIdle(ew *errWriter, res *Result) {
	in := res.Idle
	ew.printf("idle for %.1fs: %d round trips (%.2f/s), %d statements (%.2f/s) on the relays' connections\n",
		in.Seconds, in.RoundTrips, in.RoundTripsPerSecond, in.Statements, in.StatementsPerSecond)
	ew.printf("cpu: relay process %.2f %% of a core", in.RelayCPUPercent)
	if in.DatabaseCPUPercent > 0 {
		ew.printf(", local PostgreSQL server %.2f %% of a core (all its clients)", in.DatabaseCPUPercent)
	}
	ew.printf("\npeak RSS: %s over %s\n", mib(res.PeakRSSBytes), res.RSSScope)
}
