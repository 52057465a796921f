package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/relay/internal/storetest"
)

// TestConformance runs the stores' conformance suite on PostgreSQL.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{Open: func(t *testing.T) storetest.DB { return conformanceDB{setup(t)} }})
}

// conformanceDB is a test's schema as the suite reaches it.
type conformanceDB struct{ b *bundle }

func (c conformanceDB) Store(t *testing.T) store.Store { return New(c.b.pool, c.b.tables) }

func (c conformanceDB) Operator(t *testing.T) store.Operator {
	return NewOperator(c.b.pool, c.b.tables)
}

func (c conformanceDB) Insert(t *testing.T, evs ...storetest.Event) []int64 {
	t.Helper()
	topics := make([]string, len(evs))
	keys := make([]pgtype.Text, len(evs))
	for i, e := range evs {
		topics[i] = e.Topic
		keys[i] = pgtype.Text{String: e.Key, Valid: e.Key != ""}
	}
	rows, err := c.b.pool.Query(context.Background(), `INSERT INTO `+c.b.tables.Outbox()+` (topic, key, payload)
SELECT u.topic, u.key, json_build_object('n', u.n) FROM unnest($1::text[], $2::text[])
  WITH ORDINALITY AS u(topic, key, n) ORDER BY u.n RETURNING seq`, topics, keys)
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("inserting events: %v", err)
	}
	return seqs
}

func (c conformanceDB) Count(t *testing.T, table, where string) int {
	t.Helper()
	name := c.b.tables.Outbox()
	if table == "deliveries" {
		name = c.b.tables.Deliveries()
	}
	where = strings.ReplaceAll(where, storetest.DeliveriesMarker, c.b.tables.Deliveries())
	var n int
	if err := c.b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+name+" d WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("counting %s where %s: %v", table, where, err)
	}
	return n
}

func (c conformanceDB) Now() string { return "now()" }

func (c conformanceDB) ExpireLeases(t *testing.T) { t.Helper(); c.b.expireLeases(t) }
