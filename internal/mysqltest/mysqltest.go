// Package mysqltest gives tests a real MySQL or MariaDB: the server at
// MYSQL_URL (default the local server, as root without a password) and a
// fresh database per test, dropped when the test ends. Under CI=true a
// server that does not answer fails the test; elsewhere the test is
// skipped with a message saying how to start one.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
)

// DefaultURL is used when MYSQL_URL is unset.
const DefaultURL = "mysql://root@127.0.0.1:3306/test"

// StartCommand starts this machine's MariaDB when it is down.
const StartCommand = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"

var (
	urlOnce  sync.Once
	urlValue string
	urlErr   error
)

// URL returns the server's URL (MYSQL_URL or DefaultURL) once it has
// answered, or ends the test as described in the package comment.
func URL(t testing.TB) string {
	t.Helper()
	urlOnce.Do(func() { urlValue, urlErr = resolveURL() })
	if urlErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("MySQL/MariaDB is required under CI: %v", urlErr)
		}
		t.Skipf("MySQL/MariaDB not reachable (%v); start it (`%s`) or set MYSQL_URL", urlErr, StartCommand)
	}
	return urlValue
}

func resolveURL() (string, error) {
	raw := os.Getenv("MYSQL_URL")
	if raw == "" {
		raw = DefaultURL
	}
	db, err := admin(raw)
	if err != nil {
		return "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return "", err
	}
	return raw, nil
}

// admin opens the server of raw without selecting a database, to create
// and drop databases.
func admin(raw string) (*sql.DB, error) {
	cfg, err := mysqlurl.Config(raw)
	if err != nil {
		return nil, fmt.Errorf("MYSQL_URL: %w", err)
	}
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("MYSQL_URL: %w", err)
	}
	return sql.OpenDB(conn), nil
}

// Database creates a uniquely named database, returns a *sql.DB on it and
// its mysql:// URL (for commands run by the test), and drops it when the
// test ends.
func Database(t testing.TB) (*sql.DB, string) {
	t.Helper()
	base := URL(t)
	adm, err := admin(base)
	if err != nil {
		t.Fatal(err)
	}
	name := UniqueName("herald_t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		adm.Close()
		t.Fatalf("creating test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer adm.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	dbURL := u.String()
	db, err := mysqlurl.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() }) // runs before the drop: cleanups run last first
	return db, dbURL
}

// Migrated is Database with Herald's tables (the default names) migrated
// into it: the pool, the database's URL and the tables.
func Migrated(t testing.TB) (*sql.DB, string, mysqlmigrations.Tables) {
	t.Helper()
	db, url := Database(t)
	m, err := mysqlmigrations.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), 0); err != nil {
		t.Fatalf("migrating the test database: %v", err)
	}
	tables, err := mysqlmigrations.NewTables(migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	return db, url, tables
}

// UniqueName returns prefix followed by random hex, safe as a name.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}
