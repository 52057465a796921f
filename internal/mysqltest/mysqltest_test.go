package mysqltest

import (
	"context"
	"testing"
)

// TestDatabaseIsDropped: each test's database exists during the test and
// is gone after it.
func TestDatabaseIsDropped(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		db, _ := Database(t)
		if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	adm, err := admin(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	var n int
	if err := adm.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if name == "" || n != 0 {
		t.Fatalf("database %q: %d left after its test ended", name, n)
	}
}
