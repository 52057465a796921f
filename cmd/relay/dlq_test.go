package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/migrations/pgtest"
)

// dlqBundle is a migrated schema and the flags that point the CLI at it.
type dlqBundle struct {
	tables   migrations.Tables
	exec     func(sql string, args ...any)
	query    func(sql string, args ...any) string
	args     func(a ...string) []string
	password string
}

func newDLQBundle(t *testing.T) *dlqBundle {
	t.Helper()
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()
	return &dlqBundle{
		tables:   tables,
		password: password,
		exec: func(sql string, args ...any) {
			t.Helper()
			if _, err := pool.Exec(ctx, sql, args...); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		},
		query: func(sql string, args ...any) string {
			t.Helper()
			var out string
			if err := pool.QueryRow(ctx, sql, args...).Scan(&out); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
			return out
		},
		args: func(a ...string) []string { return append(a, "--database-url", url, "--schema", tables.Schema) },
	}
}

// insertDead inserts n dead events of a topic whose hook delivery failed
// and kafka delivery succeeded.
func (b *dlqBundle) insertDead(n int, topic string) {
	b.exec(`INSERT INTO `+b.tables.Outbox()+` (topic, key, payload, headers, status, attempts, last_error, deliveries, finished_at)
SELECT $1, 'k-' || i, '{"total": 42, "items": [1, 2]}', '{"x-tenant": "acme"}', 'dead', 3, 'hook: HTTP 500 Internal Server Error',
  '{"hook": {"state": "dead", "attempts": 3, "error": "HTTP 500 Internal Server Error", "at": "2026-01-01T00:00:00Z"},
    "kafka": {"state": "done", "attempts": 1, "at": "2026-01-01T00:00:00Z"}}', now() - interval '2 hours'
FROM generate_series(1, $2) AS i`, topic, n)
}

// dump is the outbox and holds tables as text.
func (b *dlqBundle) dump() string {
	return b.query("SELECT coalesce(string_agg(o::text, E'\\n' ORDER BY seq), '') FROM "+b.tables.Outbox()+" o") + "\n--\n" +
		b.query("SELECT coalesce(string_agg(h::text, E'\\n' ORDER BY seq, sink), '') FROM "+b.tables.Holds()+" h")
}

func (b *dlqBundle) check(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d:\n%s", code, r)
	}
	if strings.Contains(r.stdout+r.stderr, b.password) {
		t.Fatalf("the password was printed:\n%s", r)
	}
}

