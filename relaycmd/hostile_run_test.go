package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
)

// hookRecorder is an HTTP endpoint recording every request it gets.
type hookRecorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []hookRequest
}

type hookRequest struct {
	path, id string
	body     []byte
}

func newHookRecorder(t *testing.T) *hookRecorder {
	h := &hookRecorder{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.reqs = append(h.reqs, hookRequest{path: r.URL.Path, id: r.Header.Get("webhook-id"), body: body})
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookRecorder) requests() []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookRequest(nil), h.reqs...)
}

// rowState is an event as the tests inspect it: pending in the outbox,
// queued (waiting on some sink) or dead, with its most attempts on a sink
// and its errors; gone means delivered everywhere.
type rowState struct {
	status, lastErr string
	attempts        int
	gone            bool
}

func readRow(t *testing.T, pool *pgxpool.Pool, tables migrations.Tables, id string) rowState {
	t.Helper()
	var s rowState
	var pending bool
	err := pool.QueryRow(context.Background(), `SELECT
    EXISTS (SELECT 1 FROM `+tables.Outbox()+` WHERE id = $1 AND status = 'pending'),
    (SELECT CASE WHEN count(*) = 0 THEN '' WHEN bool_or(state <> 'dead') THEN 'queued' ELSE 'dead' END
     FROM `+tables.Deliveries()+` WHERE id = $1),
    coalesce((SELECT string_agg(last_error, '; ') FROM `+tables.Deliveries()+` WHERE id = $1), ''),
    coalesce((SELECT max(attempts) FROM `+tables.Deliveries()+` WHERE id = $1), 0)`, id).
		Scan(&pending, &s.status, &s.lastErr, &s.attempts)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case pending:
		s.status = "pending"
	case s.status == "":
		return rowState{gone: true}
	}
	return s
}

// insertRaw runs an INSERT … RETURNING id::text, as an application in any
// language could.
func insertRaw(t *testing.T, pool *pgxpool.Pool, tables migrations.Tables, columns, values string, args ...any) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), "INSERT INTO "+tables.Outbox()+" ("+columns+") VALUES ("+values+") RETURNING id::text", args...).Scan(&id); err != nil {
		t.Fatalf("inserting (%s): %v", columns, err)
	}
	return id
}

func waitNoPending(t *testing.T, p *process, pool *pgxpool.Pool, tables migrations.Tables) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+tables.Outbox()+" WHERE status = 'pending') + "+
			"(SELECT count(*) FROM "+tables.Deliveries()+" WHERE state <> 'dead')").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending:\n%s", n, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHostileEvents runs rows no well-behaved producer writes through the
// relay: each is delivered or dead-lettered with a reason, the events of the
// same key after it are delivered, and nothing stays pending. Webhook URLs
// in event data are ignored.
func TestHostileEvents(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	hook := newHookRecorder(t)
	evil := newHookRecorder(t)
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s, max_attempts: 3, backoff: {initial: 50ms, max: 200ms}}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - {name: hook, type: webhook, url: %q, timeout: 5s, max_body_bytes: 4096}
routes:
  - {topics: ["ev.*"], sinks: [hook]}
