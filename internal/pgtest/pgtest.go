// Package pgtest gives tests a real PostgreSQL: a pool on DATABASE_URL (default
// the local server's "test" database, created when the server answers
// without it) and a fresh, migrated schema per test, dropped when the test
// ends. Under CI=true a missing server fails the test; elsewhere the
// fallback starts one when a test package has set it (by importing
// pgtest/pgcontainer, which starts a container when a Docker engine
// answers), and otherwise the test is skipped with a message saying what to
// start.
//
// The fallback is a separate package so that outbox's tests, which an
// application's `go mod tidy` loads, do not pull the Docker client into
// every application's go.sum.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
)

// DefaultURL is used when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	urlOnce  sync.Once
	urlValue string
	urlErr   error
	fallback func(context.Context) (string, error)
)

// SetFallback sets what starts a throwaway server when none answers at
// DATABASE_URL outside CI: start returns its URL. Call it from an init
// function, before any test asks for a URL.
func SetFallback(start func(context.Context) (string, error)) {
	fallback = start
}

// URL returns a reachable database URL, or ends the test as described in the
// package comment.
func URL(t testing.TB) string {
	t.Helper()
	urlOnce.Do(func() { urlValue, urlErr = resolveURL() })
	if urlErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", urlErr)
		}
		t.Skipf("PostgreSQL not reachable (%v); start one (e.g. `pg_ctlcluster 15 main start`) or set DATABASE_URL", urlErr)
	}
	return urlValue
}

func resolveURL() (string, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = DefaultURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if missingDatabase(err) {
		if cerr := createDatabase(ctx, url); cerr != nil {
			return "", fmt.Errorf("%v; and creating it failed: %w", err, cerr)
		}
		conn, err = pgx.Connect(ctx, url)
	}
	if err == nil {
		conn.Close(ctx)
		return url, nil
	}
	if os.Getenv("CI") == "true" {
		return "", err
	}
	if fallback == nil {
		return "", err
	}
	url, ferr := fallback(context.Background())
	if ferr != nil {
		return "", fmt.Errorf("%v; and the fallback found no server: %w", err, ferr)
	}
	return url, nil
}

// missingDatabase reports whether a server answered that the database does
// not exist.
func missingDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000" // invalid_catalog_name
}

// createDatabase creates the database url names, through the server's
// postgres database. Test binaries run in parallel may race to create it:
// one that finds it created already is done.
func createDatabase(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parsing database URL: %w", err)
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connecting to the postgres database: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	// duplicate_database, or unique_violation when two got past its check.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	return nil
}

// WALURL is URL(t) on a database of its own, created when missing (the
// name of URL's with "_wal" added), for the tests that read a logical
// replication slot. A slot decodes the WAL of its database only: the other
// tests' DDL, schema drops and catalog edits (pg_class rows set by hand to
// test plans) once left a slot unable to map a record's filenode to a
// relation, and every reader of it stopped there.
func WALURL(t testing.TB) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	u, err := url.Parse(URL(t))
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	u.Path = "/" + cfg.Database + "_wal"
	walOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		walErr = createDatabase(ctx, u.String())
	})
	if walErr != nil {
		t.Fatalf("the WAL tests' database: %v", walErr)
	}
	return u.String()
}

var (
	walOnce sync.Once
	walErr  error
)

// WALPool returns a pool on WALURL(t), closed when the test ends.
func WALPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return poolOn(t, WALURL(t))
}

// Pool returns a pool on URL(t), closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return poolOn(t, URL(t))
}

func poolOn(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting to PostgreSQL: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates a uniquely named schema with Herald's tables migrated into
// it and drops it (cascading) when the test ends.
func Schema(t testing.TB, pool *pgxpool.Pool) migrations.Tables {
	t.Helper()
	tables := migrations.Tables{Schema: UniqueName("herald_t"), Table: "outbox"}
	m, err := migrations.NewMigrator(pool, tables, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), 0); err != nil {
		t.Fatalf("migrating test schema %s: %v", tables.Schema, err)
	}
	t.Cleanup(func() { DropSchema(t, pool, tables.Schema) })
	return tables
}

// DropSchema drops a schema and everything in it, and what Herald made for
// the outbox tables in it that lives outside the schema: the publications
// and replication slots of WAL capture (a slot left behind would pin the
// server's WAL for good).
func DropSchema(t testing.TB, pool *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := migrations.DropSchema(ctx, pool, migrations.Tables{Schema: schema}); err != nil {
		t.Errorf("dropping test schema: %v", err)
	}
}

// UniqueName returns prefix followed by random hex, safe as an identifier.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// WALSlotsNeeded is how many replication slots and WAL senders the server
// must allow for the WAL capture tests that run at once (each reads a slot
// of its own, some with a standby relay): the default 10 runs out under
// go test -p 4, and a reader refused a sender retries with a growing pause.
const WALSlotsNeeded = 64

// RequireLogicalWAL skips the test (fails it under CI=true) unless the
// server writes logical WAL, which WAL capture decodes, and allows
// WALSlotsNeeded replication slots and WAL senders: wal_level = logical,
// max_replication_slots and max_wal_senders set with ALTER SYSTEM and a
// restart (.ci/run does).
func RequireLogicalWAL(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	var level string
	var slots, senders int
	err := pool.QueryRow(context.Background(), `SELECT current_setting('wal_level'),
		current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int`).Scan(&level, &slots, &senders)
	if err != nil {
		t.Fatalf("reading wal_level, max_replication_slots and max_wal_senders: %v", err)
	}
	if level == "logical" && slots >= WALSlotsNeeded && senders >= WALSlotsNeeded {
		return
	}
	msg := fmt.Sprintf("PostgreSQL has wal_level = %s, max_replication_slots = %d, max_wal_senders = %d; the WAL capture tests need logical, %d and %d: "+
		"ALTER SYSTEM SET each and restart the server (.ci/run does)", level, slots, senders, WALSlotsNeeded, WALSlotsNeeded)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
