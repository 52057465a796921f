package shop

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/outbox"
)

// New returns a Service on PostgreSQL. The orders table must exist
// (Migrate), and cfg.Outbox must be a PostgreSQL Writer.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	s, err := newService(nil, cfg)
	if err != nil {
		return nil, err
	}
	s.db = &pgStore{pool: pool, outbox: cfg.Outbox, orders: pgx.Identifier{s.cfg.Schema, "orders"}.Sanitize()}
	return s, nil
}

// pgOrderColumns are the columns scanOrder reads, in order.
const pgOrderColumns = `id::text, customer_name, customer_email, items, total_cents, currency, status, created_at, paid_at`

// pgStore is the store on PostgreSQL, through pgx.
type pgStore struct {
	pool   *pgxpool.Pool
	outbox *outbox.Writer
	orders string // quoted, schema-qualified table
}

func (p *pgStore) inTx(ctx context.Context, fn func(storeTx) error) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning: %w", err)
	}
	defer tx.Rollback(ctx)
	if err := fn(pgTx{p, tx}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

func (p *pgStore) get(ctx context.Context, id uuid.UUID) (*Order, error) {
	o, err := scanOrder(p.pool.QueryRow(ctx, `SELECT `+pgOrderColumns+` FROM `+p.orders+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return o, err
}

func (p *pgStore) ping(ctx context.Context) error { return p.pool.Ping(ctx) }

type pgTx struct {
	*pgStore
	tx pgx.Tx
}

func (t pgTx) insert(ctx context.Context, o newRow) (*Order, error) {
	return scanOrder(t.tx.QueryRow(ctx, `INSERT INTO `+t.orders+`
    (id, customer_name, customer_email, items, total_cents, currency)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING `+pgOrderColumns, o.id, o.customer.Name, o.customer.Email, o.items, o.totalCents, o.currency))
}

func (t pgTx) lockStatus(ctx context.Context, id uuid.UUID) (string, error) {
	var status string
	err := t.tx.QueryRow(ctx, `SELECT status FROM `+t.orders+` WHERE id = $1 FOR UPDATE`, id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("locking it: %w", err)
	}
	return status, nil
}

func (t pgTx) markPaid(ctx context.Context, id uuid.UUID) (*Order, error) {
	return scanOrder(t.tx.QueryRow(ctx, `UPDATE `+t.orders+` SET status = 'paid', paid_at = now()
WHERE id = $1 RETURNING `+pgOrderColumns, id))
}

func (t pgTx) enqueue(ctx context.Context, events []outbox.Event) ([]uuid.UUID, error) {
	return t.outbox.Enqueue(ctx, t.tx, events...)
}
