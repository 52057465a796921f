// Command orders is the order service of Herald's orders example. It serves
// the shop package's HTTP API, writing orders and their events in one
// transaction; a relay configured with relay.yaml publishes the events. It
// runs on PostgreSQL or, given a mysql:// database URL
// (mysql://root@127.0.0.1:3306/test), on MySQL 8 or MariaDB 10.6+, where
// the schemas below are databases ("public" meaning the URL's).
//
//	orders                 serve (settings from flags or the environment)
//	orders healthcheck     exit 0 when the service on -listen answers /healthz
//
// Settings (flag, environment variable, default):
//
//	-database-url  DATABASE_URL   postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
//	-listen        LISTEN_ADDR    :8080
//	-schema        ORDERS_SCHEMA  public (schema of the orders table)
//	-outbox-schema HERALD_SCHEMA  public (schema of the outbox, migrated by `relay migrate up`)
//	-nats-url      NATS_URL       empty; when set, the JetStream stream -nats-stream
//	                              covering -nats-prefix.> is created at start
//	-nats-stream   NATS_STREAM    HERALD
//	-nats-prefix   NATS_SUBJECT_PREFIX  herald
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/examples/orders/healthz"
	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// settings are the service's flags.
type settings struct {
	databaseURL  string
	listen       string
	schema       string
	outboxSchema string
	natsURL      string
	natsStream   string
	natsPrefix   string
}

func parseSettings(args []string, env func(string) (string, bool), stderr io.Writer) (*settings, []string, error) {
	get := func(name, def string) string {
		if v, ok := env(name); ok && v != "" {
			return v
		}
		return def
	}
	s := &settings{}
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.databaseURL, "database-url", get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL connection string, or mysql://user:password@host:3306/database")
	fs.StringVar(&s.listen, "listen", get("LISTEN_ADDR", ":8080"), "HTTP listen address")
	fs.StringVar(&s.schema, "schema", get("ORDERS_SCHEMA", shop.DefaultSchema), "schema of the orders table")
	fs.StringVar(&s.outboxSchema, "outbox-schema", get("HERALD_SCHEMA", "public"), "schema of the outbox table")
	fs.StringVar(&s.natsURL, "nats-url", get("NATS_URL", ""), "NATS server whose JetStream stream to create at start (empty: none)")
	fs.StringVar(&s.natsStream, "nats-stream", get("NATS_STREAM", "HERALD"), "JetStream stream to create")
	fs.StringVar(&s.natsPrefix, "nats-prefix", get("NATS_SUBJECT_PREFIX", "herald"), "subject prefix the stream covers (prefix.>)")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	return s, fs.Args(), nil
}

// run serves until ctx ends. ready, when set, receives the listen address
// once the service accepts requests.
func run(ctx context.Context, args []string, env func(string) (string, bool), stderr io.Writer, ready chan<- string) error {
	s, rest, err := parseSettings(args, env, stderr)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 1 && rest[0] == "healthcheck":
		return healthz.Check(ctx, "-listen", s.listen)
	case len(rest) > 0:
		return fmt.Errorf("unknown command %q (want no command, or healthcheck)", strings.Join(rest, " "))
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))

	cfg := shop.Config{Schema: s.schema, Logger: logger, EventHeaders: map[string]string{"x-service": "orders"}}
	open := openPostgres
	if mysqlurl.Is(s.databaseURL) {
		open = openMySQL
	}
	svc, closeDB, err := open(ctx, s, cfg)
	if err != nil {
		return err
	}
	defer closeDB()
	if s.natsURL != "" {
		if err := createStream(ctx, s.natsURL, s.natsStream, s.natsPrefix); err != nil {
			return err
		}
		logger.InfoContext(ctx, "orders: stream ready", "stream", s.natsStream, "subjects", s.natsPrefix+".>")
	}

	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	logger.InfoContext(ctx, "orders: listening", "addr", ln.Addr().String())
	if ready != nil {
		ready <- ln.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving HTTP: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("stopping the HTTP server: %w", err)
	}
	logger.Info("orders: stopped")
	return nil
}

// openPostgres returns the service on PostgreSQL once the outbox is
// migrated, having migrated the orders table, and a function closing its
// pool.
func openPostgres(ctx context.Context, s *settings, cfg shop.Config) (_ *shop.Service, closeDB func(), err error) {
	pool, err := pgxpool.New(ctx, s.databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-database-url: %w", err)
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	tables := migrations.Tables{Schema: s.outboxSchema}.WithDefaults()
	check := func(ctx context.Context) error { return migrations.Check(ctx, pool, tables) }
	if err := waitForOutbox(ctx, check, tables.Outbox(), cfg.Logger); err != nil {
		return nil, nil, err
	}
	if err := shop.Migrate(ctx, pool, s.schema); err != nil {
		return nil, nil, err
	}
	if cfg.Outbox, err = outbox.NewWriter(outbox.Config{Tables: tables}); err != nil {
		return nil, nil, err
	}
	svc, err := shop.New(pool, cfg)
	return svc, pool.Close, err
}

// openMySQL is openPostgres on MySQL or MariaDB.
func openMySQL(ctx context.Context, s *settings, cfg shop.Config) (_ *shop.Service, closeDB func(), err error) {
	db, err := mysqlurl.Open(s.databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-database-url: %w", err)
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	names := migrations.Tables{Schema: s.outboxSchema}.WithDefaults()
	tables, err := mysqlmigrations.NewTables(names)
	if err != nil {
		return nil, nil, fmt.Errorf("-outbox-schema: %w", err)
	}
	check := func(ctx context.Context) error { return mysqlmigrations.Check(ctx, db, names) }
	if err := waitForOutbox(ctx, check, tables.Outbox(), cfg.Logger); err != nil {
		return nil, nil, err
	}
	if err := shop.MigrateMySQL(ctx, db, s.schema); err != nil {
		return nil, nil, err
	}
	if cfg.Outbox, err = outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL, Tables: names}); err != nil {
		return nil, nil, err
	}
	svc, err := shop.NewMySQL(db, cfg)
	return svc, func() { db.Close() }, err
}

// waitForOutbox waits (up to a minute) for the database to answer with the
// outbox migrated, which `relay migrate up` does, possibly at the same time:
// until check, the migrations package's Check, passes.
func waitForOutbox(ctx context.Context, check func(context.Context) error, outboxName string, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, migrations.ErrSchemaTooNew) {
			return err
		}
		logger.InfoContext(ctx, "orders: waiting for the outbox (run `relay migrate up`)", "tables", outboxName, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the outbox %s: %w", outboxName, err)
		case <-time.After(time.Second):
		}
	}
}

// createStream creates (or updates) the JetStream stream that stores what
// the relay publishes to NATS.
func createStream(ctx context.Context, url, name, prefix string) error {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.RetryOnFailedConnect(true), nats.MaxReconnects(30))
	if err != nil {
		return fmt.Errorf("-nats-url: connecting to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("-nats-url: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{prefix + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
		MaxAge:     24 * time.Hour,
	})
	if err != nil {
		return fmt.Errorf("-nats-stream: creating stream %s on %s.>: %w", name, prefix, err)
	}
	return nil
}
