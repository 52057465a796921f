package relaycmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/sinks/redis"
)

// setup is what a command gathers from its flags, the environment and the
// configuration file.
type setup struct {
	// file is nil when no --config was given.
	file   *relayconfig.File
	dbURL  string
	tables migrations.Tables
	logger *slog.Logger
	// version is the binary's version as WithVersion set it.
	version string
}

// loadRead is for commands that do not start sinks (migrate, status, dlq):
// it reads the configuration, if one is given, with
// relayconfig.LoadReadOnly, so the ${VAR}s of sections it does not use (the
// admin token, webhook secrets) need not be set.
func (g *globalFlags) loadRead(requireConfig bool) (*setup, error) {
	return g.loadWith(requireConfig, g.loader().LoadReadOnly)
}

// loadAll is for commands that start sinks (run, config check): the whole
// configuration is required, read and checked.
func (g *globalFlags) loadAll() (*setup, error) {
	return g.loadWith(true, g.loader().Load)
}

// loader reads configuration files with the sink types Main was given.
func (g *globalFlags) loader() relayconfig.Loader {
	return relayconfig.Loader{SinkTypes: g.opts.sinkTypes}
}

// mysql reports whether the database URL names MySQL (or MariaDB).
func (s *setup) mysql() bool { return mysqlurl.Is(s.dbURL) }

// loadWith reads the configuration (required or not) with read and
// resolves the database URL (--database-url, then DATABASE_URL, then
// database.url) and the tables (--schema and --table over the file's).
// Errors are usage errors.
func (g *globalFlags) loadWith(requireConfig bool, read func(string, func(string) (string, bool)) (*relayconfig.File, error)) (*setup, error) {
	s := &setup{version: g.opts.version}
	if g.config != "" {
		f, err := read(g.config, os.LookupEnv)
		if err != nil {
			return nil, usageError(err)
		}
		s.file = f
		s.dbURL = f.DatabaseURL()
		s.tables = f.Tables()
		s.logger = f.Log.NewLogger(os.Stderr)
	} else {
		if requireConfig {
			return nil, usageError(errors.New("--config: required (the YAML configuration file)"))
		}
		s.dbURL = os.Getenv("DATABASE_URL")
		s.tables = migrations.Tables{}.WithDefaults()
		s.logger = relayconfig.Log{}.NewLogger(os.Stderr)
	}
	// go-redis logs through a logger of its own, process-wide.
	redis.LogLibraryTo(s.logger)
	if g.databaseURL != "" {
		if mysqlurl.Is(g.databaseURL) {
			if _, err := mysqlurl.Config(g.databaseURL); err != nil {
				return nil, usageError(fmt.Errorf("--database-url: %s", relayconfig.ScrubPassword(err.Error(), g.databaseURL)))
			}
		} else if _, err := pgxpool.ParseConfig(g.databaseURL); err != nil {
			return nil, usageError(fmt.Errorf("--database-url: %s", relayconfig.ScrubPassword(err.Error(), g.databaseURL)))
		}
		s.dbURL = g.databaseURL
	}
	if s.dbURL == "" {
		return nil, usageError(errors.New("--database-url: no database given (use --database-url, DATABASE_URL or database.url in --config)"))
	}
	if g.schema != "" {
		s.tables.Schema = g.schema
	}
	if g.table != "" {
		s.tables.Table = g.table
	}
	if err := s.tables.Validate(); err != nil {
		return nil, usageError(err)
	}
	return s, nil
}

// redactedURL is the database URL as it may be printed.
func (s *setup) redactedURL() string { return relayconfig.RedactURL(s.dbURL) }

// scrub removes the database password from an error before it is printed.
func (s *setup) scrub(err error) error {
	if err == nil {
		return nil
	}
	msg := relayconfig.ScrubPassword(err.Error(), s.dbURL)
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// pingTimeout bounds one connection attempt.
const pingTimeout = 10 * time.Second

// newPool returns a pool on the database (connections are opened lazily).
// configure, when given, adjusts the pool first (relay.ConfigurePool for
// the relay's own sessions).
func (s *setup) newPool(ctx context.Context, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return nil, usageError(fmt.Errorf("database.url: %w", s.scrub(err)))
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, runtimeError(fmt.Errorf("creating connection pool for %s: %w", s.redactedURL(), s.scrub(err)))
	}
	return pool, nil
}

// connect opens a small pool (an operator command's) and checks the
// database answers; one attempt.
func (s *setup) connect(ctx context.Context) (database, error) {
	db, err := s.open(ctx, false)
	if err != nil {
		return database{}, err
	}
	if err := db.Ping(ctx); err != nil {
		db.Close()
		return database{}, runtimeError(fmt.Errorf("connecting to %s: %w", s.redactedURL(), s.scrub(err)))
	}
	return db, nil
}
