package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

// dlqBundle is a migrated schema and the flags that point the CLI at it.
type dlqBundle struct {
	pool     *pgxpool.Pool
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
		pool:     pool,
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

// insertDead writes n events of a topic, keys k-1 to k-n, each dead on
// sink (3 attempts, died 2 hours ago), straight into the deliveries table
// as a relay would leave them.
func (b *dlqBundle) insertDead(n int, topic, sink string) {
	b.exec(`INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, headers, created_at,
    state, attempts, last_error, dead_at)
SELECT $3, s.seq, hashtext('k-' || s.i) & 63, gen_random_uuid(), $1, 'k-' || s.i, '{"total": 42, "items": [1, 2]}',
       '{"x-tenant": "acme"}', now() - interval '3 hours', 'dead', 3, 'HTTP 500 Internal Server Error', now() - interval '2 hours'
FROM (SELECT i, nextval(pg_get_serial_sequence($4, 'seq')) AS seq FROM generate_series(1, $2) AS i) s`, topic, n, sink, b.tables.Outbox())
}

// insert writes one delivery of a new event (state ready, waiting or dead)
// and returns the event's id and seq; key may be empty.
func (b *dlqBundle) insert(topic, key, sink, state, lastError string) (string, string) {
	out := b.query(`WITH e AS (SELECT nextval(pg_get_serial_sequence($1, 'seq')) AS seq, gen_random_uuid() AS id)
INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, created_at, state, next_at, last_error, dead_at)
SELECT $2, e.seq, hashtext(coalesce(nullif($4, ''), e.id::text)) & 63, e.id, $3, nullif($4, ''), '{"n": 1}', now() - interval '5 minutes',
       $5, CASE WHEN $5 = 'ready' THEN now() END, nullif($6, ''), CASE WHEN $5 = 'dead' THEN now() END
FROM e RETURNING id::text || ' ' || seq`, b.tables.Outbox(), sink, topic, key, state, lastError)
	id, seq, _ := strings.Cut(out, " ")
	return id, seq
}

// dump is the outbox and deliveries tables as text.
func (b *dlqBundle) dump() string {
	return b.query("SELECT coalesce(string_agg(o::text, E'\\n' ORDER BY seq), '') FROM "+b.tables.Outbox()+" o") + "\n--\n" +
		b.query("SELECT coalesce(string_agg(d::text, E'\\n' ORDER BY seq, sink), '') FROM "+b.tables.Deliveries()+" d")
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
	b.insertDead(2, "orders.created", "hook")
	b.insertDead(1, "users_created", "hook")
	b.insert("usersXcreated", "", "", "dead", "no route matches topic")

	r := runRelay(t, nil, b.args("dlq", "list")...)
	b.check(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "SINK") ||
		!regexp.MustCompile(`\s+hook\s+orders\.created\s+k-1\s.*HTTP 500`).MatchString(lines[1]) || !strings.Contains(lines[4], "(routing)") {
		t.Fatalf("table:\n%s", r)
	}

	var listed []map[string]any
	r = runRelay(t, nil, b.args("dlq", "list", "--json", "--topic", "users_created")...)
	b.check(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 || listed[0]["topic"] != "users_created" || listed[0]["sink"] != "hook" {
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
	for _, want := range []string{"id:            " + id, "status:        dead", "x-tenant: acme", "max_attempts:  relay default",
		"\"total\": 42", "\"items\": ["} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("show lacks %q:\n%s", want, r)
		}
	}
	if !regexp.MustCompile(`hook\s+dead\s+3\s+-\s+\S+\s+\S+\s+-\s+-\s+HTTP 500 Internal Server Error`).MatchString(r.stdout) {
		t.Fatalf("show lacks the dead letter on hook:\n%s", r)
	}
	r = runRelay(t, nil, b.args("dlq", "show", id, "--json")...)
	b.check(t, r, 0)
	var shown map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &shown); err != nil || shown["id"] != id || shown["payload"].(map[string]any)["total"] != 42.0 {
		t.Fatalf("show --json: %v\n%s", err, r)
	}
	// A delivery waiting in its key's queue names the head it waits behind.
	headID, headSeq := b.insert("orders.paid", "q", "hook", "ready", "HTTP 503")
	waitID, waitSeq := b.insert("orders.paid", "q", "hook", "waiting", "")
	b.exec(`INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, created_at, state, stops_key, attempts, last_error, dead_at)
SELECT 'mail', seq, lane, id, topic, key, payload, created_at, 'dead', true, 1, '550 mailbox unavailable', now()
FROM `+b.tables.Deliveries()+` WHERE seq = $1`, waitSeq)
	r = runRelay(t, nil, b.args("dlq", "show", waitID)...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "status:        queued") ||
		!regexp.MustCompile(`hook\s+waiting\s+0\s+-\s+\S+\s+-\s+-\s+seq `+headSeq+` \(`+headID+`, ready\)`).MatchString(r.stdout) ||
		!regexp.MustCompile(`mail\s+dead\s+1\s+-\s+\S+\s+\S+\s+yes\s+-\s+550 mailbox unavailable`).MatchString(r.stdout) {
		t.Fatalf("show of a waiting delivery:\n%s", r)
	}
	r = runRelay(t, nil, b.args("dlq", "show", headID)...)
	b.check(t, r, 0)
	if !regexp.MustCompile(`hook\s+ready\s+0\s+20\d\d-\S+\s+\S+\s+-\s+-\s+-\s+HTTP 503`).MatchString(r.stdout) {
		t.Fatalf("show of a head:\n%s", r)
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
	b.insertDead(3, "orders.created", "hook")
	b.insert("orders.created", "k-1", "mail", "ready", "")
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic, key) VALUES ('orders.created', 'k-1')")
	before := b.dump()
	for _, args := range [][]string{
		{"dlq", "replay", "--all", "--dry-run"},
		{"dlq", "replay", "--topic", "orders.*", "--all-sinks", "--dry-run", "--yes"},
		{"dlq", "purge", "--all", "--dry-run"},
		{"dlq", "purge", "--older-than", "1h", "--dry-run", "--yes"},
	} {
		r := runRelay(t, nil, b.args(args...)...)
		b.check(t, r, 0)
		if !strings.Contains(r.stdout, "dry run: would") || !strings.Contains(r.stdout, " 3 dead letters") || strings.Count(r.stdout, "orders.created") != 3 {
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
	b.insertDead(2, "orders.created", "hook")
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
	b.insertDead(2, "orders.created", "hook")
	b.insertDead(1, "users.created", "hook")
	ids := strings.Split(b.query("SELECT string_agg(id::text, ',' ORDER BY seq) FROM "+b.tables.Deliveries()), ",")
	missing := "0190a0b0-0000-7000-8000-000000000000"
	// By id, one of which has no dead letter: the other is replayed, the
	// command fails naming the missing one.
	r := runRelay(t, nil, b.args("dlq", "replay", "--id", ids[0], "--id", missing, "--yes")...)
	b.check(t, r, 1)
	if !strings.Contains(r.stdout, "replayed 1 dead letter into their sinks' queues") || !strings.Contains(r.stderr, missing) {
		t.Fatalf("replay by id:\n%s", r)
	}
	state := "SELECT coalesce(string_agg(sink || ' ' || state || ' ' || attempts || ' ' || (last_error IS NULL), ', ' ORDER BY sink), 'none') FROM " +
		b.tables.Deliveries() + " WHERE id = $1"
	if got := b.query(state, ids[0]); got != "hook ready 0 true" {
		t.Fatalf("replayed dead letter: %s", got)
	}
	r = runRelay(t, nil, b.args("dlq", "replay", "--topic", "orders.*", "--all-sinks", "-y")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, "replayed 1 dead letter through the routing step") || !strings.Contains(r.stderr, "replayed 1/1 dead letter") {
		t.Fatalf("replay --all-sinks:\n%s", r)
	}
	if got := b.query(state, ids[1]); got != " ready 0 true" {
		t.Fatalf("replayed through the routing step: %s", got)
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
	if !strings.Contains(r.stdout, "purged 1 dead letter") {
		t.Fatalf("purge:\n%s", r)
	}
	if got := b.query(state, ids[2]); got != "none" {
		t.Fatalf("purged dead letter: %s", got)
	}
	if n := b.query("SELECT count(*)::text FROM " + b.tables.Deliveries()); n != "2" {
		t.Fatalf("%s deliveries left, want the 2 replayed", n)
	}
}

// TestDLQTwentyThousand: list, replay and purge 20,000 dead letters in
// bounded batches, with progress on stderr. (relay/deadletter's
// TestHundredThousand covers the library at 100,000.)
func TestDLQTwentyThousand(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	const n = 20000
	b.exec(`INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload, created_at, state, attempts, last_error, dead_at)
SELECT 'hook', s.seq, hashtext('k-' || (s.i % 1000)) & 63, gen_random_uuid(), CASE WHEN s.i % 2 = 0 THEN 'even.t' ELSE 'odd.t' END,
       'k-' || (s.i % 1000), '{"i": 1}', now(), 'dead', 1, 'HTTP 500', now()
FROM (SELECT i, nextval(pg_get_serial_sequence($1, 'seq')) AS seq FROM generate_series(1, $2) AS i) s`, b.tables.Outbox(), n)

	start := time.Now()
	r := runRelay(t, nil, b.args("dlq", "list", "--limit", "0", "--json")...)
	b.check(t, r, 0)
	var listed []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != n || listed[0].ID == "" {
		t.Fatalf("list --limit 0: %d dead letters, %v\n%.2000s", len(listed), err, r.stderr)
	}
	if !strings.Contains(r.stderr, "listed 10000 dead letters") || !strings.Contains(r.stderr, "listed 20000 dead letters") {
		t.Fatalf("list progress:\n%s", r.stderr)
	}
	t.Logf("listed %d in %s", n, time.Since(start))

	start = time.Now()
	r = runRelay(t, nil, b.args("dlq", "replay", "--topic", "even.*", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, fmt.Sprintf("replayed %d dead letters", n/2)) || !strings.Contains(r.stderr, fmt.Sprintf("replayed %d/%d dead letters (100%%", n/2, n/2)) {
		t.Fatalf("replay:\n%s", r)
	}
	t.Logf("replayed %d in %s", n/2, time.Since(start))

	start = time.Now()
	r = runRelay(t, nil, b.args("dlq", "purge", "--all", "--yes")...)
	b.check(t, r, 0)
	if !strings.Contains(r.stdout, fmt.Sprintf("purged %d dead letters", n/2)) || !strings.Contains(r.stderr, fmt.Sprintf("purged %d/%d dead letters (100%%", n/2, n/2)) {
		t.Fatalf("purge:\n%s", r)
	}
	t.Logf("purged %d in %s", n/2, time.Since(start))
	if got := b.query("SELECT count(*) FILTER (WHERE state <> 'dead') || '/' || count(*) FROM " + b.tables.Deliveries()); got != fmt.Sprintf("%d/%d", n/2, n/2) {
		t.Fatalf("queued/total after: %s", got)
	}
}

// TestDLQReplayWhileEventsDie: events keep dying while dlq replay runs
// (a sink still refusing them), as in the MariaDB demo that printed
// "replayed 6/5 dead letters (120 %)". The replay changes what it counted
// (and one dead before the count whose transaction committed after it,
// which raises the count): its progress never passes 100 %, and the dead
// letters that died meanwhile are still dead afterwards.
func TestDLQReplayWhileEventsDie(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	b.insertDead(2500, "orders.created", "hook") // three batches
	type dying struct {
		n   int
		err error
	}
	stop, inserted := make(chan struct{}), make(chan dying)
	go func() {
		var d dying
		defer func() { inserted <- d }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, d.err = b.pool.Exec(context.Background(), `INSERT INTO `+b.tables.Deliveries()+` (sink, seq, lane, id, topic, payload, created_at, state, last_error, dead_at)
SELECT 'hook', nextval(pg_get_serial_sequence($1, 'seq')), 0, gen_random_uuid(), 'orders.created', '{}', now(), 'dead', 'HTTP 400 Bad Request', now()`,
				b.tables.Outbox()); d.err != nil {
				return
			}
			d.n++
		}
	}()
	p := start(t, nil, b.args("dlq", "replay", "--all", "--yes")...)
	<-p.done
	close(stop)
	d := <-inserted
	if d.err != nil {
		t.Fatalf("killing events during the replay: %v", d.err)
	}
	died := d.n
	if p.code != 0 {
		t.Fatalf("dlq replay: exit %d\n%s", p.code, p.output())
	}
	progress := regexp.MustCompile(`replayed (\d+)/(\d+) dead letters \((\d+)%`)
	lines := progress.FindAllStringSubmatch(p.output(), -1)
	if len(lines) == 0 {
		t.Fatalf("no progress:\n%s", p.output())
	}
	var total string
	for _, m := range lines {
		var done, of, pct int
		fmt.Sscan(m[1]+" "+m[2]+" "+m[3], &done, &of, &pct)
		if done > of || pct > 100 {
			t.Fatalf("progress past what was counted: %q\n%s", m[0], p.output())
		}
		total = m[2]
	}
	if !strings.Contains(p.output(), "replayed "+total+" dead letters into their sinks' queues") {
		t.Fatalf("the final count is not the planned %s:\n%s", total, p.output())
	}
	// The planned ones were replayed; those that died after the count
	// were left dead.
	left := b.query("SELECT count(*)::text FROM " + b.tables.Deliveries() + " WHERE state = 'dead'")
	if want := fmt.Sprint(2500 + died - mustAtoi(t, total)); left != want || died == 0 {
		t.Fatalf("%s dead letters left, want %s (%d died during the command, %s replayed)", left, want, died, total)
	}
	t.Logf("%d dead letters died during the replay of %s", died, total)
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	b := newDLQBundle(t)
	url, _ := dbURL(t)
	b.insertDead(2, "orders.created", "hook")
	b.insert("orders.created", "k-9", "hook", "ready", "HTTP 503")
	b.exec("UPDATE " + b.tables.Deliveries() + " SET attempts = 1 WHERE key = 'k-9'") // its first attempt failed
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic, created_at) VALUES ('orders.created', now() - interval '90 seconds'), ('users.created', now())")
	b.exec("INSERT INTO " + b.tables.Outbox() + " (topic) VALUES ('users.created')")
	// The relays count deliveries by topic pattern (relay.metrics_topics).
	b.exec("INSERT INTO " + b.tables.Stats() + " (minute, sink, topic, published) VALUES (date_trunc('minute', now()), 'hook', 'orders.*', 5)")

	r := runRelay(t, nil, b.args("status", "--json")...)
	b.check(t, r, 0)
	var st struct {
		Total struct {
			Pending, Queued, Dead int64
			Oldest                float64 `json:"oldest_pending_age_seconds"`
			OldestQueued          float64 `json:"oldest_queued_age_seconds"`
		} `json:"total"`
		Delivered int64 `json:"delivered_last_minute"`
		Topics    []struct {
			Topic                 string
			Pending, Queued, Dead int64
		} `json:"topics"`
		Sinks []struct {
			Sink, State                     string
			Pending, Queued, Dead, Retrying int64
			Delivered                       int64 `json:"delivered_last_minute"`
		} `json:"sinks"`
		Patterns []struct {
			Pattern   string `json:"topic_pattern"`
			Delivered int64  `json:"delivered_last_minute"`
		} `json:"topic_patterns"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r)
	}
	if st.Total.Pending != 3 || st.Total.Queued != 1 || st.Total.Dead != 2 || st.Total.Oldest < 89 || st.Total.OldestQueued < 299 ||
		st.Delivered != 5 || len(st.Topics) != 2 {
		t.Fatalf("status: %+v\n%s", st, r.stdout)
	}
	if len(st.Sinks) != 1 || st.Sinks[0].Sink != "hook" || st.Sinks[0].Pending != 0 || st.Sinks[0].Queued != 1 || st.Sinks[0].Dead != 2 ||
		st.Sinks[0].Delivered != 5 || st.Sinks[0].Retrying != 1 || st.Sinks[0].State != "retrying" {
		t.Fatalf("sinks without routes: %+v", st.Sinks)
	}
	if len(st.Patterns) != 1 || st.Patterns[0].Pattern != "orders.*" || st.Patterns[0].Delivered != 5 {
		t.Fatalf("deliveries by topic pattern: %+v", st.Patterns)
	}
	// With --config, routes attribute the pending events to sinks.
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
		got[s.Sink] = fmt.Sprintf("%d/%d/%d", s.Pending, s.Queued, s.Dead)
	}
	if got["hook"] != "1/1/2" || got["audit"] != "3/0/0" {
		t.Fatalf("sinks from routes (pending/queued/dead): %v", got)
	}
	r = runRelay(t, nil, b.args("status")...)
	b.check(t, r, 0)
	for _, want := range []string{"3 pending, 1 queued, 2 dead; oldest pending 1m3", "oldest queued 5m",
		"5 deliveries in the last minute (one per event and sink)", "OLDEST QUEUED", "orders.created"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("status lacks %q:\n%s", want, r)
		}
	}
	// Three tables: topics (what waits), sinks (state, what waits, the
	// last minute), and the deliveries by topic pattern; a pattern is
	// never a row of the topics' table.
	for _, table := range []struct{ header, row string }{
		{`TOPIC\s+PENDING\s+QUEUED\s+DEAD\s+OLDEST PENDING\s+OLDEST QUEUED`, `orders\.created\s+1\s+1\s+2\s`},
		{`SINK\s+STATE\s+PENDING\s+QUEUED\s+RETRYING\s+DEAD\s+DEAD 1M\s+OLDEST PENDING\s+OLDEST QUEUED\s+DELIVERED 1M`,
			`hook\s+retrying\s+0\s+1\s+1\s+2\s+0\s+-\s+5m\S*\s+5`},
		{`TOPIC PATTERN\s+DELIVERED 1M`, `orders\.\*\s+5`},
	} {
		if !regexp.MustCompile(`(?m)^\s*` + table.header + `\s*\n(?:.*\n)*?\s*` + table.row).MatchString(r.stdout) {
			t.Errorf("status lacks the table %s with a row %s:\n%s", table.header, table.row, r.stdout)
		}
	}
	if regexp.MustCompile(`(?m)^\s*orders\.\*\s+\d+\s+\d+`).MatchString(r.stdout) {
		t.Errorf("a topic pattern is a row of a backlog table:\n%s", r.stdout)
	}
}
