package shop

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed schema.sql
var schemaSQL string

var schemaTemplate = template.Must(template.New("schema.sql").Option("missingkey=error").Parse(schemaSQL))

// Migrate creates the schema and the orders table in it, if they do not
// exist yet. It is safe to run at every start, from several processes at
// once (an advisory lock serialises them).
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	var b bytes.Buffer
	err := schemaTemplate.Execute(&b, struct{ Schema, Orders string }{
		Schema: pgx.Identifier{schema}.Sanitize(),
		Orders: pgx.Identifier{schema, "orders"}.Sanitize(),
	})
	if err != nil {
		return fmt.Errorf("rendering the orders schema: %w", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrating the orders table in schema %s: %w", schema, err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "herald.orders."+schema); err != nil {
		return fmt.Errorf("migrating the orders table in schema %s: taking the lock: %w", schema, err)
	}
	if _, err := tx.Exec(ctx, b.String()); err != nil {
		return fmt.Errorf("migrating the orders table in schema %s: %w", schema, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrating the orders table in schema %s: %w", schema, err)
	}
	return nil
}
