// Command embedded is a service that runs Herald's relay inside itself
// instead of beside it: one process serves its HTTP API, writing orders and
// their events in one transaction with the outbox package, and relays those
// events to a webhook. It migrates the outbox schema at start, builds its
// sink and route in code, and stops the relay with the service.
//
// Settings (environment variable, default):
//
//	DATABASE_URL   postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
//	LISTEN_ADDR    127.0.0.1:8080
//	HERALD_SCHEMA  public (schema of the outbox and of the orders table)
//	WEBHOOK_URL    required: where order events are POSTed
//	WEBHOOK_SECRET optional: Standard Webhooks secret (whsec_...)
//	ADMIN_TOKEN    optional: bearer token for /herald/dlq; without one,
//	               /herald/dlq answers only requests to a loopback host
//
// API:
//
//	PUT /orders/{id}  body {"status": "paid"}: sets the order's status and
//	                  enqueues orders.<status> keyed by the order id
//	/herald/...       the relay's admin endpoints (healthz, readyz,
//	                  metrics, dlq), as `relay run` serves them on its
//	                  admin port
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/admin"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/metrics"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := options{
		DatabaseURL:   envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		Schema:        envOr("HERALD_SCHEMA", "public"),
		WebhookURL:    os.Getenv("WEBHOOK_URL"),
		WebhookSecret: sinkconfig.Secret(os.Getenv("WEBHOOK_SECRET")),
		AdminToken:    sinkconfig.Secret(os.Getenv("ADMIN_TOKEN")),
		Logger:        logger,
	}
	ln, err := net.Listen("tcp", envOr("LISTEN_ADDR", "127.0.0.1:8080"))
	if err != nil {
		logger.Error("embedded: listening", "error", err)
		os.Exit(1)
	}
	if err := run(ctx, ln, opts); err != nil {
		logger.Error("embedded: stopped", "error", err)
		os.Exit(1)
	}
	logger.Info("embedded: stopped")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// options are the service's settings.
type options struct {
	DatabaseURL   string
	Schema        string
	WebhookURL    string
	WebhookSecret sinkconfig.Secret
	AdminToken    sinkconfig.Secret
	// RelayOwner names the relay in the lanes table; empty means Herald's
	// default (host-pid-random).
	RelayOwner string
	Logger     *slog.Logger
}

// relayWorkers is the relay's claim loops; its pool is sized from it.
const relayWorkers = 2

// run serves the API on ln and relays the outbox until ctx ends, then stops
// both: the HTTP server first (no new events), then the relay, which
// finishes and records its batch in flight. Events committed but not yet
// published stay in the outbox for the next start.
func run(ctx context.Context, ln net.Listener, o options) error {
	defer ln.Close() // run owns ln, also when it returns before serving
	tables := migrations.Tables{Schema: o.Schema, Table: "outbox"}.WithDefaults()
	if err := tables.Validate(); err != nil {
		return err
	}
	if o.WebhookURL == "" {
		return errors.New("WEBHOOK_URL is required")
	}

	// The application's pool: its own transactions, and the outbox writes
	// inside them. pgxpool's defaults are the application's business.
	appPool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return fmt.Errorf("opening the application's pool: %w", err)
	}
	defer appPool.Close()

	// The relay's pool, never shared: ConfigurePool turns off
	// synchronous_commit for its sessions (the application's commits must
	// stay durable), and the relay holds one connection per claim loop plus
	// LISTEN and upkeep at all times, which would starve a shared pool.
	relayCfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	relay.ConfigurePool(relayCfg)
	relayCfg.MaxConns = relay.PoolSize(relayWorkers)
	relayPool, err := pgxpool.NewWithConfig(ctx, relayCfg)
	if err != nil {
		return fmt.Errorf("opening the relay's pool: %w", err)
	}
	defer relayPool.Close()

	if err := migrate(ctx, appPool, tables, o.Logger); err != nil {
		return err
	}
	writer, err := outbox.NewWriter(outbox.Config{Tables: tables})
	if err != nil {
		return err
	}

	billing, err := webhook.New("billing", webhook.Config{URL: o.WebhookURL, Secret: o.WebhookSecret}, o.Logger)
	if err != nil {
		return fmt.Errorf("building the webhook sink: %w", err)
	}
	// The relay never closes sinks: they are the caller's. Close flushes.
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := billing.Close(closeCtx); err != nil {
			o.Logger.Warn("embedded: closing the webhook sink", "error", err)
		}
	}()

	reg := prometheus.NewRegistry()
	observer, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		return fmt.Errorf("registering the relay's metrics: %w", err)
	}
	r, err := relay.NewPostgres(relayPool, relay.Config{
		Tables:   tables,
		Owner:    o.RelayOwner,
		Workers:  relayWorkers,
		Routes:   []relay.Route{{Topics: []string{"orders.*"}, Targets: []relay.Target{{Sink: billing}}}},
		Logger:   o.Logger,
		Observer: observer,
	})
	if err != nil {
		return fmt.Errorf("configuring the relay: %w", err)
	}

	// The admin endpoints `relay run` serves on its own port, mounted on the
	// service's mux instead. Their reads use the relay's pool, which
	// relay.PoolSize leaves a connection for.
	deadLetters, err := deadletter.New(relayPool, tables)
	if err != nil {
		return err
	}
	adminSrv, err := admin.NewForRelay(r, admin.Opts{
		Config:      admin.Config{Token: o.AdminToken},
		DB:          relayPool,
		DeadLetters: deadLetters,
		Metrics:     promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Logger:      o.Logger,
	})
	if err != nil {
		return fmt.Errorf("configuring the admin endpoints: %w", err)
	}

	mux := http.NewServeMux()
	mux.Handle("PUT /orders/{id}", &orderHandler{pool: appPool, writer: writer, tables: tables, logger: o.Logger})
	mux.Handle("/herald/", http.StripPrefix("/herald", adminSrv.Handler()))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	// The relay runs on a context of its own so that the service can stop
	// it when the HTTP server fails, not only when ctx ends.
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(relayCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-relayDone:
		// Run returns before its context ends only when the relay cannot
		// start (schema not migrated, a live relay with the same owner):
		// the service should not accept events nobody will publish.
		runErr = fmt.Errorf("relay: %w", err)
		relayDone <- nil
	case err := <-serveDone:
		runErr = fmt.Errorf("serving HTTP: %w", err)
		serveDone <- nil
	}

	// HTTP first, so that no request writes events while the relay stops.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("stopping the HTTP server: %w", err))
	}
	if err := <-serveDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, fmt.Errorf("serving HTTP: %w", err))
	}
	// Run then stops claiming, finishes and records its batch in flight
	// (bounded by relay.Config.ShutdownTimeout) and gives back its lanes.
	stopRelay()
	if err := <-relayDone; err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("relay: %w", err))
	}
	return runErr
}

// migrate brings the outbox schema to this build's version and creates the
// application's own table next to it.
func migrate(ctx context.Context, pool *pgxpool.Pool, tables migrations.Tables, logger *slog.Logger) error {
	m, err := migrations.NewMigrator(pool, tables, logger)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, 0); err != nil {
		return fmt.Errorf("migrating the outbox: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ordersTable(tables)+` (
    id      text PRIMARY KEY,
    status  text NOT NULL,
    version integer NOT NULL
)`); err != nil {
		return fmt.Errorf("creating the orders table: %w", err)
	}
	return nil
}
