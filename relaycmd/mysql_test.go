package relaycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/mysqltest"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
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
// password, from the flag and from a config file, and relay run gives up
// at once rather than retrying.
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
		{"dlq", "list", "--database-url", u.String()},
		// A refused login is not retried: run stops at once.
		{"run", "--config", runConfig(t, u.String(), "public", "")},
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

// TestMySQLRelay: the operator's day on MariaDB. relay migrate up, events
// inserted with plain SQL, relay run delivering them to a webhook (one
// refused for good), relay config check and status, the admin API, the
// metrics and the console over HTTP, then relay dlq list, show, replay
// (the relay delivers the replayed event) and purge. The relay runs as a
// binary, as an operator runs it; the other commands run in this process.
func TestMySQLRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, dbURL := mysqltest.Database(t)
	if r := inProcess(t, ctx, "migrate", "up", "--database-url", dbURL); r.code != 0 {
		t.Fatalf("relay migrate up:\n%s", r)
	}

	var (
		refuse   atomic.Bool
		hookMu   sync.Mutex
		received []string
	)
	refuse.Store(true)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "refuse-me") && refuse.Load() {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		hookMu.Lock()
		received = append(received, r.Header.Get("webhook-id"))
		hookMu.Unlock()
	}))
	defer hook.Close()
	got := func() []string {
		hookMu.Lock()
		defer hookMu.Unlock()
		return slices.Clone(received)
	}
	// insert writes an event with a plain INSERT and reads its id back
	// (before the relay runs: it would take the row).
	insert := func(topic, key, payload string) string {
		t.Helper()
		if _, err := db.Exec("INSERT INTO outbox (topic, `key`, payload) VALUES (?, nullif(?, ''), ?)", topic, key, payload); err != nil {
			t.Fatal(err)
		}
		var id string
		if err := db.QueryRow("SELECT id FROM outbox WHERE payload = ? ORDER BY seq DESC LIMIT 1", payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// count runs a count of rows of the relay's tables.
	count := func(query string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ok1 := insert("orders.created", "o-1", `{"n": 1}`)
	bad := insert("orders.created", "o-2", `"refuse-me"`)
	ok3 := insert("users.created", "", `{"n": 3}`)

	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q}
relay: {lease: 5s, poll_interval: 50ms, shutdown_timeout: 5s}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - name: hook
    type: webhook
    url: %s
    permanent_on: [422]
routes: [{topics: ["*"], sinks: [hook]}]
`, dbURL, hook.URL))
	if r := inProcess(t, ctx, "config", "check", "--config", cfg); r.code != 0 || !strings.Contains(r.stdout, "`outbox` is migrated") {
		t.Fatalf("relay config check:\n%s", r)
	}
	p := start(t, nil, "run", "--config", cfg)
	var listening map[string]any
	if err := json.Unmarshal([]byte(p.waitLine(t, p.stderr, "admin: listening", 30*time.Second)), &listening); err != nil {
		t.Fatal(err)
	}
	base := "http://" + listening["address"].(string)
	waitFor(t, 30*time.Second, p, "two events delivered and one dead letter", func() bool {
		return len(got()) == 2 && count("SELECT count(*) FROM outbox") == 0 &&
			count("SELECT count(*) FROM outbox_deliveries WHERE state = 'dead'") == 1
	})
	if !slices.Equal(sorted(got()...), sorted(ok1, ok3)) {
		t.Fatalf("delivered %v, want %s and %s", got(), ok1, ok3)
	}

	// The admin server and the console, over HTTP.
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	get("/readyz")
	if m := get("/metrics"); !strings.Contains(m, `herald_events_published_total{sink="hook"`) ||
		!strings.Contains(m, "\nherald_mysql_history_list_length ") {
		t.Fatalf("/metrics has no published count or no history list length:\n%s", m)
	}
	if list := get("/dlq"); !strings.Contains(list, bad) || !strings.Contains(list, "422") {
		t.Fatalf("GET /dlq: %s", list)
	}
	if show := get("/dlq/" + bad); !strings.Contains(show, `"status": "dead"`) {
		t.Fatalf("GET /dlq/%s: %s", bad, show)
	}
	for path, want := range map[string]string{
		"/ui/":             "hook",
		"/ui/dead":         bad,
		"/ui/event/" + bad: "refuse-me",
		"/ui/held":         "",
		"/ui/key?key=o-2":  "",
	} {
		if page := get(path); !strings.Contains(page, want) {
			t.Errorf("GET %s lacks %q", path, want)
		}
	}

	// The CLI, in this process.
	r := inProcess(t, ctx, "status", "--database-url", dbURL)
	if r.code != 0 || !strings.Contains(r.stdout, "`outbox` at ") || !strings.Contains(r.stdout, "0 pending, 0 queued, 1 dead") ||
		!strings.Contains(r.stdout, "RELAY") {
		t.Fatalf("relay status:\n%s", r)
	}
	r = inProcess(t, ctx, "dlq", "list", "--database-url", dbURL, "--sink", "hook")
	if r.code != 0 || !strings.Contains(r.stdout, bad) || !strings.Contains(r.stdout, "422") {
		t.Fatalf("relay dlq list:\n%s", r)
	}
	if r := inProcess(t, ctx, "dlq", "show", bad, "--database-url", dbURL); r.code != 0 || !strings.Contains(r.stdout, "refuse-me") {
		t.Fatalf("relay dlq show:\n%s", r)
	}
	refuse.Store(false)
	if r := inProcess(t, ctx, "dlq", "replay", "--id", bad, "--yes", "--database-url", dbURL); r.code != 0 || !strings.Contains(r.stdout, "replayed 1 dead letter") {
		t.Fatalf("relay dlq replay:\n%s", r)
	}
	waitFor(t, 30*time.Second, p, "the replayed event delivered", func() bool {
		return slices.Contains(got(), bad) && count("SELECT count(*) FROM outbox_deliveries") == 0
	})

	refuse.Store(true)
	// Its id is chosen here: the relay may take the row before a SELECT
	// reads it back.
	again := uuid.NewString()
	if _, err := db.Exec("INSERT INTO outbox (id, topic, `key`, payload) VALUES (?, 'orders.created', 'o-2', '\"refuse-me again\"')", again); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, p, "a second dead letter", func() bool {
		return count("SELECT count(*) FROM outbox_deliveries WHERE state = 'dead'") == 1
	})
	if r := inProcess(t, ctx, "dlq", "purge", "--all", "--dry-run", "--database-url", dbURL); r.code != 0 || !strings.Contains(r.stdout, again) ||
		!strings.Contains(r.stdout, "dry run: would purge 1 dead letter;") {
		t.Fatalf("relay dlq purge --dry-run:\n%s", r)
	}
	if r := inProcess(t, ctx, "dlq", "purge", "--all", "--yes", "--database-url", dbURL); r.code != 0 || !strings.Contains(r.stdout, "purged 1 dead letter") {
		t.Fatalf("relay dlq purge:\n%s", r)
	}
	if n := count("SELECT count(*) FROM outbox_deliveries"); n != 0 || slices.Contains(got(), again) {
		t.Fatalf("after the purge: %d deliveries left, delivered %v", n, got())
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay run exited %d:\n%s", code, p.output())
	}
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// inProcess runs a relay command line in this process, as the binary's
// main does, and returns what it printed. Its logs go to this process's
// stderr.
func inProcess(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	root := newRootCommand(&options{})
	root.SetArgs(args)
	var stdout, stderr strings.Builder
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	err := root.ExecuteContext(ctx)
	code := 0
	if err != nil {
		fmt.Fprintln(&stderr, "relay:", err)
		code = exitUsage
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// TestREADMEMySQL runs the MySQL quick start of docs/mysql.md on
// MariaDB, as written: relay migrate up on the DATABASE_URL it exports
// (the test's database), its INSERT, relay run with its configuration
// (the webhook pointed at a server of the test's, the admin server on a
// free port), then relay status and relay dlq list while the relay runs.
func TestREADMEMySQL(t *testing.T) {
	t.Parallel()
	section := doc(t, "mysql.md")
	blocks := map[string][]string{}
	for _, m := range fencedBlock.FindAllStringSubmatch(section, -1) {
		blocks[m[1]] = append(blocks[m[1]], m[2])
	}
	if len(blocks["sh"]) != 2 || !strings.Contains(blocks["sh"][0], "export DATABASE_URL='mysql://") {
		t.Fatalf("docs/mysql.md: want two sh blocks, the first exporting a mysql:// DATABASE_URL, got %q", blocks["sh"])
	}
	if len(blocks["sql"]) != 1 || len(blocks["yaml"]) != 1 {
		t.Fatalf("docs/mysql.md: want one SQL and one YAML example, got %d and %d", len(blocks["sql"]), len(blocks["yaml"]))
	}
	var commands []string
	for _, block := range blocks["sh"] {
		for _, line := range strings.Split(block, "\n") {
			line, _, _ = strings.Cut(line, "#")
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "export ") {
				commands = append(commands, line)
			}
		}
	}
	want := []string{"relay migrate up", "relay run --config relay-mysql.yaml", "relay status", "relay dlq list"}
	if !slices.Equal(commands, want) {
		t.Fatalf("docs/mysql.md's quick start runs %q; this test runs %q", commands, want)
	}

	db, dbURL := mysqltest.Database(t)
	env := []string{"DATABASE_URL=" + dbURL}
	if r := runRelay(t, env, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "applied 001_outbox") {
		t.Fatalf("relay migrate up:\n%s", r)
	}
	if _, err := db.Exec(blocks["sql"][0]); err != nil {
		t.Fatalf("docs/mysql.md's INSERT example: %v", err)
	}
	var id, topic, key, payload, status string
	if err := db.QueryRow("SELECT id, topic, `key`, payload, status FROM outbox").Scan(&id, &topic, &key, &payload, &status); err != nil {
		t.Fatal(err)
	}
	if topic != "orders.paid" || key != "order-42" || !strings.Contains(payload, `"order_id": 42`) || status != "pending" {
		t.Fatalf("stored %q %q %q %q", topic, key, payload, status)
	}

	delivered := make(chan string, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		delivered <- r.Header.Get("webhook-id")
	}))
	defer hook.Close()
	const hookURL = "http://127.0.0.1:8080/events"
	if !strings.Contains(blocks["yaml"][0], hookURL) {
		t.Fatalf("docs/mysql.md's relay-mysql.yaml does not send to %s:\n%s", hookURL, blocks["yaml"][0])
	}
	cfg := writeConfig(t, strings.Replace(blocks["yaml"][0], hookURL, hook.URL, 1)+`admin: {listen: "127.0.0.1:0"}`+"\n")
	p := start(t, env, "run", "--config", cfg)
	select {
	case got := <-delivered:
		if got != id {
			t.Fatalf("the webhook received %s, want %s", got, id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("docs/mysql.md's event did not reach the webhook; relay output:\n%s", p.output())
	}
	// The webhook answers before the relay records the delivery: wait
	// until status shows the record.
	var r result
	waitFor(t, 30*time.Second, p, "relay status showing the event delivered", func() bool {
		r = runRelay(t, env, "status")
		return r.code != 0 || strings.Contains(r.stdout, "0 pending, 0 queued, 0 dead")
	})
	if r.code != 0 || !strings.Contains(r.stdout, "RELAY") {
		t.Fatalf("relay status:\n%s", r)
	}
	if r := runRelay(t, env, "dlq", "list"); r.code != 0 || !strings.Contains(r.stderr, "no dead letters match") {
		t.Fatalf("relay dlq list:\n%s", r)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay run exited %d:\n%s", code, p.output())
	}
}
