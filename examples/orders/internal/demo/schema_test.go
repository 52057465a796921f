package demo

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
)

// TestFreshSchemaNames: each run without a schema gets a name of its own,
// which the demo may drop (it starts with DefaultSchema).
func TestFreshSchemaNames(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	valid := regexp.MustCompile(`^` + DefaultSchema + `_[0-9a-f]{8}$`)
	for range 100 {
		name := Options{}.withDefaults().Schema
		if !valid.MatchString(name) || seen[name] {
			t.Fatalf("fresh schema %q: not of the form %s, or given twice", name, valid)
		}
		seen[name] = true
	}
}

// TestFreshSchemaNeverReplaces: a run whose fresh name is already taken
// stops, saying so, and leaves that schema as it was; only a schema named
// with -schema is replaced.
func TestFreshSchemaNeverReplaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	taken := pgtest.UniqueName(DefaultSchema)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, taken) })
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+taken+`"; CREATE TABLE "`+taken+`".theirs (n int)`); err != nil {
		t.Fatal(err)
	}
	opts := Options{DatabaseURL: pgtest.URL(t), Schema: taken, Timeout: time.Minute}.withDefaults()
	d := &run{opts: opts, freshSchema: true, out: io.Discard, started: time.Now()}
	err := d.setup(ctx)
	d.cleanup()
	if err == nil || !strings.Contains(err.Error(), "schema "+taken+" exists already") {
		t.Fatalf("setup in a taken fresh schema: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", taken).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the taken schema holds %d tables (%v), want its own one, untouched", n, err)
	}
}
