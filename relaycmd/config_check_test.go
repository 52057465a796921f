package relaycmd

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/natstest"
)

// TestConfigCheck runs relay config check against a real database and NATS
// server: it passes when everything answers and prints the routes, fails
// (exit 1) naming a sink that cannot connect or an unmigrated schema, and
// refuses (exit 2) an invalid file or an unset variable.
func TestConfigCheck(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	s := schema(t)
	natsURL := natstest.URL(t)
	bad := "nats://" + closedPort(t)
	config := func(schema, busURL, extra string) string {
		return writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
sinks:
  - {name: bus, type: nats, url: %q}
  - {name: hook, type: webhook, url: "http://127.0.0.1:9/hook", secret: "${HERALD_TEST_HOOK_SECRET}"}
  - {name: spare, type: discard}
routes:
  - topics: ["orders.*", "users.created"]
    sinks: [{name: bus, destination: "events.{{.Topic}}"}, hook]
  - topics: ["audit.*"]
    sinks: [bus]
%s`, url, schema, busURL, extra))
	}
	env := []string{"HERALD_TEST_HOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	check := func(r result, code int, want ...string) {
		t.Helper()
		if r.code != code {
			t.Fatalf("want exit %d:\n%s", code, r)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout+r.stderr, w) {
				t.Fatalf("output lacks %q:\n%s", w, r)
			}
		}
		if strings.Contains(r.stdout+r.stderr, password) || strings.Contains(r.stdout+r.stderr, "MfKQ9r8GKYqrTwjUPD8") {
			t.Fatalf("a secret was printed:\n%s", r)
		}
	}

	// Not migrated yet: the database check fails and says what to run.
	check(runRelay(t, env, "config", "check", "--config", config(s, natsURL, "")), 1,
		"database ", "FAILED", "relay migrate up", "sink bus (nats): ok", "config check failed: the database")
	if r := runRelay(t, nil, "migrate", "up", "--database-url", url, "--schema", s); r.code != 0 {
		t.Fatalf("migrate:\n%s", r)
	}

	r := runRelay(t, env, "config", "check", "--config", config(s, natsURL, ""))
	check(r, 0, "valid", "is migrated", "sink bus (nats): ok", "sink hook (webhook): not checked",
		`orders.*, users.created -> bus (nats: events.{{.Topic}}), hook (webhook)`,
		`audit.* -> bus (nats: the event's topic)`, "any other event -> dead letter")
	if strings.Contains(r.stdout, "sink spare") || !strings.Contains(r.stderr, "spare") {
		t.Fatalf("a sink no route uses is not checked, and is warned about:\n%s", r)
	}

	r = runRelay(t, env, "config", "check", "--config", config(s, bad, ""))
	check(r, 1, "sink bus (nats): FAILED", strings.TrimPrefix(bad, "nats://"), "config check failed: sink bus")
	if !regexp.MustCompile(`(?m)^routes`).MatchString(r.stdout) {
		t.Fatalf("the routes are printed even when a sink fails:\n%s", r)
	}

	// A subject a route fixes (an exact topic, no template) must have a
	// stream; one rendered from events is checked when published.
	r = runRelay(t, env, "config", "check", "--config", config(s, natsURL, "  - {topics: [\"herald_nostream.fixed\"], sinks: [bus]}\n"))
	check(r, 1, "sink bus (nats): FAILED", `subject "herald_nostream.fixed"`, "no JetStream stream covers the subject")

	check(runRelay(t, nil, "config", "check", "--config", config(s, natsURL, "")), 2, "HERALD_TEST_HOOK_SECRET")
	check(runRelay(t, env, "config", "check", "--config", config(s, natsURL, "relay: {lease: 30 sec}\n")), 2, "relay.lease")
	check(runRelay(t, env, "config", "check"), 2, "--config: required")
}