func TestDLQListAndShow(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(2, "orders.created")
	b.insertDead(1, "users_created")
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic, status, last_error, finished_at) VALUES ('usersXcreated', 'dead', 'no route matches topic', now())")

	r := runRelay(t, nil, b.args("dlq", "list")...)
	b.check(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "orders.created") || !strings.Contains(lines[1], "hook: HTTP 500") {
		t.Fatalf("table:\n%s", r)
	}

	var listed []map[string]any
	r = runRelay(t, nil, b.args("dlq", "list", "--json", "--topic", "users_created")...)
	b.check(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 || listed[0]["topic"] != "users_created" {
		t.Fatalf("--topic users_created (the _ is literal): %v\n%s", err, r)
	}
	r = runRelay(t, nil, b.args("dlq", "list", "--json", "--topic", "*created", "--sink", "hook", "--error", "internal SERVER", "--since", "3h", "--until", "1h", "--limit", "2")...)
	b.check(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 2 || !strings.Contains(r.stderr, "showing the first 2") {
		t.Fatalf("filters: %v\n%s", err, r)
	}
	id := listed[0]["id"].(string)
	r = runRelay(t, nil, b.args("dlq", "list", "--json", "--key", "k-2", "--topic", "orders.*")...)
	b.check(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 || listed[0]["key"] != "k-2" {
		t.Fatalf("--key: %v\n%s", err, r)
	}
	r = runRelay(t, nil, b.args("dlq", "list", "--json", "--topic", "nothing")...)
	b.check(t, r, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("no match must be an empty array:\n%s", r)
	}

	r = runRelay(t, nil, b.args("dlq", "show", id)...)
	b.check(t, r, 0)
	for _, want := range []string{"id:            " + id, "status:        dead", "x-tenant: acme", "last_error:    hook: HTTP 500 Internal Server Error",
		"\"total\": 42", "\"items\": [", "attempts:      3 (max relay default)"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("show lacks %q:\n%s", want, r)
		}
	}
	if !regexp.MustCompile(`hook\s+dead\s+3\s+2026-01-01T00:00:00Z\s+HTTP 500`).MatchString(r.stdout) ||
		!regexp.MustCompile(`kafka\s+done\s+1`).MatchString(r.stdout) {
		t.Fatalf("show lacks the deliveries:\n%s", r)
	}
	r = runRelay(t, nil, b.args("dlq", "show", id, "--json")...)
	b.check(t, r, 0)
	var shown map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &shown); err != nil || shown["id"] != id || shown["payload"].(map[string]any)["total"] != 42.0 {
		t.Fatalf("show --json: %v\n%s", err, r)
	}
	b.check(t, runRelay(t, nil, b.args("dlq", "show", "0190a0b0-0000-7000-8000-000000000000")...), 1)
	b.check(t, runRelay(t, nil, b.args("dlq", "show", "not-a-uuid")...), 2)
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--limit", "-1"}, {"--id", "x"}, {"--older-than", "-1h"}, {"--since", "1h", "--until", "2h"}} {
		r := runRelay(t, nil, b.args(append([]string{"dlq", "list"}, bad...)...)...)
		b.check(t, r, 2)
	}
	// An unmigrated schema is named, not a SQL error.
	r = runRelay(t, nil, "dlq", "list", "--database-url", pgtest.URL(t), "--schema", "no_such_schema_herald")
	if r.code != 1 || !strings.Contains(r.stderr, "relay migrate up") {
		t.Fatalf("unmigrated schema:\n%s", r)
	}
}

func TestDLQDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(3, "orders.created")
	seq := b.query("SELECT min(seq)::text FROM " + b.tables.Outbox())
	b.exec("INSERT INTO "+b.tables.Holds()+" (key, sink, seq, until) VALUES ('k-1', 'hook', $1::bigint, 'infinity')", seq)
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic, key, available_at) VALUES ('orders.created', 'k-1', 'infinity')")
	before := b.dump()
	for _, args := range [][]string{
		{"dlq", "replay", "--all", "--dry-run"},
		{"dlq", "replay", "--topic", "orders.*", "--all-sinks", "--dry-run", "--yes"},
		{"dlq", "purge", "--all", "--dry-run"},
		{"dlq", "purge", "--older-than", "1h", "--dry-run", "--yes"},
	} {
		r := runRelay(t, nil, b.args(args...)...)
		b.check(t, r, 0)
		if !strings.Contains(r.stdout, "dry run: would") || !strings.Contains(r.stdout, " 3 dead events") || strings.Count(r.stdout, "orders.created") != 3 {
			t.Fatalf("%v:\n%s", args, r)
		}
		if after := b.dump(); after != before {
			t.Fatalf("%v changed the tables:\nbefore:\n%s\nafter:\n%s", args, before, after)
		}
	}
}

func TestDLQConfirmation(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(2, "orders.created")
	before := b.dump()
	for _, args := range [][]string{
		{"dlq", "replay", "--all"},
		{"dlq", "purge", "--all"},
		{"dlq", "replay"},
		{"dlq", "purge"},
		{"dlq", "replay", "--all", "--topic", "x", "--yes"},
		{"dlq", "purge", "--all", "--key", "k", "--yes"},
	} {
		r := runRelay(t, nil, b.args(args...)...)
		b.check(t, r, 2)
		if len(args) == 3 && !strings.Contains(r.stderr, "pass --yes") {
			t.Fatalf("%v: refusal does not say --yes:\n%s", args, r)
		}
		if after := b.dump(); after != before {
			t.Fatalf("%v changed the tables", args)
		}
	}
}

