// Package mysql holds Herald's schema for MySQL 8.0.16+ and MariaDB 10.6+ as
// embedded, versioned SQL files, the migrator that applies them, and the
// quoting of the tables' names in MySQL's dialect. It is the MySQL twin of
// package migrations and returns the same Migration and Status values.
//
// It needs only database/sql: the caller opens the *sql.DB with a MySQL
// driver (github.com/go-sql-driver/mysql), so that an application importing
// the outbox library for PostgreSQL does not build a MySQL driver.
package mysql

import (
	"fmt"
	"strings"

	"github.com/heraldhq/herald/migrations"
)

// Tables names Herald's tables on MySQL, quoted with backticks. Build it
// with NewTables.
type Tables struct {
	names migrations.Tables
}

// NewTables returns the MySQL names of t (defaults filled in). MySQL's
// schemas are its databases: t.Schema names the database holding the
// tables, except that PostgreSQL's default, "public", and "" mean the
// database the connection opened (the URL's path), which is where tables
// usually live.
func NewTables(t migrations.Tables) (Tables, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return Tables{}, err
	}
	for _, f := range []struct{ field, value string }{{"schema", t.Schema}, {"table", t.Table}} {
		if strings.ContainsRune(f.value, '`') {
			return Tables{}, fmt.Errorf("database.%s: %q must not contain a backtick", f.field, f.value)
		}
		if strings.HasSuffix(f.value, " ") {
			return Tables{}, fmt.Errorf("database.%s: %q must not end with a space, which MySQL refuses in names", f.field, f.value)
		}
	}
	return Tables{names: t}, nil
}

// Names returns the names the Tables were made of.
func (t Tables) Names() migrations.Tables { return t.names }

// Database is the database holding the tables, "" for the connection's.
func (t Tables) Database() string {
	if t.names.Schema == "public" {
		return ""
	}
	return t.names.Schema
}

// quote quotes a MySQL identifier. NewTables refuses backticks; doubling
// them keeps quote safe for any string all the same.
func quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

func (t Tables) qualified(name string) string {
	if db := t.Database(); db != "" {
		return quote(db) + "." + quote(name)
	}
	return quote(name)
}

// Outbox is the quoted outbox table.
func (t Tables) Outbox() string { return t.qualified(t.names.Table) }

// Deliveries is the quoted table of per-sink delivery queues and dead
// letters.
func (t Tables) Deliveries() string { return t.qualified(t.names.Table + "_deliveries") }

// Lanes is the quoted table of lane leases.
func (t Tables) Lanes() string { return t.qualified(t.names.Table + "_lanes") }

// Relays is the quoted table of live relays.
func (t Tables) Relays() string { return t.qualified(t.names.Table + "_relays") }

// Stats is the quoted table of per-minute published counts.
func (t Tables) Stats() string { return t.qualified(t.names.Table + "_stats") }

// Versions is the quoted table recording applied migrations.
func (t Tables) Versions() string { return t.qualified(t.names.Table + "_migrations") }

// Name quotes the name of an index or constraint derived from the table,
// unqualified. Constraint names are per database on MySQL, hence the
// table's name in each.
func (t Tables) Name(suffix string) string { return quote(t.names.Table + "_" + suffix) }

// unqualified is a table's bare name, as information_schema lists it.
func (t Tables) unqualified(suffix string) string {
	if suffix == "" {
		return t.names.Table
	}
	return t.names.Table + "_" + suffix
}
