package pgtest

import (
	"context"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestCreatesAMissingDatabase: a server without the tests' database gets it
// created, by any number of test binaries at once.
func TestCreatesAMissingDatabase(t *testing.T) {
	ctx := context.Background()
	base := URL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	name := UniqueName("herald_pgtest")
	u.Path = "/" + name
	missing := u.String()
	if _, err := pgx.Connect(ctx, missing); !missingDatabase(err) {
		t.Fatalf("connecting to a database that does not exist: got %v, want a missing database error", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("dropping database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = createDatabase(ctx, missing) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("creating database %s (%d of %d at once): %v", name, i+1, len(errs), err)
		}
	}
	conn, err := pgx.Connect(ctx, missing)
	if err != nil {
		t.Fatalf("connecting to the created database: %v", err)
	}
	conn.Close(ctx)
}
