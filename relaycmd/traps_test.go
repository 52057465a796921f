package relaycmd

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/migrations"
)

// TestNoCommandIsUsageError: "relay" alone prints the usage on stderr and
// exits 2, as every usage error does.
func TestNoCommandIsUsageError(t *testing.T) {
	t.Parallel()
	r := runRelay(t, nil)
	if r.code != exitUsage || !strings.Contains(r.stderr, "Usage:") || !strings.Contains(r.stderr, "a command is required") || r.stdout != "" {
		t.Fatalf("relay with no command:\n%s", r)
	}
}

// TestMigrateUpPrintsEachStepOnce: the command's own line per migration,
// not a log line saying it again.
func TestMigrateUpPrintsEachStepOnce(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	r := runRelay(t, nil, "migrate", "up", "--database-url", url, "--schema", schema(t))
	if r.code != 0 {
		t.Fatalf("migrate up:\n%s", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout+"\n"+r.stderr), "\n")
	if n := migrations.Latest(); len(lines) != n {
		t.Fatalf("want %d lines, one per migration:\n%s", n, r)
	}
	for _, l := range lines {
		if !regexp.MustCompile(`^applied \d{3}_\w+$`).MatchString(l) {
			t.Fatalf("unexpected line %q:\n%s", l, r)
		}
	}
}

// TestDLQListShowsCause: the LAST ERROR column drops the "publishing event
// ID to SINK" prefix the other columns already show, so the cause fits.
func TestDLQListShowsCause(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	id, _ := b.insert("orders.paid", "order-1", "billing", "dead", "")
	b.exec(`UPDATE `+b.tables.Deliveries()+` SET last_error = 'publishing event ' || id || ' to billing: endpoint answered 410 Gone: "this customer is gone"' WHERE id = $1`, id)
	r := runRelay(t, nil, b.args("dlq", "list", "--error", "410 Gone")...)
	b.check(t, r, 0)
	line := regexp.MustCompile(`(?m)^` + id + `.*$`).FindString(r.stdout)
	if !strings.HasSuffix(line, `  endpoint answered 410 Gone: "this customer is gone"`) {
		t.Fatalf("LAST ERROR is not the cause:\n%s", r)
	}
	// The JSON keeps the whole text.
	r = runRelay(t, nil, b.args("dlq", "list", "--json")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, `"last_error":"publishing event `+id+` to billing: endpoint answered 410 Gone`) {
		t.Fatalf("JSON last_error:\n%s", r)
	}
}

// TestDLQSelectionFlagsShared: list, replay and purge take the same
// selection flags, and the error for a missing selection names only flags
// the command takes.
func TestDLQSelectionFlagsShared(t *testing.T) {
	t.Parallel()
	command := func(verb string) *cobra.Command {
		cmd, _, err := newRootCommand(&options{}).Find([]string{"dlq", verb})
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	names := func(verb string) []string {
		cmd := command(verb)
		var out []string
		for _, f := range []string{"id", "topic", "key", "sink", "error", "since", "until", "older-than"} {
			if cmd.Flags().Lookup(f) != nil {
				out = append(out, f)
			}
		}
		return out
	}
	list := strings.Join(names("list"), " ")
	for _, verb := range []string{"replay", "purge"} {
		if got := strings.Join(names(verb), " "); got != list {
			t.Errorf("dlq %s selection flags %q, dlq list has %q", verb, got, list)
		}
	}

	b := newDLQBundle(t)
	b.insertDead(1, "orders.created", "hook") // died 2 hours ago
	for _, verb := range []string{"replay", "purge"} {
		r := runRelay(t, nil, b.args("dlq", verb)...)
		b.check(t, r, exitUsage)
		for _, m := range regexp.MustCompile(`--[a-z-]+`).FindAllString(r.stderr, -1) {
			if command(verb).Flags().Lookup(strings.TrimPrefix(m, "--")) == nil {
				t.Errorf("dlq %s suggests %s, which it does not accept:\n%s", verb, m, r)
			}
		}
		r = runRelay(t, nil, b.args("dlq", verb, "--older-than", "1h", "--dry-run")...)
		b.check(t, r, 0)
		if !strings.Contains(r.stdout, "dry run: would "+verb+" 1 dead letter") {
			t.Fatalf("dlq %s --older-than 1h:\n%s", verb, r)
		}
		r = runRelay(t, nil, b.args("dlq", verb, "--older-than", "3h", "--dry-run")...)
		b.check(t, r, 0)
		if !strings.Contains(r.stdout, "would "+verb+" 0 dead letters") {
			t.Fatalf("dlq %s --older-than 3h:\n%s", verb, r)
		}
	}
}

// TestReadOnlyCommandsNeedOnlyTheirVariables: status, dlq and migrate read
// the database section and the routes; the ${VAR}s of the admin token,
// tracing, relay settings and sink secrets need not be set for them, while
// run still refuses to start without them.
func TestReadOnlyCommandsNeedOnlyTheirVariables(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	url, _ := dbURL(t)
	b.insertDead(1, "orders.created", "hook")
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {batch_size: "${HERALD_TEST_UNSET_BATCH}"}
admin: {listen: "0.0.0.0:9999", token: "${HERALD_TEST_UNSET_TOKEN}"}
tracing: {otlp_endpoint: "${HERALD_TEST_UNSET_OTLP}"}
sinks:
  - {name: hook, type: webhook, url: "https://${HERALD_TEST_UNSET_HOST}/hook", secret: "${HERALD_TEST_UNSET_SECRET}"}
routes: [{topics: ["orders.*"], sinks: [hook]}]
`, url, b.tables.Schema))
	for _, args := range [][]string{{"status"}, {"dlq", "list"}, {"migrate", "status"}, {"dlq", "purge", "--all", "--dry-run"}} {
		r := runRelay(t, nil, append(args, "--config", cfg)...)
		b.check(t, r, 0)
		if args[0] == "status" && !regexp.MustCompile(`(?m)^\s*hook\s+flowing\s+0\s+0\s+0\s+1\s`).MatchString(r.stdout) {
			t.Fatalf("status with --config:\n%s", r)
		}
	}
	r := runRelay(t, nil, "run", "--config", cfg)
	if r.code != exitUsage || !strings.Contains(r.stderr, "HERALD_TEST_UNSET_") {
		t.Fatalf("run without the variables set must refuse, naming one:\n%s", r)
	}
	// A read-only command still names a variable it does need.
	cfg = writeConfig(t, `
database: {url: "${HERALD_TEST_UNSET_DB}"}
sinks: [{name: hook, type: discard}]
routes: [{topics: ["*"], sinks: [hook]}]
`)
	r = runRelay(t, nil, "status", "--config", cfg)
	if r.code != exitUsage || !strings.Contains(r.stderr, "database.url") || !strings.Contains(r.stderr, "HERALD_TEST_UNSET_DB") {
		t.Fatalf("status without the database's variable:\n%s", r)
	}
}
