package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Dialect says which database holds the outbox table.
type Dialect int

const (
	// PostgreSQL is the zero Dialect: Enqueue takes a pgx.Tx, EnqueueSQL a
	// *sql.Tx of the pgx stdlib driver.
	PostgreSQL Dialect = iota
	// MySQL is MySQL 8.0.16+ or MariaDB 10.6+, with the tables of package
	// migrations/mysql: EnqueueSQL takes a *sql.Tx of
	// github.com/go-sql-driver/mysql. There is no notification: relays on
	// MySQL find events by polling.
	MySQL
)

// String returns "postgresql" or "mysql".
func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "postgresql"
	case MySQL:
		return "mysql"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// mysqlColumns are the columns one event fills, and mysqlRow their values'
// placeholders: available_at is the given time (UTC text, so that the
// DSN's loc changes nothing) or the time of the INSERT plus the delay, as
// the table's default is.
const (
	mysqlColumns = " (id, topic, `key`, payload, payload_bin, content_type, headers, available_at, max_attempts) VALUES "
	mysqlRow     = "(?, ?, ?, ?, ?, ?, ?, COALESCE(CAST(? AS DATETIME(6)), utc_timestamp(6) + INTERVAL ? MICROSECOND), ?)"
	mysqlRowArgs = 10
)

// mysqlMaxRows is the most events one INSERT carries: a prepared statement
// has at most 65,535 placeholders.
const mysqlMaxRows = 65535 / mysqlRowArgs

// mysqlTime is how available_at is sent: DATETIME(6) text in UTC.
const mysqlTime = "2006-01-02 15:04:05.999999"

// enqueueMySQL writes events in tx with one multi-row INSERT per
// mysqlMaxRows events, rows in the slice's order, so that seq follows it.
func (w *Writer) enqueueMySQL(ctx context.Context, tx *sql.Tx, traceCtx map[string]string, events []Event) ([]uuid.UUID, error) {
	if len(events) == 0 {
		return nil, nil
	}
	for i := range events {
		if err := events[i].validate(i); err != nil {
			return nil, err
		}
		if at := events[i].AvailableAt; !at.IsZero() && (at.UTC().Year() < 1 || at.UTC().Year() > 9999) {
			return nil, &ValidationError{Index: i, Field: "available_at",
				Reason: fmt.Sprintf("year %d is outside 1 to 9999, the years of MySQL's DATETIME", at.UTC().Year())}
		}
	}
	cols, err := encode(events, traceCtx)
	if err != nil {
		return nil, err
	}
	for start := 0; start < len(events); start += mysqlMaxRows {
		end := min(start+mysqlMaxRows, len(events))
		query, args := cols.mysqlInsert(w.mysqlInsert, start, end)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			if start == 0 && end == len(events) {
				return nil, fmt.Errorf("outbox: inserting %d events into %s: %w", len(events), w.outboxName, err)
			}
			return nil, fmt.Errorf("outbox: inserting events[%d:%d] into %s (roll the transaction back: the events before are in it): %w",
				start, end, w.outboxName, err)
		}
	}
	return cols.ids, nil
}

// mysqlInsert returns the INSERT of rows start to end (exclusive) and its
// arguments. Empty key, JSON payload and content type are NULL, as on
// PostgreSQL; max_attempts 0 is NULL.
func (c *columns) mysqlInsert(prefix string, start, end int) (string, []any) {
	n := end - start
	var b strings.Builder
	b.Grow(len(prefix) + n*(len(mysqlRow)+2))
	b.WriteString(prefix)
	args := make([]any, 0, n*mysqlRowArgs)
	for i := start; i < end; i++ {
		if i > start {
			b.WriteString(", ")
		}
		b.WriteString(mysqlRow)
		var availableAt any
		if at := c.availableAt[i]; at.Valid {
			availableAt = at.Time.UTC().Format(mysqlTime)
		}
		var payloadBin any
		if c.payloadBins[i] != nil {
			payloadBin = c.payloadBins[i]
		}
		args = append(args,
			c.ids[i].String(), c.topics[i], emptyNull(c.keys[i]), emptyNull(string(c.payloads[i])), payloadBin,
			emptyNull(c.contentTypes[i]), string(c.headers[i]), availableAt, c.delaysMicro[i], zeroNull(c.maxAttempts[i]))
	}
	return b.String(), args
}

// emptyNull is s, or NULL when it is empty.
func emptyNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// zeroNull is n, or NULL when it is 0.
func zeroNull(n int32) any {
	if n == 0 {
		return nil
	}
	return n
}
