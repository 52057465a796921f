package main

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
	"github.com/heraldhq/herald/migrations/mysqltest"
)

// TestMigrateMySQL: relay migrate up, status and down against a mysql://
// URL, from --database-url, DATABASE_URL and database.url alike.
func TestMigrateMySQL(t *testing.T) {
	t.Parallel()
	db, dbURL := mysqltest.Database(t)
	latest := mysqlmigrations.Latest()
	check := func(r result, code int, want ...string) {
		t.Helper()
		if r.code != code {
			t.Fatalf("want exit %d:\n%s", code, r)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout, w) {
				t.Fatalf("stdout lacks %q:\n%s", w, r)
			}
		}
	}
	status := regexp.MustCompile(fmt.Sprintf(`(?m)^%03d\s+\w+\s+(pending|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$`, latest))
	r := runRelay(t, nil, "migrate", "status", "--database-url", dbURL)
	check(r, 0, "VERSION")
	if m := status.FindStringSubmatch(r.stdout); m == nil || m[1] != "pending" {
		t.Fatalf("status before up: want %03d pending:\n%s", latest, r)
	}
	check(runRelay(t, []string{"DATABASE_URL=" + dbURL}, "migrate", "up"), 0, "applied 001_outbox")
	cfg := runConfig(t, dbURL, "public", "")
	check(runRelay(t, nil, "migrate", "up", "--config", cfg), 0, "nothing to apply: `outbox` is up to date")
	r = runRelay(t, nil, "migrate", "status", "--database-url", dbURL)
	if m := status.FindStringSubmatch(r.stdout); m == nil || m[1] == "pending" {
		t.Fatalf("status after up: want %03d applied:\n%s", latest, r)
	}
	if _, err := db.Exec("INSERT INTO outbox (topic, `key`, payload) VALUES ('orders.created', 'order-42', '{}')"); err != nil {
		t.Fatalf("the migrated table refuses the plain insert: %v", err)
	}
	check(runRelay(t, nil, "migrate", "up", "--target", "99", "--database-url", dbURL), 2)
	check(runRelay(t, nil, "migrate", "down", "--steps", fmt.Sprint(latest), "--database-url", dbURL), 0, "reverted 001_outbox")
	var tables int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'outbox'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("outbox still exists after migrate down (%d, %v)", tables, err)
	}
}

// TestMySQLPasswordNeverPrinted: a refused login says so without the
// password, from the flag and from a config file.
func TestMySQLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	_, dbURL := mysqltest.Database(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	const password = "Wrong-Pa55word-18"
	u.User = url.UserPassword(u.User.Username(), password)
	for _, args := range [][]string{
		{"migrate", "up", "--database-url", u.String()},
		{"migrate", "status", "--config", runConfig(t, u.String(), "public", "")},
	} {
		r := runRelay(t, nil, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "Access denied") {
			t.Fatalf("relay %s: want exit 1 saying access was denied:\n%s", args[:2], r)
		}
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("relay %s printed the password:\n%s", args[:2], r)
		}
	}
}

// TestMySQLEngineNotBuiltYet: the commands of the relay engine refuse a
// mysql:// database saying why, rather than failing on it later.
func TestMySQLEngineNotBuiltYet(t *testing.T) {
	t.Parallel()
	dbURL := "mysql://root@127.0.0.1:3306/test"
	for _, args := range [][]string{
		{"run", "--config", runConfig(t, dbURL, "public", "")},
		{"config", "check", "--config", runConfig(t, dbURL, "public", "")},
		{"status", "--database-url", dbURL},
		{"dlq", "list", "--database-url", dbURL},
	} {
		r := runRelay(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "the MySQL relay engine") || !strings.Contains(r.stderr, "is not built yet") {
			t.Errorf("relay %s: want exit 2 saying the MySQL relay engine is not built yet:\n%s", args[0], r)
		}
	}
}

// TestREADMEMySQL: the README's MySQL section. `relay migrate up` on the
// DATABASE_URL it exports, then its INSERT example, which the table takes
// with defaults for every other column.
func TestREADMEMySQL(t *testing.T) {
	t.Parallel()
	text := readme(t)
	at := strings.Index(text, "## MySQL / MariaDB")
	if at < 0 {
		t.Fatal(`README: no "## MySQL / MariaDB" section`)
	}
	section := text[at:]
	section = section[:strings.Index(section[3:], "\n## ")+3]
	var shell, insert []string
	for _, m := range fencedBlock.FindAllStringSubmatch(section, -1) {
		switch m[1] {
		case "sh":
			shell = append(shell, m[2])
		case "sql":
			insert = append(insert, m[2])
		}
	}
	if len(shell) != 1 || !strings.Contains(shell[0], "export DATABASE_URL='mysql://") || !strings.Contains(shell[0], "\nrelay migrate up") {
		t.Fatalf("README's MySQL section: want one sh block exporting a mysql:// DATABASE_URL and running relay migrate up, got %q", shell)
	}
	if len(insert) != 1 {
		t.Fatalf("README's MySQL section: want one SQL example, got %d", len(insert))
	}
	db, dbURL := mysqltest.Database(t)
	if r := runRelay(t, []string{"DATABASE_URL=" + dbURL}, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "applied 001_outbox") {
		t.Fatalf("relay migrate up:\n%s", r)
	}
	if _, err := db.Exec(insert[0]); err != nil {
		t.Fatalf("README's MySQL INSERT example: %v", err)
	}
	var topic, key, payload, status string
	if err := db.QueryRow("SELECT topic, `key`, payload, status FROM outbox").Scan(&topic, &key, &payload, &status); err != nil {
		t.Fatal(err)
	}
	if topic != "orders.paid" || key != "order-42" || !strings.Contains(payload, `"order_id": 42`) || status != "pending" {
		t.Fatalf("stored %q %q %q %q", topic, key, payload, status)
	}
}
