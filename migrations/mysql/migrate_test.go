package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/heraldhq/herald/internal/mysqltest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/mysql"
)

// tableCount counts the tables of the test database named like the outbox.
func tableCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name IN ('outbox', 'outbox_deliveries', 'outbox_lanes', 'outbox_relays', 'outbox_stats')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestUpDownStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := mysqltest.Database(t)
	m, err := mysql.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mysql.Check(ctx, db, migrations.Tables{}); !errors.Is(err, migrations.ErrNotMigrated) {
		t.Fatalf("Check before migrating: got %v, want ErrNotMigrated", err)
	}
	applied, err := m.Up(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != mysql.Latest() || mysql.Latest() < 1 {
		t.Fatalf("applied %d migrations, want %d", len(applied), mysql.Latest())
	}
	if n := tableCount(t, db); n != 5 {
		t.Fatalf("%d of the 5 tables exist after up", n)
	}
	if err := mysql.Check(ctx, db, migrations.Tables{}); err != nil {
		t.Fatalf("Check after migrating: %v", err)
	}
	again, err := m.Up(ctx, 0)
	if err != nil || len(again) != 0 {
		t.Fatalf("second up applied %d (err %v), want none", len(again), err)
	}
	status, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range status {
		if s.AppliedAt.IsZero() {
			t.Errorf("status: %03d_%s shows as pending after up", s.Version, s.Name)
		}
	}
	var lanes int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox_lanes").Scan(&lanes); err != nil || lanes != 64 {
		t.Fatalf("outbox_lanes holds %d rows (err %v), want 64", lanes, err)
	}

	reverted, err := m.Down(ctx, mysql.Latest())
	if err != nil || len(reverted) != mysql.Latest() {
		t.Fatalf("down reverted %d (err %v), want %d", len(reverted), err, mysql.Latest())
	}
	if n := tableCount(t, db); n != 0 {
		t.Fatalf("%d tables remain after down", n)
	}
	status, err = m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range status {
		if !s.AppliedAt.IsZero() {
			t.Errorf("status: %03d_%s shows as applied after down", s.Version, s.Name)
		}
	}
	if _, err := m.Up(ctx, 0); err != nil {
		t.Fatalf("up after down: %v", err)
	}
}

// TestConcurrentMigrators: migrators started together apply each migration
// once; the lock makes the others find it done.
func TestConcurrentMigrators(t *testing.T) {
	t.Parallel()
	db, _ := mysqltest.Database(t)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			m, err := mysql.NewMigrator(db, migrations.Tables{}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			applied, err := m.Up(context.Background(), 0)
			if err != nil {
				t.Errorf("migrator %d: %v", i, err)
			}
			mu.Lock()
			total += len(applied)
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != mysql.Latest() {
		t.Fatalf("4 migrators applied %d migrations in all, want %d", total, mysql.Latest())
	}
}

// TestHalfAppliedMigrationCompletes: MySQL commits each DDL statement by
// itself, so a migration can stop half way; running up again completes it.
func TestHalfAppliedMigrationCompletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := mysqltest.Database(t)
	tables, err := mysql.NewTables(migrations.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	all, err := mysql.All(tables)
	if err != nil {
		t.Fatal(err)
	}
	stmts := mysql.Statements(all[0].Up)
	if len(stmts) < 4 {
		t.Fatalf("migration 001 splits into %d statements; the split is wrong", len(stmts))
	}
	for _, s := range stmts[:3] {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("running the first statements by hand: %v", err)
		}
	}
	m, err := mysql.NewMigrator(db, migrations.Tables{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, 0); err != nil {
		t.Fatalf("up over a half-applied migration: %v", err)
	}
	if n := tableCount(t, db); n != 5 {
		t.Fatalf("%d of the 5 tables exist", n)
	}
	var lanes int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox_lanes").Scan(&lanes); err != nil || lanes != 64 {
		t.Fatalf("outbox_lanes holds %d rows (err %v), want 64", lanes, err)
	}
}

// TestOtherTableNames: a second outbox in the same database, under its own
// name, and one in another database named by Schema.
func TestOtherTableNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := mysqltest.Database(t)
	other, _ := mysqltest.Database(t)
	var otherName string
	if err := other.QueryRow("SELECT DATABASE()").Scan(&otherName); err != nil {
		t.Fatal(err)
	}
	for _, names := range []migrations.Tables{{Table: "events"}, {Schema: otherName, Table: "outbox"}} {
		m, err := mysql.NewMigrator(db, names, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Up(ctx, 0); err != nil {
			t.Fatalf("%+v: %v", names, err)
		}
		if err := mysql.Check(ctx, db, names); err != nil {
			t.Fatalf("%+v: %v", names, err)
		}
	}
	if _, err := db.Exec("INSERT INTO events (topic) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec("INSERT INTO outbox (topic) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	if err := mysql.Check(ctx, db, migrations.Tables{}); !errors.Is(err, migrations.ErrNotMigrated) {
		t.Fatalf("the default outbox of the first database was never migrated, Check says %v", err)
	}
}

func TestNewTablesRefusesBackticks(t *testing.T) {
	for _, names := range []migrations.Tables{{Table: "out`box"}, {Schema: "db`x"}, {Table: "outbox "}} {
		if _, err := mysql.NewTables(names); err == nil {
			t.Errorf("NewTables(%+v) accepted the name", names)
		}
	}
	tables, err := mysql.NewTables(migrations.Tables{Schema: "shop", Table: "events"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tables.Deliveries(), "`shop`.`events_deliveries`"; got != want {
		t.Errorf("Deliveries() = %s, want %s", got, want)
	}
	tables, _ = mysql.NewTables(migrations.Tables{})
	if got, want := tables.Outbox(), "`outbox`"; got != want {
		t.Errorf("Outbox() = %s, want %s (the connection's database)", got, want)
	}
}

func TestStatements(t *testing.T) {
	got := mysql.Statements("-- a comment;\nCREATE TABLE a (\n  x INT -- why\n);\n\n-- only a comment\nDROP TABLE b;\n-- trailing comment\n")
	want := []string{"-- a comment;\nCREATE TABLE a (\n  x INT -- why\n);", "-- only a comment\nDROP TABLE b;"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Statements = %q, want %q", got, want)
	}
}
