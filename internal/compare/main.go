// Command compare times how fast River and Watermill's SQL forwarder drain a
// committed backlog on this machine, so the docs can put their figures
// beside Herald's own `relay bench --mode binary`.
//
//	go run . river --database-url postgres://postgres@127.0.0.1:5432/test --events 200000
//	go run . watermill --database-url postgres://postgres@127.0.0.1:5432/test --events 200000
//
// Each run works in a schema of its own, dropped at the end (also on error or
// timeout): it sets up the library's tables there, commits the backlog in one
// transaction, then starts the library's consumer and times it from its start
// until every item reached a no-op destination. The destination is out of the
// comparison, as Herald's bench publishes to a discard sink. The library's
// own record of the work (River's job states, Watermill's acked offset) is
// checked after the clock has stopped.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// config is what one run was asked for: the flags common to both libraries
// and those of the one being run.
type config struct {
	DatabaseURL string
	Events      int
	MaxConns    int
	Timeout     time.Duration
	JSON        bool

	// River's consumer.
	Workers           int
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration

	// Watermill's subscriber.
	BatchSize    int
	PollInterval time.Duration
}

// result is what one run measured. Seconds runs from the consumer's start
// until the destination had counted every item; the backlog's insert and
// commit are outside it (InsertSeconds).
type result struct {
	Library       string  `json:"library"`
	Version       string  `json:"version"`
	Events        int     `json:"events"`
	Seconds       float64 `json:"seconds"`
	PerSecond     float64 `json:"per_second"`
	InsertSeconds float64 `json:"insert_seconds"`
	PayloadBytes  int     `json:"payload_bytes"`
	MaxConns      int     `json:"max_conns"`
	// LoadAverage is the 1-minute load average before the run, from
	// /proc/loadavg (empty where there is none).
	LoadAverage string `json:"load_average,omitempty"`

	Workers             int     `json:"workers,omitempty"`
	FetchCooldownMS     float64 `json:"fetch_cooldown_ms,omitempty"`
	FetchPollIntervalMS float64 `json:"fetch_poll_interval_ms,omitempty"`
	BatchSize           int     `json:"batch_size,omitempty"`
	PollIntervalMS      float64 `json:"poll_interval_ms,omitempty"`
}

// drainFunc sets up one library's tables in schema, commits cfg.Events items
// and drains them, filling in res.
type drainFunc func(ctx context.Context, pool *pgxpool.Pool, schema string, cfg config, res *result) error

// libraries are the subcommands: a library's name, the Go module whose
// version is reported, and its drain.
var libraries = map[string]struct {
	module string
	drain  drainFunc
}{
	"river":     {"github.com/riverqueue/river", drainRiver},
	"watermill": {"github.com/ThreeDotsLabs/watermill-sql/v4", drainWatermill},
}

// payloadSize is the size of every item's JSON body: a River job's args, a
// Watermill message's payload.
const payloadSize = 200

