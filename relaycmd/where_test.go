package relaycmd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

// TestBadWhereExitsTwo: a where: expression that does not compile or
// type-check stops `relay run` and `relay config check` with exit 2 and an
// error naming the route and the position, before anything connects.
func TestBadWhereExitsTwo(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ where, want string }{
		"syntax":   {`payload.total >`, "routes[1].where: invalid CEL expression: line 1, column 16: Syntax error"},
		"not bool": {`topic + key`, "routes[1].where: invalid CEL expression: line 1, column 1: the expression is of type string, not bool"},
		"unknown":  {`tenant == \"acme\"`, "routes[1].where: invalid CEL expression: line 1, column 1: undeclared reference to 'tenant'"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := writeConfig(t, fmt.Sprintf(`
database: {url: "postgres://postgres@127.0.0.1:1/test"}
sinks: [{name: console, type: stdout}]
routes:
  - {topics: ["audit.*"], sinks: [console]}
  - {topics: ["orders.*"], where: "%s", sinks: [console]}
`, c.where))
			for _, cmd := range [][]string{{"run"}, {"config", "check"}} {
				r := runRelay(t, nil, append(cmd, "--config", cfg)...)
				if r.code != 2 || !strings.Contains(r.stderr, c.want) {
					t.Fatalf("relay %s: want exit 2 and %q on stderr:\n%s", strings.Join(cmd, " "), c.want, r)
				}
			}
		})
	}
}

// TestRunRoutesByWhere: the built binary sends an event its route's filter
// matches to the route's sink, and dead-letters one it does not at the
// routing step, saying which filter was false.
func TestRunRoutesByWhere(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	s := schema(t)
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %q}
relay: {poll_interval: 100ms, shutdown_timeout: 5s}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: console, type: stdout}]
routes:
  - topics: ["orders.*"]
    where: 'payload.total > 100 && headers["tenant"] == "acme"'
    sinks: [console]
`, url, s))
	if r := runRelay(t, nil, "migrate", "up", "--config", cfg); r.code != 0 {
		t.Fatalf("migrate up:\n%s", r)
	}
	pool := pgtest.Pool(t)
	tables := migrations.Tables{Schema: s}.WithDefaults()
	insert := func(payload, headers string) string {
		var id string
		if err := pool.QueryRow(context.Background(), "INSERT INTO "+tables.Outbox()+" (topic, key, payload, headers) VALUES ('orders.created', 'k', $1::json, $2::jsonb) RETURNING id::text",
			payload, headers).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	small := insert(`{"total": 20}`, `{"tenant": "acme"}`)
	big := insert(`{"total": 120}`, `{"tenant": "acme"}`)
	p := start(t, nil, "run", "--config", cfg)
	p.waitLine(t, p.stdout, big, 30*time.Second)
	var reason string
	deadline := time.Now().Add(30 * time.Second)
	for reason == "" && time.Now().Before(deadline) {
		if err := pool.QueryRow(context.Background(), "SELECT coalesce(max(last_error), '') FROM "+tables.Deliveries()+" WHERE sink = '' AND state = 'dead' AND id = $1::uuid", small).Scan(&reason); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if want := fmt.Sprintf(`no route matches event %s of topic "orders.created": routes[0] where is false`, small); reason != want {
		t.Fatalf("dead letter of the small order: %q, want %q\n%s", reason, want, p.output())
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), `{"id":"`+small+`"`) {
		t.Fatalf("the small order reached the sink:\n%s", p.output())
	}
}
