package shop

import (
	"bytes"
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/outbox"
)

//go:embed schema_mysql.sql
var schemaMySQL string

var schemaMySQLTemplate = template.Must(template.New("schema_mysql.sql").Option("missingkey=error").Parse(schemaMySQL))

// NewMySQL returns a Service on MySQL 8 or MariaDB 10.6+. Open db with
// github.com/go-sql-driver/mysql and parseTime=true (times are read as
// UTC); the orders table must exist (MigrateMySQL), and cfg.Outbox must be
// a MySQL Writer (outbox.Config{Dialect: outbox.MySQL}).
func NewMySQL(db *sql.DB, cfg Config) (*Service, error) {
	s, err := newService(nil, cfg)
	if err != nil {
		return nil, err
	}
	orders, err := mysqlOrders(s.cfg.Schema)
	if err != nil {
		return nil, err
	}
	s.db = &mysqlStore{db: db, outbox: cfg.Outbox, orders: orders}
	return s, nil
}

// MigrateMySQL creates the orders table in the database schema names (and
// the database, if it does not exist yet); "public" or "" mean the
// database the connection opened. It is safe to run at every start, from
// several processes at once: every statement is IF NOT EXISTS.
func MigrateMySQL(ctx context.Context, db *sql.DB, schema string) error {
	orders, err := mysqlOrders(schema)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := schemaMySQLTemplate.Execute(&b, struct{ Orders string }{orders}); err != nil {
		return fmt.Errorf("rendering the orders schema: %w", err)
	}
	if schema != "" && schema != DefaultSchema {
		if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+mysqlQuote(schema)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
			return fmt.Errorf("migrating the orders table: creating database %s: %w", schema, err)
		}
	}
	if _, err := db.ExecContext(ctx, b.String()); err != nil {
		return fmt.Errorf("migrating the orders table %s: %w", orders, err)
	}
	return nil
}

// mysqlOrders is the quoted orders table of schema.
func mysqlOrders(schema string) (string, error) {
	switch {
	case schema == "" || schema == DefaultSchema:
		return mysqlQuote("orders"), nil
	case strings.ContainsRune(schema, '`'):
		return "", fmt.Errorf("shop: Config.Schema: %q must not contain a backtick", schema)
	}
	return mysqlQuote(schema) + "." + mysqlQuote("orders"), nil
}

func mysqlQuote(name string) string { return "`" + name + "`" }

// mysqlOrderColumns are the columns scanOrder reads, in order.
const mysqlOrderColumns = `id, customer_name, customer_email, items, total_cents, currency, status, created_at, paid_at`

// mysqlStore is the store on MySQL and MariaDB, through database/sql.
// MariaDB has no UPDATE ... RETURNING: writes read the row back in their
// transaction.
type mysqlStore struct {
	db     *sql.DB
	outbox *outbox.Writer
	orders string // quoted, database-qualified table
}

func (m *mysqlStore) inTx(ctx context.Context, fn func(storeTx) error) error {
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning: %w", err)
	}
	defer tx.Rollback()
	if err := fn(mysqlTx{m, tx}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

func (m *mysqlStore) get(ctx context.Context, id uuid.UUID) (*Order, error) {
	return m.read(ctx, m.db.QueryRowContext, id)
}

// read reads one order through queryRow (the pool's or a transaction's).
func (m *mysqlStore) read(ctx context.Context, queryRow func(context.Context, string, ...any) *sql.Row, id uuid.UUID) (*Order, error) {
	o, err := scanOrder(queryRow(ctx, `SELECT `+mysqlOrderColumns+` FROM `+m.orders+` WHERE id = ?`, id.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return o, err
}

func (m *mysqlStore) ping(ctx context.Context) error { return m.db.PingContext(ctx) }

type mysqlTx struct {
	*mysqlStore
	tx *sql.Tx
}

func (t mysqlTx) insert(ctx context.Context, o newRow) (*Order, error) {
	_, err := t.tx.ExecContext(ctx, `INSERT INTO `+t.orders+`
    (id, customer_name, customer_email, items, total_cents, currency, created_at)
VALUES (?, ?, ?, ?, ?, ?, utc_timestamp(6))`, o.id.String(), o.customer.Name, o.customer.Email, o.items, o.totalCents, o.currency)
	if err != nil {
		return nil, err
	}
	return t.read(ctx, t.tx.QueryRowContext, o.id)
}

func (t mysqlTx) lockStatus(ctx context.Context, id uuid.UUID) (string, error) {
	var status string
	err := t.tx.QueryRowContext(ctx, `SELECT status FROM `+t.orders+` WHERE id = ? FOR UPDATE`, id.String()).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("locking it: %w", err)
	}
	return status, nil
}

func (t mysqlTx) markPaid(ctx context.Context, id uuid.UUID) (*Order, error) {
	if _, err := t.tx.ExecContext(ctx, `UPDATE `+t.orders+` SET status = 'paid', paid_at = utc_timestamp(6) WHERE id = ?`, id.String()); err != nil {
		return nil, err
	}
	return t.read(ctx, t.tx.QueryRowContext, id)
}

func (t mysqlTx) enqueue(ctx context.Context, events []outbox.Event) ([]uuid.UUID, error) {
	return t.outbox.EnqueueSQL(ctx, t.tx, events...)
}