const usage = `usage: go run . river|watermill --database-url URL [flags]

Times how fast the library drains a committed backlog of --events items.
Run "go run . river -h" or "go run . watermill -h" for the flags.
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// run parses args (the library, then its flags), runs it and prints the
// result to out.
func run(args []string, out io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("name a library: river or watermill")
	}
	name := args[0]
	lib, ok := libraries[name]
	if !ok {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown library %q: want river or watermill", name)
	}
	cfg, err := parseFlags(name, args[1:])
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	res := result{
		Library:      name,
		Version:      moduleVersion(lib.module),
		Events:       cfg.Events,
		PayloadBytes: len(payload()),
		MaxConns:     cfg.MaxConns,
		LoadAverage:  loadAverage(),
	}
	if err := inSchema(ctx, cfg, func(pool *pgxpool.Pool, schema string) error {
		return lib.drain(ctx, pool, schema, cfg, &res)
	}); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: --timeout %s reached: %w", name, cfg.Timeout, err)
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	res.PerSecond = float64(res.Events) / res.Seconds

	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	_, err = fmt.Fprintln(out, res.text())
	return err
}

// parseFlags reads the flags of the library name from args.
func parseFlags(name string, args []string) (config, error) {
	cfg := config{DatabaseURL: os.Getenv("DATABASE_URL")}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "PostgreSQL connection string (default $DATABASE_URL)")
	fs.IntVar(&cfg.Events, "events", 200000, "items committed in the backlog")
	fs.IntVar(&cfg.MaxConns, "max-conns", 10, "size of the library's connection pool")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "abort the run (and drop its schema) after this long")
	fs.BoolVar(&cfg.JSON, "json", false, "print the result as a JSON object")
	switch name {
	case "river":
		fs.IntVar(&cfg.Workers, "workers", 1000, "MaxWorkers of the default queue")
		fs.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", 5*time.Millisecond, "River's FetchCooldown")
		fs.DurationVar(&cfg.FetchPollInterval, "fetch-poll-interval", 50*time.Millisecond, "River's FetchPollInterval")
	case "watermill":
		fs.IntVar(&cfg.BatchSize, "batch-size", 0, "the SQL schema adapter's SubscribeBatchSize, rows per SELECT (0: --events, the whole backlog)")
		fs.DurationVar(&cfg.PollInterval, "poll-interval", 10*time.Millisecond, "the SQL subscriber's PollInterval")
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	switch {
	case fs.NArg() > 0:
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.DatabaseURL == "":
		return config{}, errors.New("--database-url is required (or set DATABASE_URL)")
	case cfg.Events < 1:
		return config{}, errors.New("--events must be at least 1")
	case cfg.MaxConns < 1:
		return config{}, errors.New("--max-conns must be at least 1")
	case cfg.Timeout <= 0:
		return config{}, errors.New("--timeout must be positive")
	case cfg.BatchSize < 0:
		return config{}, errors.New("--batch-size must not be negative")
	}
	if name == "watermill" && cfg.BatchSize == 0 {
		// The adapter sets no upper bound: its largest batch is the backlog.
		cfg.BatchSize = cfg.Events
	}
	return cfg, nil
}

// inSchema creates a schema with a random name, connects a pool whose
// search_path is that schema, calls f, and drops the schema whatever f
// returned, even after ctx is done.
func inSchema(ctx context.Context, cfg config, f func(pool *pgxpool.Pool, schema string) error) (err error) {
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return fmt.Errorf("naming the schema: %w", err)
	}
	schema := "compare_" + hex.EncodeToString(suffix)

	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return errors.New("--database-url: not a valid PostgreSQL connection string")
	}
	pc.MaxConns = int32(cfg.MaxConns)
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connecting to the database: %w", err)
	}
	defer pool.Close()

	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		return fmt.Errorf("creating schema %s: %w", schema, err)
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, dropErr := pool.Exec(dropCtx, "DROP SCHEMA "+ident+" CASCADE"); dropErr != nil {
			err = errors.Join(err, fmt.Errorf("dropping schema %s: %w", schema, dropErr))
		}
	}()
	return f(pool, schema)
}

// analyzeSchema runs ANALYZE on every table in schema, so that the backlog
// the clock starts on has planner statistics, as Herald's bench gives its
// own; otherwise autovacuum would gather them at some moment of the drain.
func analyzeSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	rows, err := pool.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
	if err != nil {
		return fmt.Errorf("listing the tables of schema %s: %w", schema, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing the tables of schema %s: %w", schema, err)
	}
	for _, table := range tables {
		if _, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{schema, table}.Sanitize()); err != nil {
			return fmt.Errorf("analysing %s.%s: %w", schema, table, err)
		}
	}
	return nil
}

// newLogger returns the logger a library logs to: warnings and errors, on
// stderr, at the level of the returned LevelVar.
func newLogger() (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), level
}

// counter counts the items a consumer processed and closes done when the
// count reaches target. Items counted twice (redelivered) count again.
type counter struct {
	n      atomic.Int64
	target int64
	done   chan struct{}
}

func newCounter(target int) *counter {
	return &counter{target: int64(target), done: make(chan struct{})}
}

// add counts k more items.
func (c *counter) add(k int) {
	if n := c.n.Add(int64(k)); n >= c.target && n-int64(k) < c.target {
		close(c.done)
	}
}

// wait returns the time from start until the count reached its target, or
// an error with the count so far if ctx is done or stopped is closed (the
// consumer quit) first. A nil stopped is never closed.
func (c *counter) wait(ctx context.Context, start time.Time, stopped <-chan struct{}) (time.Duration, error) {
	select {
	case <-c.done:
		return time.Since(start), nil
	case <-stopped:
		return 0, fmt.Errorf("the consumer stopped after %d of %d", c.n.Load(), c.target)
	case <-ctx.Done():
		return 0, fmt.Errorf("%d of %d processed: %w", c.n.Load(), c.target, context.Cause(ctx))
	}
}

// payloadText fills every item's body, {"payload":"xx…"}, to payloadSize
// bytes.
var payloadText = strings.Repeat("x", payloadSize-len(`{"payload":""}`))

// payload returns the JSON body every item carries.
func payload() []byte { return []byte(`{"payload":"` + payloadText + `"}`) }

// text is the result as one line.
func (r result) text() string {
	pool := fmt.Sprintf("pool %d", r.MaxConns)
	switch r.Library {
	case "river":
		return fmt.Sprintf("river: %d jobs in %.3fs: %.0f jobs/s (workers %d, fetch cooldown %s, %s)",
			r.Events, r.Seconds, r.PerSecond, r.Workers, ms(r.FetchCooldownMS), pool)
	default:
		return fmt.Sprintf("watermill: %d messages in %.3fs: %.0f messages/s (batch size %d, poll interval %s, %s)",
			r.Events, r.Seconds, r.PerSecond, r.BatchSize, ms(r.PollIntervalMS), pool)
	}
}

// ms formats milliseconds as a duration.
func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// moduleVersion is the version of module this binary was built with.
func moduleVersion(module string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == module {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// loadAverage is the 1-minute load average, or "" where /proc/loadavg is
// missing.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}
