package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	"github.com/heraldhq/herald/migrations"
)

//go:embed [0-9]*.sql
var files embed.FS

// All returns every embedded MySQL migration rendered for t, in version
// order.
func All(t Tables) ([]migrations.Migration, error) {
	return migrations.Load(files, t)
}

// Latest is the newest MySQL schema version this binary knows. MySQL's
// versions are numbered on their own: version 1 holds the model of
// PostgreSQL's version 8.
func Latest() int {
	t, err := NewTables(migrations.Tables{})
	if err != nil {
		return 0
	}
	ms, err := All(t)
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Statements splits a migration into the statements it runs, one at a
// time: the driver sends one statement per call unless the DSN allows
// several (multiStatements), which the migrator cannot count on. A
// statement ends at a line ending with a semicolon; chunks holding only
// comments are left out.
func Statements(migration string) []string {
	var (
		out  []string
		cur  strings.Builder
		code bool // cur holds more than comments and blank lines
	)
	for line := range strings.Lines(migration) {
		cur.WriteString(line)
		trimmed := strings.TrimSpace(line)
		if trimmed != "" && !strings.HasPrefix(trimmed, "--") {
			code = true
		}
		if strings.HasSuffix(trimmed, ";") && code {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
			code = false
		}
	}
	if code {
		out = append(out, strings.TrimSpace(cur.String()))
	}
	return out
}

// Migrator applies and reverts MySQL migrations. Several migrators may run
// at once against one database: a named lock (GET_LOCK) serialises them.
// MySQL commits each DDL statement by itself, so a migration is not one
// transaction; its statements are written to be run again, and a migration
// that failed half way is completed by running Up again once the cause is
// fixed. Its version is recorded after its last statement.
type Migrator struct {
	db     *sql.DB
	tables Tables
	logger *slog.Logger
}

// NewMigrator returns a migrator for the tables t (defaults filled in) on db,
// a *sql.DB opened with a MySQL driver. A nil logger discards logs.
func NewMigrator(db *sql.DB, t migrations.Tables, logger *slog.Logger) (*Migrator, error) {
	tables, err := NewTables(t)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Migrator{db: db, tables: tables, logger: logger}, nil
}

// Up applies every pending migration up to target (0 means the latest) and
// returns those it applied. Running it again applies nothing.
func (m *Migrator) Up(ctx context.Context, target int) ([]migrations.Migration, error) {
	all, err := All(m.tables)
	if err != nil {
		return nil, err
	}
	if target == 0 {
		target = len(all)
	}
	if target < 0 || target > len(all) {
		return nil, fmt.Errorf("migrate up: target version %d is not between 1 and %d", target, len(all))
	}
	var applied []migrations.Migration
	err = m.locked(ctx, func(conn *sql.Conn) error {
		current, err := m.current(ctx, conn)
		if err != nil {
			return err
		}
		if current > len(all) {
			return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", migrations.ErrSchemaTooNew, current, len(all))
		}
		for _, mig := range all[current:target] {
			if err := m.apply(ctx, conn, mig.Up); err != nil {
				return fmt.Errorf("applying migration %03d_%s: %w", mig.Version, mig.Name, err)
			}
			if _, err := conn.ExecContext(ctx, "INSERT INTO "+m.tables.Versions()+" (version, name) VALUES (?, ?)", mig.Version, mig.Name); err != nil {
				return fmt.Errorf("applying migration %03d_%s: recording version: %w", mig.Version, mig.Name, err)
			}
			m.logger.InfoContext(ctx, "migrations: applied", "version", mig.Version, "name", mig.Name)
			applied = append(applied, mig)
		}
		return nil
	})
	return applied, err
}

// Down reverts the newest steps migrations (at least one) and returns those
// it reverted, newest first.
func (m *Migrator) Down(ctx context.Context, steps int) ([]migrations.Migration, error) {
	if steps < 1 {
		return nil, fmt.Errorf("migrate down: steps must be at least 1, got %d", steps)
	}
	all, err := All(m.tables)
	if err != nil {
		return nil, err
	}
	var reverted []migrations.Migration
	err = m.locked(ctx, func(conn *sql.Conn) error {
		current, err := m.current(ctx, conn)
		if err != nil {
			return err
		}
		if current > len(all) {
			return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", migrations.ErrSchemaTooNew, current, len(all))
		}
		for v := current; v > 0 && v > current-steps; v-- {
			mig := all[v-1]
			if err := m.apply(ctx, conn, mig.Down); err != nil {
				return fmt.Errorf("reverting migration %03d_%s: %w", mig.Version, mig.Name, err)
			}
			if _, err := conn.ExecContext(ctx, "DELETE FROM "+m.tables.Versions()+" WHERE version = ?", mig.Version); err != nil {
				return fmt.Errorf("reverting migration %03d_%s: recording version: %w", mig.Version, mig.Name, err)
			}
			m.logger.InfoContext(ctx, "migrations: reverted", "version", mig.Version, "name", mig.Name)
			reverted = append(reverted, mig)
		}
		return nil
	})
	return reverted, err
}

// Status lists every known migration with the time it was applied, if it was.
func (m *Migrator) Status(ctx context.Context) ([]migrations.Status, error) {
	all, err := All(m.tables)
	if err != nil {
		return nil, err
	}
	applied, err := m.appliedAt(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]migrations.Status, len(all))
	for i, mig := range all {
		out[i] = migrations.Status{Migration: mig, AppliedAt: applied[mig.Version]}
	}
	return out, nil
}

