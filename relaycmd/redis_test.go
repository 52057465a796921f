package relaycmd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/redistest"
)

// redisRunConfig is a relay configuration publishing every topic to the
// Redis stream prefix+topic, plus extra routes.
func redisRunConfig(t *testing.T, dbURL, schema, redisURL, prefix, extraRoutes string) string {
	return writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s}
log: {level: info, format: json}
sinks:
  - name: streams
    type: redis
    url: %q
    max_len: 100000
routes:
  - topics: ["*"]
    sinks: [{name: streams, destination: "%s{{.Topic}}"}]
%s`, dbURL, schema, redisURL, prefix, extraRoutes))
}

// TestRunDeliversToRedis runs the built relay with a redis sink against
// the real PostgreSQL and Redis: rows become stream entries in key order,
// with their id, key, headers and payload.
func TestRunDeliversToRedis(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	redisURL := redistest.URL(t)
	admin := redistest.Client(t, redisURL)
	prefix := redistest.Prefix(t, admin)
	ctx := context.Background()
	var want []string
	for i := range 20 {
		var id string
		err := pool.QueryRow(ctx, "INSERT INTO "+tables.Outbox()+` (topic, key, payload, headers) VALUES ('orders', $1, $2, '{"tenant": "acme"}') RETURNING id::text`,
			fmt.Sprintf("order-%d", i%3), fmt.Sprintf(`{"n": %d}`, i)).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	p := start(t, nil, "run", "--config", redisRunConfig(t, url, tables.Schema, redisURL, prefix, ""))
	stream := prefix + "orders"
	deadline := time.Now().Add(30 * time.Second)
	for len(redistest.Entries(t, admin, stream)) < len(want) {
		if time.Now().After(deadline) {
			t.Fatalf("stream %s holds %d entries after 30s, want %d:\n%s", stream, len(redistest.Entries(t, admin, stream)), len(want), p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	byKey := map[string][]string{}
	for _, m := range redistest.Entries(t, admin, stream) {
		id, key := m.Values["id"].(string), m.Values["key"].(string)
		byKey[key] = append(byKey[key], id)
		if m.Values["headers"] != `{"tenant":"acme"}` || m.Values["topic"] != "orders" || !strings.HasPrefix(m.Values["payload"].(string), `{"n": `) {
			t.Fatalf("entry %v", m.Values)
		}
	}
	for i, id := range want {
		key := fmt.Sprintf("order-%d", i%3)
		if !slices.Contains(byKey[key], id) {
			t.Fatalf("event %s of key %s missing from the stream", id, key)
		}
	}
	for key, ids := range byKey {
		var inOrder []string
		for i, id := range want {
			if fmt.Sprintf("order-%d", i%3) == key {
				inOrder = append(inOrder, id)
			}
		}
		if !slices.Equal(ids, inOrder) {
			t.Fatalf("key %s: stream order %v, want %v", key, ids, inOrder)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), password) {
		t.Fatalf("the password was printed:\n%s", p.output())
	}
}

// TestConfigCheckRedis: relay config check connects to Redis, fails
// naming a fixed destination key that is not a stream or an unreachable
// server (without its password), and refuses a bad setting with exit 2.
func TestConfigCheckRedis(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	redisURL := redistest.URL(t)
	admin := redistest.Client(t, redisURL)
	prefix := redistest.Prefix(t, admin)
	if err := admin.Set(context.Background(), prefix+"taken", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
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
		if strings.Contains(r.stdout+r.stderr, "s3cr3t") {
			t.Fatalf("the Redis password was printed:\n%s", r)
		}
	}
	fixed := fmt.Sprintf("  - topics: [\"audit\"]\n    sinks: [{name: streams, destination: %q}]\n", prefix+"taken")
	check(runRelay(t, nil, "config", "check", "--config", redisRunConfig(t, url, tables.Schema, redisURL, prefix, "")), 0,
		"sink streams (redis): ok")
	check(runRelay(t, nil, "config", "check", "--config", redisRunConfig(t, url, tables.Schema, redisURL, prefix, fixed)), 1,
		"sink streams (redis): FAILED", prefix+"taken", "holds a string, not a stream")
	dead := "redis://herald:s3cr3t@" + closedPort(t) + "/0"
	check(runRelay(t, nil, "config", "check", "--config", redisRunConfig(t, url, tables.Schema, dead, prefix, "")), 1,
		"sink streams (redis): FAILED", "connection refused")
	bad := strings.Replace(readFile(t, redisRunConfig(t, url, tables.Schema, redisURL, prefix, "")), "max_len: 100000", "max_len: -1", 1)
	check(runRelay(t, nil, "config", "check", "--config", writeConfig(t, bad)), 2, "sinks[0] (streams).max_len: -1 must not be negative")
}

// TestREADMERedisExample runs relay config check on docs/sinks.md's Redis
// sink example (with a database section added) against the machine's
// Redis, with REDIS_URL set as a deployment would.
func TestREADMERedisExample(t *testing.T) {
	t.Parallel()
	text := doc(t, "sinks.md")
	at := strings.Index(text, "\n## Redis Streams (`type: redis`")
	if at < 0 {
		t.Fatal("docs/sinks.md: no Redis Streams section")
	}
	block := fencedBlock.FindStringSubmatch(text[at:])
	if block == nil || block[1] != "yaml" || !strings.Contains(block[2], "type: redis") {
		t.Fatal("docs/sinks.md: the Redis Streams section does not start with a YAML example")
	}
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	config := writeConfig(t, fmt.Sprintf("database: {url: %q, schema: %s}\n", url, tables.Schema)+block[2])
	r := runRelay(t, []string{"REDIS_URL=" + redistest.URL(t)}, "config", "check", "--config", config)
	if r.code != 0 || !strings.Contains(r.stdout, "sink streams (redis): ok") || !strings.Contains(r.stdout, "events:{{.Topic}}") {
		t.Fatalf("relay config check on docs/sinks.md's Redis example:\n%s", r)
	}
}
