package deadletter

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/relay/internal/mysqlstore"
	"github.com/heraldhq/herald/relay/internal/pgstore"
)

// DB is what the PostgreSQL store needs from a connection pool;
// *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// New returns a Store on PostgreSQL for the tables t (defaults filled in).
// Relays are woken by a NOTIFY after each batch that changed their queues.
func New(db DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Store{db: pgstore.NewOperator(db, t), outbox: t.Outbox(), batchSize: DefaultBatchSize}, nil
}

// NewMySQL returns a Store on MySQL or MariaDB for the tables t (defaults
// filled in). Open db as a relay's (relay.OpenMySQL): the statements need
// its settings (interpolated parameters, times in UTC, a lock wait timeout
// of a second). MySQL has no notifications: relays find the deliveries a
// batch made due at their next poll of the queues.
func NewMySQL(db *sql.DB, t migrations.Tables) (*Store, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	mt, err := mysqlmigrations.NewTables(t)
	if err != nil {
		return nil, err
	}
	return &Store{db: mysqlstore.NewOperator(db, mt), outbox: mt.Outbox(), batchSize: DefaultBatchSize}, nil
}