// Check returns nil when the database holds exactly the latest MySQL schema
// version, migrations.ErrNotMigrated when it is behind, and
// migrations.ErrSchemaTooNew when it is ahead.
func Check(ctx context.Context, db *sql.DB, t migrations.Tables) error {
	m, err := NewMigrator(db, t, nil)
	if err != nil {
		return err
	}
	applied, err := m.appliedAt(ctx)
	if err != nil {
		return err
	}
	return migrations.CheckApplied(applied, Latest(), m.tables.Outbox())
}

// timeFormat reads a DATETIME(6) as text, whatever the DSN's parseTime and
// loc: the columns hold UTC.
const timeFormat = "%Y-%m-%dT%H:%i:%s.%fZ"

func (m *Migrator) appliedAt(ctx context.Context) (map[int]time.Time, error) {
	out := map[int]time.Time{}
	var n int
	if err := m.db.QueryRowContext(ctx,
		"SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
		nullable(m.tables.Database()), m.tables.unqualified("migrations")).Scan(&n); err != nil {
		return nil, fmt.Errorf("checking migrations table: %w", err)
	}
	if n == 0 {
		return out, nil
	}
	rows, err := m.db.QueryContext(ctx, "SELECT version, DATE_FORMAT(applied_at, '"+timeFormat+"') FROM "+m.tables.Versions())
	if err != nil {
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			v  int
			at string
		)
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("reading applied migrations: %w", err)
		}
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return nil, fmt.Errorf("reading applied migrations: version %d: applied_at %q: %w", v, at, err)
		}
		out[v] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	return out, nil
}

// nullable is s, or NULL when it is empty.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// lockWait is how long one GET_LOCK call waits; the migrator calls it again
// until it has the lock or ctx ends.
const lockWait = 5

// locked runs fn on one connection holding a named lock (GET_LOCK) keyed by
// the database and table names, creating the version table first.
func (m *Migrator) locked(ctx context.Context, fn func(*sql.Conn) error) error {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connecting for migrations: %w", err)
	}
	defer conn.Close()
	database := m.tables.Database()
	if database == "" {
		var current sql.NullString
		if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&current); err != nil {
			return fmt.Errorf("reading the connection's database: %w", err)
		}
		if !current.Valid {
			return errors.New("the connection has no database: name one in the URL's path (mysql://user@host:3306/DATABASE)")
		}
		database = current.String
	}
	lockName := m.lockName(database)
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lockName, lockWait).Scan(&got); err != nil {
			return fmt.Errorf("taking migration lock %s: %w", lockName, err)
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if !got.Valid {
			return fmt.Errorf("taking migration lock %s: GET_LOCK returned NULL (an error, or the session was killed)", lockName)
		}
		m.logger.InfoContext(ctx, "migrations: waiting for another migrator's lock", "lock", lockName)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("taking migration lock %s: %w", lockName, err)
		}
	}
	defer func() {
		// A fresh context: the lock must be released even when ctx is done.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(unlockCtx, "DO RELEASE_LOCK(?)", lockName); err != nil {
			// The lock lives as long as the session: discard the connection
			// rather than return it to the pool still holding the lock.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	setup := "CREATE TABLE IF NOT EXISTS " + m.tables.Versions() + ` (
    version    INT          NOT NULL,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (utc_timestamp(6)),
    PRIMARY KEY (version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`
	if _, err := conn.ExecContext(ctx, setup); err != nil {
		return fmt.Errorf("creating migrations table %s: %w", m.tables.Versions(), err)
	}
	return fn(conn)
}

// lockName is the migration lock's name for the tables in database. MySQL
// allows 64 characters: longer names are replaced by a hash of themselves.
func (m *Migrator) lockName(database string) string {
	name := "herald.migrate." + database + "." + m.tables.names.Table
	if len(name) > 64 {
		h := fnv.New64a()
		h.Write([]byte(database + "." + m.tables.names.Table))
		name = fmt.Sprintf("herald.migrate.%016x", h.Sum64())
	}
	return name
}

func (m *Migrator) current(ctx context.Context, conn *sql.Conn) (int, error) {
	var v int
	if err := conn.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM "+m.tables.Versions()).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}

// apply runs a migration's statements in order, naming the one that failed.
func (m *Migrator) apply(ctx context.Context, conn *sql.Conn, migration string) error {
	stmts := Statements(migration)
	for i, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("statement %d of %d (%s): %w", i+1, len(stmts), firstLine(stmt), err)
		}
	}
	return nil
}

// firstLine is a statement's first line of code, to name it in an error.
func firstLine(stmt string) string {
	for line := range strings.Lines(stmt) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--") {
			return line
		}
	}
	return ""
}
