package migrations

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// Migration is one versioned schema change, rendered for a set of Tables.
type Migration struct {
	// Version numbers migrations from 1, in the order they apply.
	Version int
	// Name is the file name's descriptive part, e.g. "outbox".
	Name string
	// Up applies the change; Down reverts it.
	Up, Down string
}

// Status is a migration and whether (and when) it was applied.
type Status struct {
	Migration
	// AppliedAt is zero when the migration is not applied.
	AppliedAt time.Time
}

var fileName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

// All returns every embedded migration rendered for t, in version order.
func All(t Tables) ([]Migration, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return Load(files, t)
}

// Load reads the migrations of a directory (NNN_name.up.sql and
// NNN_name.down.sql files, versions from 1 without gaps), each a
// text/template rendered with data, in version order. Package mysql loads
// its own directory with it.
func Load(dir fs.FS, data any) ([]Migration, error) {
	entries, err := fs.ReadDir(dir, ".")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("embedded migration %q: name is not NNN_name.(up|down).sql", e.Name())
		}
		version, _ := strconv.Atoi(m[1])
		raw, err := fs.ReadFile(dir, e.Name())
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		sql, err := render(e.Name(), string(raw), data)
		if err != nil {
			return nil, err
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &Migration{Version: version, Name: m[2]}
			byVersion[version] = mig
		}
		if m[3] == "up" {
			mig.Up = sql
		} else {
			mig.Down = sql
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %03d_%s: needs both an up and a down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %03d_%s: versions must run 1, 2, 3… without gaps", m.Version, m.Name)
		}
	}
	return out, nil
}

// Latest is the newest schema version this binary knows.
func Latest() int {
	ms, err := All(Tables{}.WithDefaults())
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

func render(name, text string, data any) (string, error) {
	tmpl, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("parsing migration %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		return "", fmt.Errorf("rendering migration %s: %w", name, err)
	}
	return b.String(), nil
}

// Migrator applies and reverts migrations. Several migrators may run at once
// against one database: a session advisory lock serialises them, and each
// migration runs in its own transaction together with its version record.
type Migrator struct {
	pool   *pgxpool.Pool
	tables Tables
	logger *slog.Logger
}

// NewMigrator returns a migrator for the tables t (defaults filled in).
// A nil logger discards logs.
func NewMigrator(pool *pgxpool.Pool, t Tables, logger *slog.Logger) (*Migrator, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Migrator{pool: pool, tables: t, logger: logger}, nil
}

// Up applies every pending migration up to target (0 means the latest) and
// returns those it applied. Running it again applies nothing.
func (m *Migrator) Up(ctx context.Context, target int) ([]Migration, error) {
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
	var applied []Migration
	err = m.locked(ctx, func(conn *pgx.Conn) error {
		current, err := m.current(ctx, conn)
		if err != nil {
			return err
		}
		if current > len(all) {
			return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaTooNew, current, len(all))
		}
		for _, mig := range all[current:target] {
			if err := m.apply(ctx, conn, mig.Up, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+m.tables.Versions()+" (version, name) VALUES ($1, $2)", mig.Version, mig.Name)
				return err
			}); err != nil {
				return fmt.Errorf("applying migration %03d_%s: %w", mig.Version, mig.Name, err)
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
func (m *Migrator) Down(ctx context.Context, steps int) ([]Migration, error) {
	if steps < 1 {
		return nil, fmt.Errorf("migrate down: steps must be at least 1, got %d", steps)
	}
	all, err := All(m.tables)
	if err != nil {
		return nil, err
	}
	var reverted []Migration
	err = m.locked(ctx, func(conn *pgx.Conn) error {
		current, err := m.current(ctx, conn)
		if err != nil {
			return err
		}
		if current > len(all) {
			return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaTooNew, current, len(all))
		}
		for v := current; v > 0 && v > current-steps; v-- {
			mig := all[v-1]
			if err := m.apply(ctx, conn, mig.Down, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "DELETE FROM "+m.tables.Versions()+" WHERE version = $1", mig.Version)
				return err
			}); err != nil {
				return fmt.Errorf("reverting migration %03d_%s: %w", mig.Version, mig.Name, err)
			}
			m.logger.InfoContext(ctx, "migrations: reverted", "version", mig.Version, "name", mig.Name)
			reverted = append(reverted, mig)
		}
		return nil
	})
	return reverted, err
}

// Status lists every known migration with the time it was applied, if it was.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	all, err := All(m.tables)
	if err != nil {
		return nil, err
	}
	applied, err := m.appliedAt(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Status, len(all))
	for i, mig := range all {
		out[i] = Status{Migration: mig, AppliedAt: applied[mig.Version]}
	}
	return out, nil
}

// ErrNotMigrated means the schema is missing or older than this binary needs.
var ErrNotMigrated = errors.New("outbox schema is not migrated; run `relay migrate up`")

// ErrSchemaTooNew means the database was migrated by a newer Herald.
var ErrSchemaTooNew = errors.New("outbox schema is newer than this relay; upgrade the relay")

