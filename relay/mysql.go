package relay

import (
	"database/sql"
	"fmt"

	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/mysqlstore"
)

// This file is the relay's MySQL and MariaDB entry point: the engine is the
// same, its store is relay/internal/mysqlstore.

// NewMySQL returns a relay on a MySQL 8 or MariaDB 10.6+ database, publishing
// through the sinks named in cfg.Routes. Give it a *sql.DB of its own,
// opened with OpenMySQL. There are no notifications on MySQL: the relay
// polls for new events, soon after work and backing off to
// cfg.PollInterval while idle.
func NewMySQL(db *sql.DB, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Capture == CaptureWAL {
		return nil, fmt.Errorf("database.capture: %w", errCaptureNeedsPostgres)
	}
	tables, err := mysqlmigrations.NewTables(cfg.Tables)
	if err != nil {
		return nil, err
	}
	st := mysqlstore.New(db, tables, mysqlstore.Config{PollInterval: cfg.PollInterval, Logger: cfg.Logger})
	return newRelay(st, cfg), nil
}

// OpenMySQL opens a *sql.DB for a relay on a mysql:// URL, with the
// settings its store needs (interpolated parameters, a lock wait timeout
// of one second unless the URL sets one, times in UTC, sessions at READ
// COMMITTED), at most PoolSize connections for that many workers. Errors
// never quote the URL.
func OpenMySQL(url string, workers int) (*sql.DB, error) {
	db, err := mysqlstore.Open(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	db.SetMaxOpenConns(int(PoolSize(workers)))
	return db, nil
}