func TestConfirm(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for answer, ok := range map[string]bool{"y\n": true, "YES\n": true, " yes \n": true, "n\n": false, "\n": false, "": false, "sure\n": false} {
		err := confirm(strings.NewReader(answer), true, &out, "Replay 3 dead events?")
		if (err == nil) != ok {
			t.Errorf("answer %q: %v", answer, err)
		}
	}
	if !strings.Contains(out.String(), "Replay 3 dead events? [y/N] ") {
		t.Errorf("prompt: %q", out.String())
	}
	if err := confirm(strings.NewReader("y\n"), false, &out, "Purge?"); err == nil || !strings.Contains(err.Error(), "pass --yes") {
		t.Errorf("without a terminal: %v", err)
	}
}

func TestDLQReplayAndPurge(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(2, "orders.created")
	b.insertDead(1, "users.created")
	ids := strings.Split(b.query("SELECT string_agg(id::text, ',' ORDER BY seq) FROM "+b.tables.Outbox()), ",")
	missing := "0190a0b0-0000-7000-8000-000000000000"
	// By id, one of which is no dead letter: the other is replayed, the
	// command fails naming the missing one.
	r := runRelay(t, nil, b.args("dlq", "replay", "--id", ids[0], "--id", missing, "--yes")...)
	b.check(t, r, 1)
	if !strings.Contains(r.stdout, "replayed 1 dead events to the sinks that did not deliver them") || !strings.Contains(r.stderr, missing) {
		t.Fatalf("replay by id:\n%s", r)
	}
	if got := b.query("SELECT status || ' ' || attempts || ' ' || deliveries::text || ' ' || (last_error IS NULL) FROM "+b.tables.Outbox()+" WHERE id = $1", ids[0]); got != `pending 0 {"kafka": {"at": "2026-01-01T00:00:00Z", "state": "done", "attempts": 1}} true` {
		t.Fatalf("replayed row: %s", got)
	}
	r = runRelay(t, nil, b.args("dlq", "replay", "--topic", "orders.*", "--all-sinks", "-y")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "replayed 1 dead events to every sink") || !strings.Contains(r.stderr, "replayed 1/1 events") {
		t.Fatalf("replay --all-sinks:\n%s", r)
	}
	if got := b.query("SELECT deliveries::text FROM "+b.tables.Outbox()+" WHERE id = $1", ids[1]); got != "{}" {
		t.Fatalf("replayed to all sinks: %s", got)
	}
	r = runRelay(t, nil, b.args("dlq", "replay", "--topic", "orders.*", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "nothing to replay") {
		t.Fatalf("replay with nothing left:\n%s", r)
	}
	r = runRelay(t, nil, b.args("dlq", "purge", "--older-than", "3h", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "nothing to purge") {
		t.Fatalf("purge of nothing old enough:\n%s", r)
	}
	r = runRelay(t, nil, b.args("dlq", "purge", "--older-than", "1h", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "purged 1 dead events") {
		t.Fatalf("purge:\n%s", r)
	}
	if n := b.query("SELECT count(*)::text FROM " + b.tables.Outbox()); n != "2" {
		t.Fatalf("%s rows left, want the 2 replayed", n)
	}
}

// TestDLQHundredThousand: list, replay and purge 100,000 dead rows in
// bounded batches, with progress on stderr.
func TestDLQHundredThousand(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	const n = 100000
	b.exec(`INSERT INTO `+b.tables.Outbox()+` (topic, key, payload, status, attempts, last_error, deliveries, finished_at)
SELECT CASE WHEN i % 2 = 0 THEN 'even.t' ELSE 'odd.t' END, 'k-' || (i % 1000), '{"i": 1}', 'dead', 1, 'hook: HTTP 500',
       '{"hook": {"state": "dead", "attempts": 1, "error": "HTTP 500", "at": "2026-01-01T00:00:00Z"}}', now()
FROM generate_series(1, $1) AS i`, n)

	start := time.Now()
	r := runRelay(t, nil, b.args("dlq", "list", "--limit", "0", "--json")...)
	b.check(t, r, 0)
	var listed []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != n || listed[0].ID == "" {
		t.Fatalf("list --limit 0: %d events, %v\n%.2000s", len(listed), err, r.stderr)
	}
	if !strings.Contains(r.stderr, "listed 10000 events") || !strings.Contains(r.stderr, "listed 100000 events") {
		t.Fatalf("list progress:\n%s", r.stderr)
	}
	t.Logf("listed %d in %s", n, time.Since(start))

	start = time.Now()
	r = runRelay(t, nil, b.args("dlq", "replay", "--topic", "even.*", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, fmt.Sprintf("replayed %d dead events", n/2)) || !strings.Contains(r.stderr, fmt.Sprintf("replayed %d/%d events (100%%", n/2, n/2)) {
		t.Fatalf("replay:\n%s", r)
	}
	t.Logf("replayed %d in %s", n/2, time.Since(start))

	start = time.Now()
	r = runRelay(t, nil, b.args("dlq", "purge", "--all", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, fmt.Sprintf("purged %d dead events", n/2)) || !strings.Contains(r.stderr, fmt.Sprintf("purged %d/%d events (100%%", n/2, n/2)) {
		t.Fatalf("purge:\n%s", r)
	}
	t.Logf("purged %d in %s", n/2, time.Since(start))
	if got := b.query("SELECT count(*) FILTER (WHERE status = 'pending') || '/' || count(*) FROM " + b.tables.Outbox()); got != fmt.Sprintf("%d/%d", n/2, n/2) {
		t.Fatalf("pending/total after: %s", got)
	}
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	url, _ := dbURL(t)
	b.insertDead(2, "orders.created")
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic, created_at) VALUES ('orders.created', now() - interval '90 seconds'), ('users.created', now())")
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic) VALUES ('users.created')")
	b.exec("INSERT INTO " + b.tables.Stats() + " (minute, sink, topic, published) VALUES (date_trunc('minute', now()), 'hook', 'orders.created', 5)")

	r := runRelay(t, nil, b.args("status", "--json")...)
	b.check(t, r, 0)
	var st struct {
		Total struct {
			Pending, Dead, PublishedLastMinute int64
			Oldest                             float64 `json:"oldest_pending_age_seconds"`
		} `json:"total"`
		Topics []struct {
			Topic         string
			Pending, Dead int64
		} `json:"topics"`
		Sinks []struct {
			Sink          string
			Pending, Dead int64
			Published     int64 `json:"published_last_minute"`
		} `json:"sinks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r)
	}
	if st.Total.Pending != 3 || st.Total.Dead != 2 || st.Total.Oldest < 89 || len(st.Topics) != 2 {
		t.Fatalf("status: %+v\n%s", st, r.stdout)
	}
	if len(st.Sinks) != 1 || st.Sinks[0].Sink != "hook" || st.Sinks[0].Dead != 2 || st.Sinks[0].Published != 5 {
		t.Fatalf("sinks from deliveries: %+v", st.Sinks)
	}
	// With --config, routes attribute pending events no sink has tried.
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
sinks: [{name: hook, type: discard}, {name: audit, type: discard}]
routes:
  - topics: ["orders.*"]
    sinks: [hook, audit]
  - topics: ["*"]
    sinks: [audit]
`, url, b.tables.Schema))
	r = runRelay(t, nil, "status", "--json", "--config", cfg)
	b.check(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range st.Sinks {
		got[s.Sink] = fmt.Sprintf("%d/%d", s.Pending, s.Dead)
	}
	if got["hook"] != "1/2" || got["audit"] != "3/0" {
		t.Fatalf("sinks from routes (pending/dead): %v", got)
	}
	r = runRelay(t, nil, b.args("status")...)
	b.check(t, r, 0)
	for _, want := range []string{"3 pending, 2 dead; oldest pending 1m3", "5 published in the last minute", "TOPIC", "SINK", "orders.created"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("status lacks %q:\n%s", want, r)
		}
	}
}