`, url, tables.Schema, hook.srv.URL+"/configured"))

	ids := map[string]string{}
	add := func(name, columns, values string, args ...any) {
		ids[name] = insertRaw(t, pool, tables, columns, values, args...)
	}
	add("too large", "topic, key, payload", "'ev.big', 'k', json_build_object('blob', repeat('x', 10000))")
	add("invalid JSON", "topic, key, payload_bin, content_type", `'ev.badjson', 'k', '\xff7b6e6f74206a736f6e'::bytea, 'application/json'`)
	add("huge headers", "topic, key, payload, headers",
		"'ev.headers', 'k', '{}', (SELECT jsonb_object_agg('h' || i, repeat('v', 100)) FROM generate_series(1, 3000) i)")
	add("odd header values", "topic, key, payload, headers", `'ev.odd', 'k', '{}', '{"n": 5, "obj": {"a": [1, null]}, "s": "plain"}'`)
	add("no route", "topic, key, payload", "'nowhere.at.all', 'k', '{}'")
	evilURL := evil.srv.URL + "/stolen"
	add("URLs in data", "topic, key, payload, headers", "'ev.urls', 'k', json_build_object('url', $1::text, 'destination', $1::text, 'webhook_url', $1::text), jsonb_build_object('url', $1::text, 'destination', $1::text, 'webhook-url', $1::text, 'Host', 'evil.example')", evilURL)
	add("after", "topic, key, payload", `'ev.after', 'k', '{"last": true}'`)

	p := start(t, nil, "run", "--config", cfg)
	waitNoPending(t, p, pool, tables)

	dead := func(name, want string) {
		t.Helper()
		s := readRow(t, pool, tables, ids[name])
		if s.status != "dead" || !strings.Contains(s.lastErr, want) {
			t.Errorf("%s: want dead with %q in last_error, got %+v", name, want, s)
		}
	}
	delivered := func(name string) hookRequest {
		t.Helper()
		if s := readRow(t, pool, tables, ids[name]); !s.gone {
			t.Errorf("%s: want delivered (row deleted), got %+v", name, s)
		}
		for _, r := range hook.requests() {
			if r.id == ids[name] {
				return r
			}
		}
		t.Errorf("%s: the endpoint never received event %s", name, ids[name])
		return hookRequest{}
	}
	dead("too large", "4096")
	dead("no route", `no route matches topic "nowhere.at.all"`)
	// A payload declared JSON that is not: the envelope cannot embed it, so
	// the event is dead-lettered naming it; the key moves on.
	dead("invalid JSON", ids["invalid JSON"])
	// 3000 headers of 100 bytes do not fit the 4096-byte body limit.
	dead("huge headers", "4096")

	odd := delivered("odd header values")
	var env struct{ Headers map[string]string }
	if err := json.Unmarshal(odd.body, &env); err != nil || env.Headers["n"] != "5" || env.Headers["obj"] != `{"a": [1, null]}` || env.Headers["s"] != "plain" {
		t.Errorf("non-string header values: got %v (%v) from %s", env.Headers, err, odd.body)
	}
	urls := delivered("URLs in data")
	if urls.path != "/configured" {
		t.Errorf("event with URLs in its data was POSTed to %s, want the configured /configured", urls.path)
	}
	if n := len(evil.requests()); n != 0 {
		t.Errorf("the URL in the event's data received %d requests; it must receive none", n)
	}
	delivered("after")
	for _, r := range hook.requests() {
		if r.path != "/configured" {
			t.Errorf("a request went to %s, not the configured path", r.path)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestSinkDownIsPausedNotDead: a destination that refuses the relay's
// credentials, does not resolve or presents an untrusted certificate is
// paused — its events wait, spend no attempt and are not dead-lettered —
// and once the credentials are fixed everything is delivered.
func TestSinkDownIsPausedNotDead(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	const rightToken, wrongToken = "Right-Nats-Token-55", "Wrong-Nats-Token-66"
	ns := natstest.StartServer(t, func(o *server.Options) { o.Authorization = rightToken })
	nc := natstest.Connect(t, ns.URL(), nats.Token(rightToken))
	stream := natstest.Stream(t, nc)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the TLS endpoint with an untrusted certificate got a request")
	}))
	t.Cleanup(tlsSrv.Close)
	config := func(token string) string {
		return writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s, max_attempts: 2, sink_pause: {initial: 100ms, max: 300ms}}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - {name: bus, type: nats, url: %q, token: %q, ack_timeout: 2s}
  - {name: nodns, type: webhook, url: "http://does-not-exist.invalid/hook", timeout: 2s}
  - {name: badtls, type: webhook, url: %q, timeout: 2s}
routes:
  - {topics: ["bus.*"], sinks: [{name: bus, destination: %q}]}
  - {topics: ["dns.*"], sinks: [nodns]}
  - {topics: ["tls.*"], sinks: [badtls]}
`, url, tables.Schema, ns.URL(), token, tlsSrv.URL+"/hook", stream.Subject("{{.Key}}")))
	}
	var busIDs []string
	for i := range 3 {
		busIDs = append(busIDs, insertRaw(t, pool, tables, "topic, key, payload", "'bus.ev', 'k', json_build_object('n', $1::int)", i))
	}
	dnsID := insertRaw(t, pool, tables, "topic, key, payload", "'dns.ev', 'k', '{}'")
	tlsID := insertRaw(t, pool, tables, "topic, key, payload", "'tls.ev', 'k', '{}'")

	p := start(t, nil, "run", "--config", config(wrongToken))
	for _, sink := range []string{"bus", "nodns", "badtls"} {
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(p.output(), `"sink":"`+sink+`"`) || !paused(p.output(), sink) {
			if time.Now().After(deadline) {
				t.Fatalf("sink %s never reported down and paused:\n%s", sink, p.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Each sink's events put off (herald_events_deferred_total) more often
	// than max_attempts (2) would allow if a try of a down sink counted:
	// still no attempt spent.
	admin := adminAddress(t, p)
	for sink, events := range map[string]int{"bus": len(busIDs), "nodns": 1, "badtls": 1} {
		want := events * (2 + 2)
		deadline := time.Now().Add(30 * time.Second)
		for deferred(t, admin, sink) < want {
			if time.Now().After(deadline) {
				t.Fatalf("sink %s: %d deliveries put off within 30s, want %d:\n%s", sink, deferred(t, admin, sink), want, p.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	check := func(name, id, want string) {
		t.Helper()
		s := readRow(t, pool, tables, id)
		if s.gone || s.status != "queued" || s.attempts != 0 {
			t.Errorf("%s: want queued with 0 attempts while the sink is down, got %+v", name, s)
		}
		if want != "" && !strings.Contains(s.lastErr, want) {
			t.Errorf("%s: last_error %q does not say %q", name, s.lastErr, want)
		}
	}
	for _, id := range busIDs {
		check("bus (wrong token)", id, "")
	}
	check("webhook to a name that does not resolve", dnsID, "does-not-exist.invalid")
	check("webhook with an untrusted certificate", tlsID, "certificate")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), wrongToken) {
		t.Errorf("the token was printed:\n%s", p.output())
	}

	// The operator fixes the token: the waiting events go out, none dead.
	p = start(t, nil, "run", "--config", config(rightToken))
	deadline := time.Now().Add(20 * time.Second)
	for {
		gone := 0
		for _, id := range busIDs {
			if readRow(t, pool, tables, id).gone {
				gone++
			}
		}
		if gone == len(busIDs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events delivered after fixing the token:\n%s", gone, len(busIDs), p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	msgs := stream.Messages(t)
	if len(msgs) != len(busIDs) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(busIDs))
	}
	for i, m := range msgs {
		if got := m.Header.Get("Nats-Msg-Id"); got != busIDs[i] {
			t.Errorf("message %d is %s, want %s (in order)", i, got, busIDs[i])
		}
	}
	var dead int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+tables.Deliveries()+" WHERE state = 'dead'").Scan(&dead); err != nil || dead != 0 {
		t.Errorf("%d dead letters (%v), want none", dead, err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), rightToken) {
		t.Errorf("the token was printed:\n%s", p.output())
	}
}

// paused reports whether the log holds a "sink is down" line for sink.
// adminAddress returns the address the relay's admin server listens on,
// from its log.
func adminAddress(t *testing.T, p *process) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, line := range strings.Split(p.output(), "\n") {
			var rec struct{ Msg, Address string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "admin: listening" && rec.Address != "" {
				return rec.Address
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admin: listening line within 20s:\n%s", p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deferred returns the relay's herald_events_deferred_total for sink, over
// all topics: deliveries put off because the sink was down.
func deferred(t *testing.T, admin, sink string) int {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("reading /metrics: %d %v", resp.StatusCode, err)
	}
	var n int
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "herald_events_deferred_total{") || !strings.Contains(line, `sink="`+sink+`"`) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += int(v)
	}
	return n
}

func paused(log, sink string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "sink is down") && strings.Contains(line, `"sink":"`+sink+`"`) {
			return true
		}
	}
	return false
}

// TestNATSMaxPayload: an event larger than the server's max_payload is
// dead-lettered at once naming the limit; the next event of its key goes
// through.
func TestNATSMaxPayload(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ns := natstest.StartServer(t, func(o *server.Options) { o.MaxPayload = 2048 })
	stream := natstest.Stream(t, natstest.Connect(t, ns.URL()))
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s}
log: {level: info, format: json}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: bus, type: nats, url: %q}]
routes: [{topics: ["*"], sinks: [{name: bus, destination: %q}]}]
`, url, tables.Schema, ns.URL(), stream.Subject("events")))
	big := insertRaw(t, pool, tables, "topic, key, payload", "'big', 'k', json_build_object('blob', repeat('x', 5000))")
	small := insertRaw(t, pool, tables, "topic, key, payload", "'small', 'k', '{}'")
	p := start(t, nil, "run", "--config", cfg)
	waitNoPending(t, p, pool, tables)
	if s := readRow(t, pool, tables, big); s.status != "dead" || !strings.Contains(s.lastErr, "2048") || s.attempts != 1 {
		t.Errorf("too large for max_payload: want dead after 1 attempt naming 2048, got %+v", s)
	}
	if s := readRow(t, pool, tables, small); !s.gone {
		t.Errorf("the next event of the key: want delivered, got %+v", s)
	}
	if msgs := stream.Messages(t); len(msgs) != 1 || msgs[0].Header.Get("Nats-Msg-Id") != small {
		t.Errorf("stream holds %d messages, want only %s", len(msgs), small)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
}

// TestSecretsNeverPrinted runs the relay with every kind of secret in its
// configuration, against destinations that all fail, and checks that no
// secret appears in anything it prints.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	url, dbPassword := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	templates := t.TempDir()
	if err := os.WriteFile(filepath.Join(templates, "t.txt"), []byte("hello {{.to}}"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{
		"database password": dbPassword,
		"webhook secret":    "whsec_U2VjcmV0LVdlYmhvb2stS2V5LVRlc3Q=",
		"webhook header":    "Header-Token-Secret-9182",
		"nats token":        "Nats-Token-Secret-7365",
		"kafka sasl":        "Kafka-Sasl-Secret-5521",
		"smtp password":     "Smtp-Password-Secret-4410",
	}
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 100ms, shutdown_timeout: 5s, sink_pause: {initial: 100ms, max: 300ms}}
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:0"}
sinks:
  - {name: hook, type: webhook, url: "http://127.0.0.1:1/hook", secret: %q, headers: {Authorization: %q}, timeout: 1s}
  - {name: bus, type: nats, url: "nats://127.0.0.1:1", token: %q, ack_timeout: 1s}
  - name: log
    type: kafka
    brokers: ["127.0.0.1:1"]
    sasl: {mechanism: PLAIN, username: herald, password: %q}
  - name: mail
    type: email
    smtp: {host: 127.0.0.1, port: 1, username: herald, password: %q, tls: none}
    from: shop@example.com
    templates_dir: %q
    template: t
    subject: hi
    timeout: 1s
routes:
  - {topics: ["*"], sinks: [hook, bus, log, mail]}
`, url, tables.Schema, secrets["webhook secret"], "Bearer "+secrets["webhook header"], secrets["nats token"],
		secrets["kafka sasl"], secrets["smtp password"], templates))
	insertRaw(t, pool, tables, "topic, key, payload", `'orders', 'k', '{"to": "a@example.com"}'`)
	p := start(t, nil, "run", "--config", cfg)
	for _, sink := range []string{"hook", "bus", "log", "mail"} {
		deadline := time.Now().Add(30 * time.Second)
		for !paused(p.output(), sink) && !strings.Contains(p.output(), `"sink":"`+sink+`","key"`) {
			if time.Now().After(deadline) {
				t.Fatalf("sink %s never failed:\n%s", sink, p.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	outputs := map[string]string{"relay run": p.output()}
	r := runRelay(t, nil, "migrate", "status", "--config", cfg)
	outputs["relay migrate status"] = r.stdout + r.stderr
	// A broken configuration next to the secrets: the error must not echo them.
	bad := strings.Replace(readFile(t, cfg), "timeout: 1s}", "timeout: 1 s}", 1)
	r = runRelay(t, nil, "run", "--config", writeConfig(t, bad))
	outputs["relay run (bad config)"] = r.stdout + r.stderr
	if r.code != 2 {
		t.Errorf("bad config: exit %d, want 2:\n%s", r.code, r)
	}
	for what, out := range outputs {
		for name, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("%s printed the %s:\n%s", what, name, out)
			}
		}
	}
}
