package relaycmd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// database is an open connection pool on the outbox's database: a pgx pool
// on PostgreSQL, a *sql.DB on MySQL and MariaDB (exactly one is set). It
// is the one place the commands choose between the two.
type database struct {
	pool *pgxpool.Pool
	my   *sql.DB
}

// open returns a pool on the database (connections are opened lazily). A
// relay's pool (forRelay) is sized for its loops and has the session
// settings the relay's store needs; an operator command's is small.
func (s *setup) open(ctx context.Context, forRelay bool) (database, error) {
	if s.mysql() {
		workers := 1
		if forRelay {
			workers = relay.Config{Workers: s.file.Relay.Workers}.WithDefaults().Workers
		}
		// OpenMySQL's settings serve the dead-letter operations too: they
		// run their writes as the relay does.
		db, err := relay.OpenMySQL(s.dbURL, workers)
		if err != nil {
			return database{}, usageError(fmt.Errorf("database.url: %w", s.scrub(err)))
		}
		if forRelay {
			db.SetMaxOpenConns(int(s.file.MaxConns()))
		}
		return database{my: db}, nil
	}
	var configure []func(*pgxpool.Config)
	if forRelay {
		configure = append(configure, relay.ConfigurePool, func(c *pgxpool.Config) { c.MaxConns = s.file.MaxConns() })
	}
	pool, err := s.newPool(ctx, configure...)
	if err != nil {
		return database{}, err
	}
	return database{pool: pool}, nil
}

// Close closes the pool.
func (d database) Close() {
	if d.my != nil {
		d.my.Close()
		return
	}
	d.pool.Close()
}

// Ping checks the database answers, within pingTimeout; /readyz calls it.
func (d database) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if d.my != nil {
		return d.my.PingContext(ctx)
	}
	return d.pool.Ping(ctx)
}

// checkSchema fails unless the tables are migrated to this binary's
// version.
func (d database) checkSchema(ctx context.Context, t migrations.Tables) error {
	if d.my != nil {
		return mysqlmigrations.Check(ctx, d.my, t)
	}
	return migrations.Check(ctx, d.pool, t)
}

// deadLetters returns the dead-letter store of the tables t.
func (d database) deadLetters(t migrations.Tables) (*deadletter.Store, error) {
	if d.my != nil {
		return deadletter.NewMySQL(d.my, t)
	}
	return deadletter.New(d.pool, t)
}

// newRelay returns the relay of cfg on the database.
func (d database) newRelay(cfg relay.Config) (*relay.Relay, error) {
	if d.my != nil {
		return relay.NewMySQL(d.my, cfg)
	}
	return relay.NewPostgres(d.pool, cfg)
}

// permanentConnectError reports a refusal by the server that retrying will
// not fix: bad credentials or a database that does not exist.
func permanentConnectError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "3D000" || pgErr.Code == "28000" || pgErr.Code == "28P01"
	}
	var myErr *gomysql.MySQLError
	if errors.As(err, &myErr) {
		// Access denied for the user, or to the database; unknown database.
		return myErr.Number == 1045 || myErr.Number == 1044 || myErr.Number == 1049
	}
	return false
}