// Check returns nil when the database holds exactly the latest schema version,
// ErrNotMigrated when it is behind, and ErrSchemaTooNew when it is ahead.
func Check(ctx context.Context, pool *pgxpool.Pool, t Tables) error {
	t = t.WithDefaults()
	m, err := NewMigrator(pool, t, nil)
	if err != nil {
		return err
	}
	applied, err := m.appliedAt(ctx)
	if err != nil {
		return err
	}
	return CheckApplied(applied, Latest(), t.Outbox())
}

// CheckApplied compares the newest of the versions applied (each with when
// it was applied) to latest, the version this build needs: nil when they
// are equal, ErrNotMigrated when behind, ErrSchemaTooNew when ahead, the
// error naming outbox (the quoted table). Every store's Check ends with it.
func CheckApplied(applied map[int]time.Time, latest int, outbox string) error {
	current := 0
	for v := range applied {
		current = max(current, v)
	}
	switch {
	case current < latest:
		return fmt.Errorf("%w (tables %s: at version %d, need %d)", ErrNotMigrated, outbox, current, latest)
	case current > latest:
		return fmt.Errorf("%w (tables %s: at version %d, this relay knows up to %d)", ErrSchemaTooNew, outbox, current, latest)
	}
	return nil
}

func (m *Migrator) appliedAt(ctx context.Context) (map[int]time.Time, error) {
	out := map[int]time.Time{}
	var exists bool
	if err := m.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.tables.Versions()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("checking migrations table: %w", err)
	}
	if !exists {
		return out, nil
	}
	rows, err := m.pool.Query(ctx, "SELECT version, applied_at FROM "+m.tables.Versions())
	if err != nil {
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	var (
		v  int
		at time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&v, &at}, func() error { out[v] = at; return nil })
	if err != nil {
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	return out, nil
}

// locked runs fn on one connection holding a session advisory lock keyed by
// the table names, creating the schema and version table first.
func (m *Migrator) locked(ctx context.Context, fn func(*pgx.Conn) error) error {
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connecting for migrations: %w", err)
	}
	defer conn.Release()
	lockKey := "herald.migrate." + m.tables.Schema + "." + m.tables.Table
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", lockKey); err != nil {
		return fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must be released even when ctx is done.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(unlockCtx, "SELECT pg_advisory_unlock(hashtext($1))", lockKey); err != nil {
			// The session ends with the connection; close it so the lock goes too.
			_ = conn.Conn().Close(unlockCtx)
		}
	}()
	setup := "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{m.tables.Schema}.Sanitize() + ";\n" +
		"CREATE TABLE IF NOT EXISTS " + m.tables.Versions() + ` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	if _, err := conn.Exec(ctx, setup); err != nil {
		return fmt.Errorf("creating migrations table %s: %w", m.tables.Versions(), err)
	}
	return fn(conn.Conn())
}

func (m *Migrator) current(ctx context.Context, conn *pgx.Conn) (int, error) {
	var v int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+m.tables.Versions()).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}

func (m *Migrator) apply(ctx context.Context, conn *pgx.Conn, sql string, record func(pgx.Tx) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, sql); err != nil {
		return err
	}
	if err := record(tx); err != nil {
		return fmt.Errorf("recording version: %w", err)
	}
	return tx.Commit(ctx)
}

// DropSchema drops t's schema and everything in it, with what WAL capture
// made for t's outbox outside the schema: its publication and its
// replication slots (ending a reader still connected), which belong to the
// database and would otherwise outlive the schema (a slot left behind pins
// the server's WAL for good). It is for throwaway schemas: demos,
// benchmarks and tests.
func DropSchema(ctx context.Context, pool *pgxpool.Pool, t Tables) error {
	t = t.WithDefaults()
	if err := dropSlots(ctx, pool, t.SlotName()); err != nil {
		return fmt.Errorf("dropping the replication slots of schema %s: %w", t.Schema, err)
	}
	for _, q := range []struct{ sql, what string }{
		{"DROP PUBLICATION IF EXISTS " + t.Publication(), "publication"},
		{"DROP SCHEMA IF EXISTS " + pgx.Identifier{t.Schema}.Sanitize() + " CASCADE", "schema"},
	} {
		if _, err := pool.Exec(ctx, q.sql); err != nil {
			return fmt.Errorf("dropping the %s of schema %s: %w", q.what, t.Schema, err)
		}
	}
	return nil
}

// dropSlots drops the replication slots whose names start with prefix,
// ending the connections that read them first (a relay still stopping):
// a slot left behind pins the server's WAL for good. A slot that turns
// active again meanwhile is tried again.
func dropSlots(ctx context.Context, pool *pgxpool.Pool, prefix string) error {
	for {
		_, err := pool.Exec(ctx, `SELECT CASE WHEN active THEN pg_terminate_backend(active_pid)
            ELSE pg_drop_replication_slot(slot_name) IS NULL END
FROM pg_replication_slots WHERE starts_with(slot_name, $1)`, prefix)
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "55006") { // object_in_use: read again
			return err
		}
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name, $1)", prefix).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
