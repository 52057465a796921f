package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/examples/orders/shop"
	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/outbox"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
)

// This file holds the demo's MySQL or MariaDB: its database, relay, dead
// letters and order service.

// mysqlWorkers are the relay's workers on MySQL, which size its pool.
const mysqlWorkers = 2

// mysqlDatabase is the demo's database on MySQL or MariaDB. The demo's
// schema is a database of its own, created and dropped like the
// PostgreSQL schema; every table name is qualified with it, so the URL's
// database is only where connections start.
type mysqlDatabase struct {
	url    string
	tables migrations.Tables
	// shop is the order service's pool; relayDB is the relay's and the dead
	// letters', opened with the settings they need (relay.OpenMySQL).
	shop, relayDB *sql.DB
}

// openMySQL connects to the server of url and checks that it answers.
func openMySQL(ctx context.Context, url string, tables migrations.Tables) (*mysqlDatabase, error) {
	shopDB, err := mysqlurl.Open(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	shopDB.SetMaxOpenConns(20)
	relayDB, err := relay.OpenMySQL(url, mysqlWorkers)
	if err != nil {
		shopDB.Close()
		return nil, err
	}
	m := &mysqlDatabase{url: url, tables: tables, shop: shopDB, relayDB: relayDB}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := shopDB.PingContext(pingCtx); err != nil {
		m.close()
		redacted, scrubbed := relayconfig.RedactURL(url), errors.New(relayconfig.ScrubPassword(err.Error(), url))
		var refused *gomysql.MySQLError
		switch {
		case errors.As(err, &refused) && refused.Number == erUnknownDatabase:
			cfg, _ := mysqlurl.Config(url) // it parsed to open the pool
			return nil, &MissingDatabaseError{URL: redacted, Database: cfg.DBName, Err: scrubbed}
		case errors.As(err, &refused):
			// The server answered and refused: starting one would not help.
			return nil, fmt.Errorf("the MySQL or MariaDB server at %s refused the demo: %w", redacted, scrubbed)
		}
		return nil, &NoMySQLError{URL: redacted, Err: scrubbed}
	}
	return m, nil
}

// erUnknownDatabase is MySQL's and MariaDB's ER_BAD_DB_ERROR: the
// connection names a database the server does not have.
const erUnknownDatabase = 1049

// MissingDatabaseError means a MySQL or MariaDB server answered but has
// no database of the name the URL gives. Its message says what to do.
type MissingDatabaseError struct {
	// URL is the (redacted) URL that was tried.
	URL string
	// Database is the database the URL names.
	Database string
	// Err is the server's answer.
	Err error
}

// Error says the database is missing, not the server.
func (e *MissingDatabaseError) Error() string {
	return fmt.Sprintf(`the MySQL or MariaDB server at %s answers, but has no database %s (%v).
The demo connects through the URL's database and works in a database of its
own (%s_…, created and dropped). Create it:
  CREATE DATABASE %s;
or point --database-url or DATABASE_URL at one that exists, for example
mysql://root@127.0.0.1:3306/test.`, e.URL, e.Database, e.Err, DefaultSchema, "`"+e.Database+"`")
}

// Unwrap returns the server's answer.
func (e *MissingDatabaseError) Unwrap() error { return e.Err }

// NoMySQLError means no MySQL or MariaDB answered at the URL. Its message
// says what to run to get one.
type NoMySQLError struct {
	// URL is the (redacted) URL that was tried.
	URL string
	// Err is why connecting failed.
	Err error
}

// Error explains what to run.
func (e *NoMySQLError) Error() string {
	return fmt.Sprintf(`no MySQL or MariaDB answers at %s (%v).
Start one and run the demo again, for example:
  docker run -d --name herald-mariadb -p 3306:3306 -e MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1 -e MARIADB_DATABASE=test mariadb:11
then point the demo at it with --database-url or DATABASE_URL
(for example mysql://root@127.0.0.1:3306/test).`, e.URL, e.Err)
}

// Unwrap returns the connection error.
func (e *NoMySQLError) Unwrap() error { return e.Err }

func (m *mysqlDatabase) String() string { return "MySQL " + relayconfig.RedactURL(m.url) }

// quotedSchema is the demo's database, quoted. validate refused backticks
// in it (mysqlmigrations.NewTables).
func (m *mysqlDatabase) quotedSchema() string { return "`" + m.tables.Schema + "`" }

func (m *mysqlDatabase) schemaExists(ctx context.Context) (bool, error) {
	var n int
	if err := m.shop.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", m.tables.Schema).Scan(&n); err != nil {
		return false, fmt.Errorf("looking for database %s: %w", m.tables.Schema, err)
	}
	return n > 0, nil
}

func (m *mysqlDatabase) dropSchema(ctx context.Context) error {
	if _, err := m.shop.ExecContext(ctx, "DROP DATABASE IF EXISTS "+m.quotedSchema()); err != nil {
		return fmt.Errorf("dropping database %s: %w", m.tables.Schema, err)
	}
	return nil
}

func (m *mysqlDatabase) migrate(ctx context.Context) error {
	if _, err := m.shop.ExecContext(ctx, "CREATE DATABASE "+m.quotedSchema()+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return fmt.Errorf("creating database %s: %w", m.tables.Schema, err)
	}
	mig, err := mysqlmigrations.NewMigrator(m.relayDB, m.tables, nil)
	if err != nil {
		return err
	}
	if _, err := mig.Up(ctx, 0); err != nil {
		return fmt.Errorf("migrating database %s: %w", m.tables.Schema, err)
	}
	return shop.MigrateMySQL(ctx, m.shop, m.tables.Schema)
}

func (m *mysqlDatabase) deadLetters() (*deadletter.Store, error) {
	return deadletter.NewMySQL(m.relayDB, m.tables)
}

func (m *mysqlDatabase) newRelay(cfg relay.Config) (*relay.Relay, error) {
	cfg.Workers = mysqlWorkers
	return relay.NewMySQL(m.relayDB, cfg)
}

func (m *mysqlDatabase) newShop(cfg shop.Config) (*shop.Service, error) {
	w, err := outbox.NewWriter(outbox.Config{Dialect: outbox.MySQL, Tables: m.tables})
	if err != nil {
		return nil, err
	}
	cfg.Outbox = w
	return shop.NewMySQL(m.shop, cfg)
}

// polls is true: MySQL has no LISTEN/NOTIFY.
func (m *mysqlDatabase) polls() bool { return true }

func (m *mysqlDatabase) close() {
	m.shop.Close()
	m.relayDB.Close()
}
