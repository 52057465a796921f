package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// This file holds the demo's PostgreSQL: finding or starting a server, and
// the schema, relay, dead letters and order service on it.

// DefaultDatabaseURL is the local server the demo tries when no URL is given.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PostgresImage is the image started when no PostgreSQL answers and a Docker
// engine does.
const PostgresImage = "postgres:17-alpine"

// NoDatabaseError means no PostgreSQL answered and none could be started.
// Its message says what to run to get one.
type NoDatabaseError struct {
	// URL is the (redacted) URL that was tried.
	URL string
	// Err is why connecting failed.
	Err error
	// Docker is why no container could be started.
	Docker error
}

// Error explains what to run.
func (e *NoDatabaseError) Error() string {
	return fmt.Sprintf(`no PostgreSQL answers at %s (%v), and no container could be started (%v).
Start one and run the demo again, for example:
  docker run -d --name herald-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17
or, on Debian/Ubuntu with the postgresql package installed:
  sudo pg_ctlcluster 17 main start
then point the demo at it with --database-url or DATABASE_URL
(default %s).`, e.URL, e.Err, e.Docker, DefaultDatabaseURL)
}

// Unwrap returns the connection error.
func (e *NoDatabaseError) Unwrap() error { return e.Err }

// StartPostgresFunc starts a PostgreSQL server and returns its URL and a
// function stopping it.
type StartPostgresFunc func(ctx context.Context) (url string, stop func(), err error)

// StartContainer starts PostgresImage with testcontainers-go when a Docker
// engine answers.
func StartContainer(ctx context.Context) (string, func(), error) {
	if _, err := testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		return "", nil, fmt.Errorf("no Docker engine: %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, PostgresImage,
		tcpostgres.WithDatabase("herald"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return "", nil, fmt.Errorf("starting a %s container: %w", PostgresImage, err)
	}
	url, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return "", nil, fmt.Errorf("reading the container's address: %w", err)
	}
	return url, func() { _ = testcontainers.TerminateContainer(ctr) }, nil
}

// resolveDatabase returns a URL where PostgreSQL answers: url itself, or a
// server start launched. stop is nil when nothing was started.
func resolveDatabase(ctx context.Context, url string, start StartPostgresFunc, note func(string)) (string, func(), error) {
	err := ping(ctx, url)
	if err == nil {
		return url, nil, nil
	}
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		// The server answered and refused us: starting another will not help.
		return "", nil, fmt.Errorf("connecting to %s: %s", relayconfig.RedactURL(url), relayconfig.ScrubPassword(err.Error(), url))
	}
	note(fmt.Sprintf("no PostgreSQL at %s; trying to start %s with Docker (testcontainers)…", relayconfig.RedactURL(url), PostgresImage))
	started, stop, derr := start(ctx)
	if derr != nil {
		return "", nil, &NoDatabaseError{URL: relayconfig.RedactURL(url), Err: errors.New(relayconfig.ScrubPassword(err.Error(), url)), Docker: derr}
	}
	if err := ping(ctx, started); err != nil {
		stop()
		return "", nil, fmt.Errorf("the started PostgreSQL does not answer: %w", err)
	}
	note("started PostgreSQL in a container: " + relayconfig.RedactURL(started) + " (removed at the end)")
	return started, stop, nil
}

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// pgDatabase is the demo's database on PostgreSQL: one pool for the order
// service, the relay and the dead letters, which notifications wake.
type pgDatabase struct {
	url    string
	pool   *pgxpool.Pool
	tables migrations.Tables
}

// openPostgres connects to Options.DatabaseURL, or to a server
// StartPostgres starts when none answers there (started is then true).
func (d *run) openPostgres(ctx context.Context) (_ *pgDatabase, started bool, err error) {
	url, stop, err := resolveDatabase(ctx, d.opts.DatabaseURL, d.opts.StartPostgres, d.note)
	if err != nil {
		return nil, false, err
	}
	if stop != nil {
		d.addCloser(stop)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, stop != nil, fmt.Errorf("database url: %s", relayconfig.ScrubPassword(err.Error(), url))
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, stop != nil, fmt.Errorf("connecting to %s: %w", relayconfig.RedactURL(url), err)
	}
	return &pgDatabase{url: url, pool: pool, tables: d.tables}, stop != nil, nil
}

func (p *pgDatabase) String() string { return "PostgreSQL " + relayconfig.RedactURL(p.url) }

func (p *pgDatabase) schemaExists(ctx context.Context) (bool, error) {
	var exists bool
	if err := p.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", p.tables.Schema).Scan(&exists); err != nil {
		return false, fmt.Errorf("looking for schema %s: %w", p.tables.Schema, err)
	}
	return exists, nil
}

func (p *pgDatabase) dropSchema(ctx context.Context) error {
	return migrations.DropSchema(ctx, p.pool, p.tables)
}

func (p *pgDatabase) migrate(ctx context.Context) error {
	m, err := migrations.NewMigrator(p.pool, p.tables, nil)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, 0); err != nil {
		return fmt.Errorf("migrating schema %s: %w", p.tables.Schema, err)
	}
	return shop.Migrate(ctx, p.pool, p.tables.Schema)
}

func (p *pgDatabase) deadLetters() (*deadletter.Store, error) {
	return deadletter.New(p.pool, p.tables)
}

func (p *pgDatabase) newRelay(cfg relay.Config) (*relay.Relay, error) {
	return relay.NewPostgres(p.pool, cfg)
}

func (p *pgDatabase) newShop(cfg shop.Config) (*shop.Service, error) {
	w, err := outbox.NewWriter(outbox.Config{Tables: p.tables})
	if err != nil {
		return nil, err
	}
	cfg.Outbox = w
	return shop.New(p.pool, cfg)
}

func (p *pgDatabase) polls() bool { return false }

func (p *pgDatabase) close() { p.pool.Close() }
