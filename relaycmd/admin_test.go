package relaycmd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	neturl "net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
)

// TestRunOperations runs a relay with a webhook secret, a database password
// and an admin token: the admin server, metrics, dead-letter API and OTLP
// export work, and no output (logs, /metrics, relay status) holds a secret.
func TestRunOperations(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ctx := context.Background()

	key := make([]byte, 24)
	_, _ = rand.Read(key)
	hookSecret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	const adminToken = "Admin-Token-7f3a9c"

	var hookMu sync.Mutex
	var hookBodies []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hookMu.Lock()
		hookBodies = append(hookBodies, string(body)+" "+fmt.Sprint(r.Header))
		hookMu.Unlock()
		if strings.Contains(string(body), "refuse-me") {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
	}))
	defer hook.Close()
	var spansPosted atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" && r.Method == "POST" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			spansPosted.Add(1)
		}
	}))
	defer collector.Close()

	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
relay: {lease: 5s, poll_interval: 50ms, shutdown_timeout: 5s, metrics_topics: [orders.created, orders.paid, users.*]}
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:0", token: "${ADMIN_TOKEN}"}
tracing: {otlp_endpoint: "%s/v1/traces"}
sinks:
  - name: hook
    type: webhook
    url: %s
    secret: "${HOOK_SECRET}"
    permanent_on: [422]
