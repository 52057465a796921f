package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	r := runRelay(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "relay "+testVersion+" (go") {
		t.Fatalf("relay version:\n%s", r)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"run", "--frob"}, "unknown flag: --frob"},
		{[]string{"run"}, "--config: required"},
		{[]string{"run", "extra-arg", "--config", "x.yaml"}, `unknown command "extra-arg"`},
		{[]string{"run", "--config", "/nonexistent/relay.yaml"}, "/nonexistent/relay.yaml"},
		{[]string{"migrate", "up", "--target", "99", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--target: 99 is not between 1 and"},
		{[]string{"migrate", "up", "--target", "x"}, `invalid argument "x" for "--target"`},
		{[]string{"migrate", "down", "--steps", "0", "--database-url", "postgres://u@127.0.0.1:1/db"}, "--steps: must be at least 1"},
		{[]string{"migrate", "status"}, "--database-url: no database given"},
		{[]string{"migrate", "status", "--database-url", "postgres://u@127.0.0.1:1/db", "--schema", "a;b"}, "database.schema"},
		{[]string{"migrate", "status", "--database-url", "postgres://u@127.0.0.1:1/db", "--table", `x"y`}, "database.table"},
		{[]string{"migrate", "status", "--database-url", "postgres://u:Secret-Pw-1@127.0.0.1:1/db?sslmode=bogus"}, "--database-url:"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			r := runRelay(t, nil, c.args...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Fatalf("want exit 2 and %q on stderr, got\n%s", c.want, r)
			}
			if strings.Contains(r.stderr, "Secret-Pw-1") {
				t.Fatalf("the password was printed:\n%s", r)
			}
		})
	}
}

