// Package migrations holds Herald's schema as embedded, versioned SQL files
// and the migrator that applies them. It also names the tables: every other
// package builds its SQL from Tables, so identifiers are always quoted.
package migrations

import (
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Tables names the outbox table and its companions. The zero value is not
// usable; call WithDefaults, then Validate.
type Tables struct {
	// Schema is the PostgreSQL schema holding the tables. Defaults to "public".
	Schema string
	// Table is the outbox table's name; companion tables are named after it
	// (outbox_deliveries, outbox_lanes, outbox_relays, outbox_stats,
	// outbox_migrations).
	// Defaults to "outbox".
	Table string
}

// maxIdentifier is PostgreSQL's identifier limit (NAMEDATALEN-1) less the
// longest suffix Herald appends ("_max_attempts_check").
const maxIdentifier = 63 - len("_max_attempts_check")

// WithDefaults returns t with empty fields set to their defaults.
func (t Tables) WithDefaults() Tables {
	if t.Schema == "" {
		t.Schema = "public"
	}
	if t.Table == "" {
		t.Table = "outbox"
	}
	return t
}

// Validate reports a name PostgreSQL would truncate or cannot store. Names are
// always quoted, so quotes and semicolons are harmless, but they are refused
// all the same: they are never intended.
func (t Tables) Validate() error {
	for _, f := range []struct{ field, value string }{{"schema", t.Schema}, {"table", t.Table}} {
		switch {
		case f.value == "":
			return fmt.Errorf("database.%s: must not be empty", f.field)
		case !utf8.ValidString(f.value):
			return fmt.Errorf("database.%s: %q is not valid UTF-8", f.field, f.value)
		case len(f.value) > maxIdentifier:
			return fmt.Errorf("database.%s: %q is longer than %d bytes", f.field, f.value, maxIdentifier)
		case strings.ContainsAny(f.value, "\"';\\\x00"):
			return fmt.Errorf("database.%s: %q must not contain quotes, semicolons, backslashes or NUL", f.field, f.value)
		}
	}
	return nil
}

func (t Tables) qualified(name string) string {
	return pgx.Identifier{t.Schema, name}.Sanitize()
}

// Outbox is the quoted, schema-qualified outbox table.
func (t Tables) Outbox() string { return t.qualified(t.Table) }

// Deliveries is the quoted table of per-sink delivery queues and dead
// letters.
func (t Tables) Deliveries() string { return t.qualified(t.Table + "_deliveries") }

// Holds is the quoted table of per-key, per-sink holds of schema version 4,
// named only by the migrations that create and replace it.
func (t Tables) Holds() string { return t.qualified(t.Table + "_holds") }

// Lanes is the quoted table of lane leases.
func (t Tables) Lanes() string { return t.qualified(t.Table + "_lanes") }

// Relays is the quoted table of live relays.
func (t Tables) Relays() string { return t.qualified(t.Table + "_relays") }

// Stats is the quoted table of per-minute published counts.
func (t Tables) Stats() string { return t.qualified(t.Table + "_stats") }

// Versions is the quoted table recording applied migrations.
func (t Tables) Versions() string { return t.qualified(t.Table + "_migrations") }

// Name quotes an object name derived from the table (an index or constraint),
// unqualified, as CREATE INDEX and constraint clauses expect.
func (t Tables) Name(suffix string) string {
	return pgx.Identifier{t.Table + "_" + suffix}.Sanitize()
}

// Index is the quoted, schema-qualified name of an index derived from the
// table, as DROP INDEX expects.
func (t Tables) Index(suffix string) string { return t.qualified(t.Table + "_" + suffix) }

// Emit is the quoted, schema-qualified name of the function that emits an
// event into the write-ahead log instead of the table (outbox_emit for the
// default table); EmitEvent names the one it and the outbox package call,
// which takes the event's id.
func (t Tables) Emit() string { return t.qualified(t.Table + "_emit") }

// EmitBytes is Emit's variant for a payload that is not JSON.
func (t Tables) EmitBytes() string { return t.qualified(t.Table + "_emit_bytes") }

// EmitEvent is the function Emit and EmitBytes call, taking every column.
func (t Tables) EmitEvent() string { return t.qualified(t.Table + "_emit_event") }

// Publication is the quoted name of the publication a relay reading the
// write-ahead log (capture: wal) subscribes with.
func (t Tables) Publication() string { return pgx.Identifier{t.PublicationName()}.Sanitize() }

// PublicationLiteral is PublicationName as a SQL string literal.
func (t Tables) PublicationLiteral() string {
	return "'" + strings.ReplaceAll(t.PublicationName(), "'", "''") + "'"
}

// PublicationName is Publication unquoted, as the replication protocol
// takes it. Publications are named per database, not per schema: the name
// holds both, or a hash of them when that is too long for a name.
func (t Tables) PublicationName() string { return t.derivedName("herald_wal_") }

// SlotName is the name of the logical replication slot a relay reading the
// write-ahead log uses by default: per database too, and at most 63 bytes
// of lower-case letters, digits and underscores.
func (t Tables) SlotName() string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '_'
	}, t.derivedName("herald_"))
}

// derivedName is prefix, the schema and the table, or a hash of the last
// two when that is longer than a name may be.
func (t Tables) derivedName(prefix string) string {
	name := prefix + t.Schema + "_" + t.Table
	if len(name) > 63 {
		h := fnv.New64a()
		h.Write([]byte(t.Schema + "." + t.Table))
		name = fmt.Sprintf("%s%016x", prefix, h.Sum64())
	}
	return name
}

// MessagePrefix is the prefix of the logical decoding messages that carry
// this outbox's events in the write-ahead log: Channel, which is unique
// per outbox of a database.
func (t Tables) MessagePrefix() string { return t.Channel() }

// Literal quotes s as an SQL string literal, for names a migration passes
// as text (pg_get_serial_sequence's table, a message prefix).
func (t Tables) Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Channel is the LISTEN/NOTIFY channel that wakes relays, as a plain string
// for pg_notify. Use ChannelIdent in a LISTEN statement. Names too long for a
// channel are replaced by a hash of themselves.
func (t Tables) Channel() string {
	ch := "herald." + t.Schema + "." + t.Table
	if len(ch) > 63 {
		h := fnv.New64a()
		h.Write([]byte(t.Schema + "." + t.Table))
		ch = fmt.Sprintf("herald.%016x", h.Sum64())
	}
	return ch
}

// ChannelIdent is Channel quoted as an identifier, for LISTEN and UNLISTEN.
func (t Tables) ChannelIdent() string { return pgx.Identifier{t.Channel()}.Sanitize() }