routes: [{topics: ["*"], sinks: [hook]}]
`, url, tables.Schema, collector.URL, hook.URL))
	env := []string{"ADMIN_TOKEN=" + adminToken, "HOOK_SECRET=" + hookSecret}
	if _, err := pool.Exec(ctx, "INSERT INTO "+tables.Outbox()+` (topic, key, payload) VALUES
  ('orders.created', 'o-1', '{"n": 1}'), ('orders.created', 'o-2', '"refuse-me"'), ('orders.paid', 'o-1', '{"n": 2}'),
  ('orders.paid', 'o-3', '"refuse-me"'), ('users.created', NULL, '{"n": 3}')`); err != nil {
		t.Fatal(err)
	}
	p := start(t, env, "run", "--config", cfg)
	line := p.waitLine(t, p.stderr, "admin: listening", 20*time.Second)
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("log line is not JSON: %s", line)
	}
	base := "http://" + rec["address"].(string)
	if _, _, err := net.SplitHostPort(rec["address"].(string)); err != nil || rec["dlq_auth"] != true {
		t.Fatalf("listening line: %s", line)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pending, dead int
		if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+tables.Outbox()+"), (SELECT count(*) FROM "+tables.Deliveries()+" WHERE state = 'dead')").Scan(&pending, &dead); err != nil {
			t.Fatal(err)
		}
		if pending == 0 && dead == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending, %d dead:\n%s", pending, dead, p.output())
		}
		time.Sleep(50 * time.Millisecond)
	}

	get := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var outputs []string
	if code, body := get("GET", "/healthz", "", ""); code != 200 {
		t.Fatalf("healthz %d %s", code, body)
	}
	if code, body := get("GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
	code, metricsBody := get("GET", "/metrics", "", "")
	outputs = append(outputs, metricsBody)
	for _, want := range []string{
		`herald_events_published_total{sink="hook",topic="orders.created"} 1`,
		`herald_events_published_total{sink="hook",topic="users.*"} 1`,
		`herald_delivery_attempts_failed_total{sink="hook",topic="orders.paid"} 1`,
		`herald_dead_letters_total{sink="hook",topic="orders.created"} 1`,
		`herald_build_info{go_version="`,
		`version="` + testVersion + `"} 1`,
		"go_goroutines ",
	} {
		if code != 200 || !strings.Contains(metricsBody, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(metricsBody, "herald_mysql_history_list_length") {
		t.Errorf("/metrics of a relay on PostgreSQL has the MySQL gauge")
	}
	for _, tok := range []string{"", "wrong"} {
		if code, body := get("GET", "/dlq", tok, ""); code != 401 {
			t.Fatalf("GET /dlq with token %q: %d %s", tok, code, body)
		}
	}
	code, body := get("GET", "/dlq?topic=orders.*", adminToken, "")
	outputs = append(outputs, body)
	var listed []map[string]any
	if err := json.Unmarshal([]byte(body), &listed); code != 200 || err != nil || len(listed) != 2 {
		t.Fatalf("GET /dlq: %d %s", code, body)
	}
	code, body = get("POST", "/dlq/replay", adminToken, `{"topic": "orders.paid", "dry_run": true}`)
	if code != 200 || !strings.Contains(body, `"count": 1`) {
		t.Fatalf("replay dry run: %d %s", code, body)
	}
	code, body = get("GET", "/dlq/"+listed[0]["id"].(string), adminToken, "")
	outputs = append(outputs, body)
	if code != 200 || !strings.Contains(body, "422") {
		t.Fatalf("GET /dlq/{id}: %d %s", code, body)
	}

	// The console: the login form first, then, signed in with the token,
	// the overview of the configured sink and the dead letters.
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("GET /ui/ without a session: %d to %q, want the login form", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, err = browser.PostForm(base+"/ui/login", neturl.Values{"token": {adminToken}, "next": {"/ui/dead"}}); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for path, want := range map[string]string{"/ui/": `id="sink-hook"`, "/ui/dead?topic=orders.*": `<strong id="match-count">2</strong>`} {
		resp, err := browser.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		outputs = append(outputs, string(b))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Fatalf("GET %s signed in: %d, want %s in:\n%s", path, resp.StatusCode, want, b)
		}
	}

	st := runRelay(t, env, "status", "--config", cfg)
	if st.code != 0 || !strings.Contains(st.stdout, "2 dead") || !regexp.MustCompile(`(?m)^\S+\s+2\s+\S+\s+[0-9a-f]{16}\s+yes\s+-$`).MatchString(st.stdout) {
		t.Fatalf("relay status (want the relay, its 2 workers, its configuration, claiming, no sink paused):\n%s", st)
	}
	outputs = append(outputs, st.stdout, st.stderr)
	stJSON := runRelay(t, env, "status", "--json", "--config", cfg)
	outputs = append(outputs, stJSON.stdout, stJSON.stderr)

	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output())
	}
	logs := p.output()
	outputs = append(outputs, logs)
	if spansPosted.Load() == 0 {
		t.Errorf("no spans reached the OTLP collector")
	}
	// The webhook did receive the secret-signed requests (the secret is in
	// use), yet no output carries a secret.
	hookMu.Lock()
	if len(hookBodies) < 5 || !strings.Contains(strings.Join(hookBodies, "\n"), "Webhook-Signature") {
		t.Errorf("webhook requests: %d", len(hookBodies))
	}
	hookMu.Unlock()
	secretB64 := strings.TrimPrefix(hookSecret, "whsec_")
	for i, out := range outputs {
		for name, secret := range map[string]string{"database password": password, "admin token": adminToken, "webhook secret": secretB64} {
			if strings.Contains(out, secret) {
				t.Errorf("output %d holds the %s:\n%s", i, name, out)
			}
		}
	}
	// Every log line about an event names the event, its topic and sink.
	eventLines := 0
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "relay: event dead-lettered") {
			continue
		}
		eventLines++
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		if !regexp.MustCompile(`^[0-9a-f-]{36}$`).MatchString(fmt.Sprint(rec["event_id"])) || rec["topic"] == nil || rec["sink"] != "hook" {
			t.Errorf("event log line lacks event_id, topic or sink: %s", line)
		}
	}
	if eventLines != 2 {
		t.Errorf("%d lines about dead letters, want 2:\n%s", eventLines, logs)
	}
}

func TestRunAdminExposedWithoutToken(t *testing.T) {
	t.Parallel()
	url, password := dbURL(t)
	for listen, want := range map[string]string{
		"0.0.0.0:9090": "admin.token: required when admin.listen (0.0.0.0:9090) is not a loopback address",
		":0":           "admin.token: required",
		"nope":         "admin.listen:",
	} {
		cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q}
admin: {listen: %q}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`, url, listen))
		r := runRelay(t, nil, "run", "--config", cfg)
		if r.code != 2 || !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, password) {
			t.Fatalf("listen %s: want exit 2 and %q:\n%s", listen, want, r)
		}
	}
}

func TestRunAdminPortInUse(t *testing.T) {
	t.Parallel()
	url, _ := dbURL(t)
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := writeConfig(t, fmt.Sprintf(`
database: {url: %q, schema: %s}
admin: {listen: %q}
sinks: [{name: console, type: stdout}]
routes: [{topics: ["*"], sinks: [console]}]
`, url, tables.Schema, ln.Addr().String()))
	r := runRelay(t, nil, "run", "--config", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, "admin server: listening on "+ln.Addr().String()) {
		t.Fatalf("want exit 1 naming the address in use:\n%s", r)
	}
}