func TestMigrateLifecycle(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	s := schema(t)
	args := func(a ...string) []string { return append(a, "--database-url", url, "--schema", s) }
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
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Fatalf("the password was printed:\n%s", r)
		}
	}
	all, err := migrations.All(migrations.Tables{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	latest := all[len(all)-1]
	label := func(m migrations.Migration) string { return fmt.Sprintf("%03d_%s", m.Version, m.Name) }
	row := func(m migrations.Migration, at string) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^%03d\s+%s\s+%s`, m.Version, m.Name, at))
	}
	const appliedAt, pendingAt = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, `pending$`
	statusIs := func(at func(m migrations.Migration) string) {
		t.Helper()
		r := runRelay(t, nil, args("migrate", "status")...)
		check(r, 0, "VERSION", "NAME", "APPLIED AT")
		for _, m := range all {
			if !row(m, at(m)).MatchString(r.stdout) {
				t.Fatalf("status: want %s %s:\n%s", label(m), at(m), r)
			}
		}
	}
	allPending := func(migrations.Migration) string { return pendingAt }
	allApplied := func(migrations.Migration) string { return appliedAt }

	statusIs(allPending)
	r := runRelay(t, nil, args("migrate", "up")...)
	check(r, 0)
	for _, m := range all {
		if !strings.Contains(r.stdout, "applied "+label(m)) {
			t.Fatalf("up did not apply %s:\n%s", label(m), r)
		}
	}
	r = runRelay(t, nil, args("migrate", "up")...)
	check(r, 0, "nothing to apply")
	if strings.Contains(r.stdout, "applied 0") {
		t.Fatalf("second up applied something:\n%s", r)
	}
	statusIs(allApplied)
	check(runRelay(t, nil, args("migrate", "down")...), 0, "reverted "+label(latest))
	statusIs(func(m migrations.Migration) string {
		if m.Version == latest.Version {
			return pendingAt
		}
		return appliedAt
	})
	check(runRelay(t, nil, args("migrate", "down", "--steps", "100")...), 0, "reverted 001_outbox")
	check(runRelay(t, nil, args("migrate", "down")...), 0, "nothing to revert")
	statusIs(allPending)
	r = runRelay(t, nil, args("migrate", "up", "--target", "1")...)
	check(r, 0, "applied 001_outbox")
	if len(all) > 1 && strings.Contains(r.stdout, "applied "+label(all[1])) {
		t.Fatalf("up --target 1 applied more:\n%s", r)
	}
	check(runRelay(t, nil, args("migrate", "up")...), 0, "applied "+label(latest))
	statusIs(allApplied)
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	s := schema(t)
	results := make([]result, 3)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = runRelay(t, []string{"DATABASE_URL=" + url}, "migrate", "up", "--schema", s) })
	}
	wg.Wait()
	appliedBy := 0
	for _, r := range results {
		if r.code != 0 {
			t.Fatalf("concurrent migrate up failed:\n%s", r)
		}
		if strings.Contains(r.stdout, "applied 001_outbox") {
			appliedBy++
		}
	}
	if appliedBy != 1 {
		t.Fatalf("%d processes applied 001_outbox, want exactly 1:\n%v", appliedBy, results)
	}
}

func TestMigrateWithConfigFile(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	s := schema(t)
	cfg := writeConfig(t, fmt.Sprintf(`
database:
  url: ${TEST_DB_URL}
  schema: %s
  table: events
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`, s))
	r := runRelay(t, []string{"TEST_DB_URL=" + url}, "migrate", "up", "--config", cfg)
	if r.code != 0 || !strings.Contains(r.stdout, "applied 001_outbox") || strings.Contains(r.stderr, "applied") {
		t.Fatalf("migrate up --config:\n%s", r)
	}
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
	pool := pgtest.Pool(t)
	var exists bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", s+".events").Scan(&exists); err != nil || !exists {
		t.Fatalf("table %s.events not created (%v)", s, err)
	}
	// The variable is missing: a configuration error naming it.
	r = runRelay(t, nil, "migrate", "status", "--config", cfg)
	if r.code != 2 || !strings.Contains(r.stderr, "database.url: environment variable TEST_DB_URL is not set") {
		t.Fatalf("missing variable:\n%s", r)
	}
}

func TestMigrateUnreachable(t *testing.T) {
	t.Parallel()
	r := runRelay(t, nil, "migrate", "up", "--database-url", "postgres://postgres:Unreach-Pw-9@127.0.0.1:1/test?connect_timeout=2")
	if r.code != 1 || !strings.Contains(r.stderr, "connecting to postgres://postgres:xxxxx@127.0.0.1:1/test") {
		t.Fatalf("want exit 1 naming the redacted URL:\n%s", r)
	}
	if strings.Contains(r.stderr, "Unreach-Pw-9") {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

// runConfig is a configuration for relay run with a stdout sink.
func runConfig(t *testing.T, url, schema string, extra string) string {
	return writeConfig(t, fmt.Sprintf(`
database:
  url: %q
  schema: %s
relay:
  lease: 5s
  poll_interval: 100ms
  shutdown_timeout: 5s
%s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - name: console
    type: stdout
routes:
  - topics: ["*"]
    sinks: [{name: console, destination: "out.{{.Topic}}"}]
`, url, schema, extra))
}

func TestRunBadConfig(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ edit, want string }{
		"bad duration":  {"  lease: 5s", `relay.lease: invalid duration "5 sec"`},
		"unknown key":   {"  poll_interval: 100ms", "relay.poll_intervall: unknown key"},
		"unknown sink":  {"{name: console,", `routes[0].sinks[0]: unknown sink "consol"`},
		"missing var":   {"  shutdown_timeout: 5s", "relay.shutdown_timeout: environment variable NO_SUCH_VAR_X is not set"},
		"bad sink type": {"type: stdout", `sinks[0].type: unknown sink type "stdot"`},
	}
	replacement := map[string]string{
		"bad duration":  "  lease: 5 sec",
		"unknown key":   "  poll_intervall: 100ms",
		"unknown sink":  "{name: consol,",
		"missing var":   "  shutdown_timeout: ${NO_SUCH_VAR_X}",
		"bad sink type": "type: stdot",
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := runConfig(t, "postgres://postgres:Cfg-Pw-77@127.0.0.1:1/test", "public", "")
			text := readFile(t, path)
			if !strings.Contains(text, c.edit) {
				t.Fatalf("test setup: %q not in config", c.edit)
			}
			path = writeConfig(t, strings.Replace(text, c.edit, replacement[name], 1))
			r := runRelay(t, nil, "run", "--config", path)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Fatalf("want exit 2 and %q:\n%s", c.want, r)
			}
			if strings.Contains(r.stderr, "Cfg-Pw-77") {
				t.Fatalf("the password was printed:\n%s", r)
			}
		})
	}
}

func TestRunUnmigrated(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	s := schema(t)
	r := runRelay(t, nil, "run", "--config", runConfig(t, url, s, ""))
	if r.code != 1 || !strings.Contains(r.stderr, "run `relay migrate up`") {
		t.Fatalf("want exit 1 telling to run relay migrate up:\n%s", r)
	}
	if strings.Contains(r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

func TestRunMissingDatabase(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	u := regexp.MustCompile(`/[^/?]*(\?|$)`).ReplaceAllString(url, "/no_such_db_herald$1")
	r := runRelay(t, nil, "run", "--config", runConfig(t, u, "public", ""))
	if r.code != 1 || !strings.Contains(r.stderr, "no_such_db_herald") {
		t.Fatalf("want exit 1 at once for a database that does not exist:\n%s", r)
	}
	if strings.Contains(r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

func TestRunRetriesUnreachableDatabase(t *testing.T) {
	t.Parallel()
	const password = "Retry-Pa55-42"
	p := start(t, nil, "run", "--config", runConfig(t, "postgres://postgres:"+password+"@127.0.0.1:1/test?connect_timeout=2", "public", ""))
	p.waitLine(t, p.stderr, "database unreachable", 10*time.Second)
	p.waitLine(t, p.stderr, "database unreachable", 10*time.Second)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM while retrying, want 0:\n%s", code, p.output())
	}
	out := p.output()
	if strings.Contains(out, password) {
		t.Fatalf("the password was printed:\n%s", out)
	}
	var lines int
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "database unreachable") {
			continue
		}
		lines++
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON (log.format json): %s", line)
		}
		if rec["level"] != "WARN" || rec["database"] != "postgres://postgres:xxxxx@127.0.0.1:1/test?connect_timeout=2" ||
			!strings.Contains(fmt.Sprint(rec["error"]), "connect") || rec["retry_in"] == nil {
			t.Errorf("retry log line lacks level, redacted URL, error or delay: %s", line)
		}
	}
	if lines < 2 {
		t.Fatalf("%d retry lines, want at least 2:\n%s", lines, out)
	}
}

func TestRunDeliversAndStopsGracefully(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	var id string
	if err := pool.QueryRow(ctx, "INSERT INTO "+tables.Outbox()+" (topic, key, payload) VALUES ('orders.created', 'order-1', '{\"total\": 42}') RETURNING id::text").Scan(&id); err != nil {
		t.Fatal(err)
	}
	p := start(t, nil, "run", "--config", runConfig(t, url, tables.Schema, ""))
	line := p.waitLine(t, p.stdout, id, 20*time.Second)
	var ev struct {
		ID, Topic, Destination, Key string
		Payload                     map[string]any
	}
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("stdout line is not JSON: %s", line)
	}
	if ev.ID != id || ev.Topic != "orders.created" || ev.Destination != "out.orders.created" || ev.Key != "order-1" || ev.Payload["total"] != 42.0 {
		t.Fatalf("delivered %+v", ev)
	}
	// A row inserted while running arrives too (LISTEN/NOTIFY or polling).
	var id2 string
	if err := pool.QueryRow(ctx, "INSERT INTO "+tables.Outbox()+" (topic) VALUES ('users.created') RETURNING id::text").Scan(&id2); err != nil {
		t.Fatal(err)
	}
	p.waitLine(t, p.stdout, id2, 20*time.Second)
	// The outcome is recorded: with retention 0 delivered rows are deleted.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pending int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tables.Outbox()+" WHERE status <> 'done'").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still not done:\n%s", pending, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, p.output())
	}
	out := p.output()
	if !strings.Contains(out, "sinks closed; exiting") {
		t.Errorf("no shutdown log line:\n%s", out)
	}
	if strings.Contains(out, password) {
		t.Fatalf("the password was printed:\n%s", out)
	}
}

func TestRunRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	if _, err := pool.Exec(context.Background(), "INSERT INTO "+tables.Versions()+" (version, name) VALUES (999, 'from_the_future')"); err != nil {
		t.Fatal(err)
	}
	r := runRelay(t, nil, "run", "--config", runConfig(t, url, tables.Schema, ""))
	if r.code != 1 || !strings.Contains(r.stderr, "newer than this relay") {
		t.Fatalf("want exit 1 refusing a newer schema:\n%s", r)
	}
}

func TestRunSinkCreationFails(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	// The templates directory is read when the sink is created, not at load.
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
sinks:
  - name: mail
    type: email
    smtp: {host: 127.0.0.1, port: 1}
    from: shop@example.com
    templates_dir: /nonexistent/templates
routes: [{topics: ["*"], sinks: [mail]}]
`, url, tables.Schema))
	r := runRelay(t, nil, "run", "--config", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, "creating email sink mail") {
		t.Fatalf("want exit 1 naming the sink:\n%s", r)
	}
	if strings.Contains(r.stderr, password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

func TestDatabaseURLPrecedence(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	s := schema(t)
	const unreachable = "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`, unreachable, s))
	if r := runRelay(t, nil, "migrate", "status", "--config", cfg); r.code != 1 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Fatalf("database.url should be used without DATABASE_URL:\n%s", r)
	}
	if r := runRelay(t, []string{"DATABASE_URL=" + url}, "migrate", "status", "--config", cfg); r.code != 0 {
		t.Fatalf("DATABASE_URL should override database.url:\n%s", r)
	}
	if r := runRelay(t, []string{"DATABASE_URL=" + unreachable}, "migrate", "status", "--config", cfg, "--database-url", url); r.code != 0 {
		t.Fatalf("--database-url should override DATABASE_URL:\n%s", r)
	}
}
