package mysqlstore

import (
	"regexp"
	"strings"
	"testing"

	"github.com/heraldhq/herald/relay/internal/store"
	"github.com/heraldhq/herald/relay/internal/storetest"
)

// TestConformance runs the stores' conformance suite on MySQL/MariaDB.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{Open: func(t *testing.T) storetest.DB { return conformanceDB{setup(t)} }})
}

// conformanceDB is a test's database as the suite reaches it.
type conformanceDB struct{ b *bundle }

func (c conformanceDB) Store(t *testing.T) store.Store {
	return New(c.b.relayDB(t), c.b.tables, Config{})
}

func (c conformanceDB) Operator(t *testing.T) store.Operator {
	return NewOperator(c.b.relayDB(t), c.b.tables)
}

func (c conformanceDB) Insert(t *testing.T, evs ...storetest.Event) []int64 {
	t.Helper()
	own := make([]ev, len(evs))
	for i, e := range evs {
		own[i] = ev{e.Topic, e.Key}
	}
	return c.b.insert(t, own...)
}

// keyWord is the column name key, which MySQL reserves: quoted in the
// suite's conditions.
var keyWord = regexp.MustCompile(`\bkey\b`)

func (c conformanceDB) Count(t *testing.T, table, where string) int {
	t.Helper()
	name := c.b.tables.Outbox()
	if table == "deliveries" {
		name = c.b.tables.Deliveries()
	}
	where = strings.ReplaceAll(where, storetest.DeliveriesMarker, c.b.tables.Deliveries())
	where = keyWord.ReplaceAllString(where, "`key`")
	var n int
	if err := c.b.db.QueryRow("SELECT count(*) FROM " + name + " d WHERE " + where).Scan(&n); err != nil {
		t.Fatalf("counting %s where %s: %v", table, where, err)
	}
	return n
}

func (c conformanceDB) Now() string { return now }

func (c conformanceDB) ExpireLeases(t *testing.T) {
	t.Helper()
	if _, err := c.b.db.Exec("UPDATE " + c.b.tables.Lanes() + " SET lease_until = utc_timestamp(6) - INTERVAL 1 SECOND WHERE owner IS NOT NULL"); err != nil {
		t.Fatal(err)
	}
}
