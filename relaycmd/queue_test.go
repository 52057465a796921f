package relaycmd

import (
	"regexp"
	"strings"
	"testing"
)

// TestQueueDrop: relay queue drop counts on --dry-run, refuses a sink the
// configuration names and one not named, asks without --yes, and drops
// every delivery of the sink (waiting, due and dead) and nothing else.
func TestQueueDrop(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(2, "orders.created", "gone")
	b.insert("orders.created", "k-9", "gone", "ready", "")
	b.insert("orders.created", "k-9", "gone", "waiting", "")
	b.insert("orders.created", "k-9", "hook", "ready", "")
	before := b.dump()

	r := runRelay(t, nil, b.args("queue", "drop", "--sink", "gone", "--dry-run")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "dry run: would drop 4 deliveries of sink gone") || b.dump() != before {
		t.Fatalf("dry run:\n%s", r)
	}
	r = runRelay(t, nil, b.args("queue", "drop")...)
	b.check(t, r, 2)
	if !strings.Contains(r.stderr, "--sink") {
		t.Fatalf("no sink:\n%s", r)
	}
	config := writeConfig(t, `sinks:
  - {name: gone, type: stdout}
routes:
  - {topics: ["*"], sinks: [gone]}
`)
	url, _ := dbURL(t)
	r = runRelay(t, []string{"DATABASE_URL=" + url}, b.args("--config", config, "queue", "drop", "--sink", "gone", "--yes")...)
	b.check(t, r, 2)
	if !strings.Contains(r.stderr, `"gone" is a sink of the configuration`) || b.dump() != before {
		t.Fatalf("a configured sink:\n%s", r)
	}
	// relay status with a configuration that names hook alone.
	hookOnly := writeConfig(t, `sinks:
  - {name: hook, type: stdout}
routes:
  - {topics: ["*"], sinks: [hook]}
`)
	r = runRelay(t, []string{"DATABASE_URL=" + url}, b.args("--config", hookOnly, "status")...)
	b.check(t, r, 0)
	if !regexp.MustCompile(`(?m)^\s*gone\s+unconfigured\s`).MatchString(r.stdout) || regexp.MustCompile(`(?m)^\s*hook\s+unconfigured`).MatchString(r.stdout) {
		t.Fatalf("status should show sink gone, and it alone, as unconfigured:\n%s", r)
	}
	r = runRelay(t, nil, b.args("queue", "drop", "--sink", "gone")...)
	b.check(t, r, 2)
	if !strings.Contains(r.stderr, "pass --yes") || b.dump() != before {
		t.Fatalf("without a terminal or --yes:\n%s", r)
	}
	r = runRelay(t, nil, b.args("queue", "drop", "--sink", "gone", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "dropped 4 deliveries of sink gone") {
		t.Fatalf("drop:\n%s", r)
	}
	if left := b.query("SELECT string_agg(sink, ',') FROM " + b.tables.Deliveries()); left != "hook" {
		t.Fatalf("deliveries left on sinks %q, want hook's alone", left)
	}
}
