package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

// TestRunRejectsHostileConfig: every bad value stops `relay run` with exit 2
// and an error naming the field, before anything connects, and without
// printing a secret.
func TestRunRejectsHostileConfig(t *testing.T) {
	t.Parallel()
	const password = "Hostile-Cfg-Pw-31"
	base := func(sinks, routes, db string) string {
		return fmt.Sprintf(`
database:
  url: "postgres://postgres:%s@127.0.0.1:1/test"
%s
sinks:
%s
routes:
%s
`, password, db, sinks, routes)
	}
	hook := "  - {name: hook, type: webhook, url: \"http://127.0.0.1:1/h\"}"
	route := "  - {topics: [\"*\"], sinks: [hook]}"
	cases := map[string]struct{ text, want string }{
		"unknown sink type":    {base("  - {name: hook, type: carrier-pigeon}", route, ""), `sinks[0].type: unknown sink type "carrier-pigeon"`},
		"unknown route sink":   {base(hook, "  - {topics: [\"*\"], sinks: [nowhere]}", ""), `routes[0].sinks[0]: unknown sink "nowhere"`},
		"webhook url scheme":   {base("  - {name: hook, type: webhook, url: \"ftp://example.com/x\"}", route, ""), `url: "ftp://example.com/x" is not an http(s) URL`},
		"webhook url garbage":  {base("  - {name: hook, type: webhook, url: \"http://[::1\"}", route, ""), "url: not a valid URL"},
		"nats url":             {base("  - {name: bus, type: nats, url: \"http://127.0.0.1:4222\"}", "  - {topics: [\"*\"], sinks: [bus]}", ""), "url:"},
		"sink duration":        {base("  - {name: hook, type: webhook, url: \"http://127.0.0.1:1/h\", timeout: soon}", route, ""), `timeout: invalid duration "soon"`},
		"relay duration":       {base(hook, route, "relay: {lease: 3 fortnights}"), `relay.lease: invalid duration`},
		"missing secret":       {base("  - {name: hook, type: webhook, url: \"http://127.0.0.1:1/h\", secret: \"${HERALD_NO_SUCH_SECRET}\"}", route, ""), "environment variable HERALD_NO_SUCH_SECRET is not set"},
		"table with quote":     {base(hook, route, "database_table_placeholder"), "database.table"},
		"table with semicolon": {base(hook, route, "database_table_placeholder"), "database.table"},
		"schema with quote":    {base(hook, route, "database_table_placeholder"), "database.schema"},
	}
	tableEdits := map[string]string{
		"table with quote":     `  table: 'outbox"; DROP TABLE users; --'`,
		"table with semicolon": `  table: "outbox;vacuum"`,
		"schema with quote":    `  schema: "pub\"lic"`,
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			text := c.text
			if edit, ok := tableEdits[name]; ok {
				text = strings.Replace(text, "database_table_placeholder", "", 1)
				text = strings.Replace(text, "/test\"\n", "/test\"\n"+edit+"\n", 1)
			}
			r := runRelay(t, nil, "run", "--config", writeConfig(t, text))
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Fatalf("want exit 2 and %q on stderr:\n%s", c.want, r)
			}
			if strings.Contains(r.stdout+r.stderr, password) {
				t.Fatalf("the password was printed:\n%s", r)
			}
		})
	}
}

// TestWeirdSchemaName: a legal but awkward schema name (a space, capitals)
// migrates and relays, because every identifier is quoted.
func TestWeirdSchemaName(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	s := "My Schema " + pgtest.UniqueName("X")
	t.Cleanup(func() { pgtest.DropSchema(t, pool, s) })
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %q, table: "Out Box"}
relay: {poll_interval: 100ms, shutdown_timeout: 5s}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`, url, s))
	if r := runRelay(t, nil, "migrate", "up", "--config", cfg); r.code != 0 {
		t.Fatalf("migrate up into %q:\n%s", s, r)
	}
	tables := migrations.Tables{Schema: s, Table: "Out Box"}
	var id string
	if err := pool.QueryRow(context.Background(), "INSERT INTO "+tables.Outbox()+" (topic, key, payload) VALUES ('weird.names', 'k', '{}') RETURNING id::text").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tables.Outbox(), `"My Schema`) {
		t.Fatalf("test setup: %s is not quoted as expected", tables.Outbox())
	}
	var exists bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{s, "Out Box"}.Sanitize()).Scan(&exists); err != nil || !exists {
		t.Fatalf("table %q.%q not created (%v)", s, "Out Box", err)
	}
	p := start(t, nil, "run", "--config", cfg)
	p.waitLine(t, p.stdout, id, 20*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestRunWarnsAboutReadableInlineSecrets: a configuration file that group
// and others may read (mode 0644) and that holds a database password and an
// admin token written inline makes `relay run` log a warning, through its
// own logger, naming the file, its mode and the keys, never the values.
func TestRunWarnsAboutReadableInlineSecrets(t *testing.T) {
	t.Parallel()
	const password, token = "Readable-Pa55-77", "Readable-T0ken-77"
	path := writeConfig(t, `
database: {url: "postgres://postgres:`+password+`@127.0.0.1:1/test?connect_timeout=2"}
log: {format: json}
admin: {listen: "127.0.0.1:0", token: `+token+`}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "run", "--config", path)
	line := p.waitLine(t, p.stderr, "secrets written inline", 10*time.Second)
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("warning is not a JSON log line: %s", line)
	}
	if rec["level"] != "WARN" || rec["file"] != path || rec["mode"] != "0644" ||
		fmt.Sprint(rec["keys"]) != "[database.url admin.token]" {
		t.Fatalf("warning lacks level, file, mode or keys: %s", line)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, p.output())
	}
	if out := p.output(); strings.Contains(out, password) || strings.Contains(out, token) {
		t.Fatalf("a secret was printed:\n%s", out)
	}
}
