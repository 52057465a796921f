package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/admin"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/metrics"
	"github.com/heraldhq/herald/sinks"
)

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "[::1]:9090": true, "localhost:80": true, "127.1.2.3:1": true,
		"0.0.0.0:9090": false, ":9090": false, "10.0.0.5:9090": false, "[::]:9090": false, "admin.internal:9090": false,
	} {
		got, err := admin.IsLoopback(addr)
		if err != nil || got != want {
			t.Errorf("IsLoopback(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	for _, bad := range []string{"9090", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"} {
		if _, err := admin.IsLoopback(bad); err == nil {
			t.Errorf("IsLoopback(%q): no error", bad)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  admin.Config
		want string
	}{
		{admin.Config{Listen: "0.0.0.0:9090"}, "admin.token: required when admin.listen (0.0.0.0:9090) is not a loopback address"},
		{admin.Config{Listen: ":9090"}, "admin.token: required"},
		{admin.Config{Listen: "nope"}, "admin.listen:"},
		{admin.Config{Listen: "127.0.0.1:1", ReadyPauseThreshold: -time.Second}, "admin.ready_pause_threshold"},
		{admin.Config{Listen: "0.0.0.0:9090", Token: "t"}, ""},
		{admin.Config{Listen: "127.0.0.1:9090"}, ""},
	} {
		err := c.cfg.WithDefaults().Validate()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	// New refuses it too: a library user cannot expose the API by mistake.
	if _, err := admin.New(admin.Config{Listen: "0.0.0.0:0"}, admin.Deps{}); err == nil || !strings.Contains(err.Error(), "admin.token") {
		t.Fatalf("New exposed without token: %v", err)
	}
}

type testBundle struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	store  *deadletter.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.Pool(t)
	tables := pgtest.Schema(t, pool)
	store, err := deadletter.New(pool, tables)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, tables: tables, store: store}
}

// serve starts the admin server on a free loopback port and returns its
// base URL.
func serve(t *testing.T, cfg admin.Config, deps admin.Deps) string {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := admin.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

type response struct {
	code int
	body string
	hdr  http.Header
}

func call(t *testing.T, method, url, token, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, string(b), resp.Header}
}

type downDB struct{}

func (downDB) Ping(ctx context.Context) error {
	<-ctx.Done() // a database that does not answer
	return ctx.Err()
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	var mu sync.Mutex
	paused := map[string]time.Time{}
	pausedSinks := func() map[string]time.Time {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]time.Time{}
		for k, v := range paused {
			out[k] = v
		}
		return out
	}
	base := serve(t, admin.Config{ReadyPauseThreshold: time.Minute}, admin.Deps{DB: tb.pool, DeadLetters: tb.store, PausedSinks: pausedSinks})
	if r := call(t, "GET", base+"/healthz", "", ""); r.code != 200 || !strings.Contains(r.body, `"ok"`) {
		t.Fatalf("healthz: %+v", r)
	}
	if r := call(t, "GET", base+"/readyz", "", ""); r.code != 200 || !strings.Contains(r.body, `"ready": true`) {
		t.Fatalf("readyz: %+v", r)
	}
	mu.Lock()
	paused["hook"] = time.Now().Add(-10 * time.Second)
	mu.Unlock()
	if r := call(t, "GET", base+"/readyz", "", ""); r.code != 200 || !strings.Contains(r.body, `"hook"`) {
		t.Fatalf("readyz with a sink paused briefly: %+v", r)
	}
	mu.Lock()
	paused["hook"] = time.Now().Add(-2 * time.Minute)
	mu.Unlock()
	if r := call(t, "GET", base+"/readyz", "", ""); r.code != 503 || !strings.Contains(r.body, "sink hook paused for 2m0s (threshold 1m0s)") {
		t.Fatalf("readyz with a sink paused too long: %+v", r)
	}
	if r := call(t, "GET", base+"/metrics", "", ""); r.code != 404 {
		t.Fatalf("metrics without a handler: %+v", r)
	}
	failing := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store, RecordFailure: func() (time.Time, error) {
		return time.Now().Add(-time.Minute), errors.New("permission denied for table outbox")
	}})
	if r := call(t, "GET", failing+"/readyz", "", ""); r.code != 503 || !strings.Contains(r.body, "recording outcomes has failed for 1m0s") ||
		!strings.Contains(r.body, "permission denied") {
		t.Fatalf("readyz while records fail: %+v", r)
	}
	superseded := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store, Superseded: func() time.Time {
		return time.Now().Add(-time.Minute)
	}})
	if r := call(t, "GET", superseded+"/readyz", "", ""); r.code != 503 || !strings.Contains(r.body, "a relay with a newer configuration (routes and sinks) has been live for 1m0s") {
		t.Fatalf("readyz while superseded: %+v", r)
	}

	start := time.Now()
	down := serve(t, admin.Config{ReadyTimeout: 200 * time.Millisecond}, admin.Deps{DB: downDB{}, DeadLetters: tb.store})
	if r := call(t, "GET", down+"/readyz", "", ""); r.code != 503 || !strings.Contains(r.body, `"database": "unreachable"`) {
		t.Fatalf("readyz with the database down: %+v", r)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("readyz took %s with a 200ms timeout", time.Since(start))
	}
	if r := call(t, "GET", down+"/healthz", "", ""); r.code != 200 {
		t.Fatalf("healthz with the database down: %+v", r)
	}
}

func TestToken(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const token = "s3cret-Admin-Token"
	base := serve(t, admin.Config{Token: token}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	for _, ep := range []struct{ method, path, body string }{
		{"GET", "/dlq", ""},
		{"GET", "/dlq/0190a0b0-0000-7000-8000-000000000000", ""},
		{"POST", "/dlq/replay", `{"all": true}`},
		{"POST", "/dlq/purge", `{"all": true}`},
	} {
		for _, tok := range []string{"", "wrong", token + "x", strings.ToUpper(token)} {
			r := call(t, ep.method, base+ep.path, tok, ep.body)
			if r.code != 401 || r.hdr.Get("WWW-Authenticate") == "" || strings.Contains(r.body, token) {
				t.Fatalf("%s %s with token %q: %+v", ep.method, ep.path, tok, r)
			}
		}
	}
	if r := call(t, "GET", base+"/dlq", token, ""); r.code != 200 || strings.TrimSpace(r.body) != "[]" {
		t.Fatalf("GET /dlq with the token: %+v", r)
	}
	// A raw header without the Bearer scheme is refused too.
	req, _ := http.NewRequest("GET", base+"/dlq", nil)
	req.Header.Set("Authorization", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("token without Bearer: %d", resp.StatusCode)
	}
	if r := call(t, "GET", base+"/healthz", "", ""); r.code != 200 {
		t.Fatalf("healthz needs no token: %+v", r)
	}
	// Without a token configured (loopback only), the API is open.
	open := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	if r := call(t, "GET", open+"/dlq", "", ""); r.code != 200 {
		t.Fatalf("GET /dlq on loopback without a token configured: %+v", r)
	}
}

// tableDump is every row of the outbox and deliveries tables, as text.
func (tb *testBundle) tableDump(t *testing.T) string {
	t.Helper()
	var out, deliveries string
	if err := tb.pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(o::text, E'\\n' ORDER BY seq), '') FROM "+tb.tables.Outbox()+" o").Scan(&out); err != nil {
		t.Fatal(err)
	}
	if err := tb.pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(d::text, E'\\n' ORDER BY seq, sink), '') FROM "+tb.tables.Deliveries()+" d").Scan(&deliveries); err != nil {
		t.Fatal(err)
	}
	return out + "\n--\n" + deliveries
}

// insertDead writes an event with a dead letter on each of sinks straight
// into the deliveries table, as a relay would leave it, and returns its id
// and seq.
func (tb *testBundle) insertDead(t *testing.T, topic, key string, stops bool, sinks ...string) (string, int64) {
	t.Helper()
	var (
		k   any
		id  string
		seq int64
	)
	if key != "" {
		k = key
	}
	ctx := context.Background()
	if err := tb.pool.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'seq')), gen_random_uuid()::text`, tb.tables.Outbox()).Scan(&seq, &id); err != nil {
		t.Fatal(err)
	}
	for _, sink := range sinks {
		if _, err := tb.pool.Exec(ctx, `INSERT INTO `+tb.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload,
    created_at, state, stops_key, attempts, last_error, dead_at)
VALUES ($1, $2, hashtext(coalesce($5::text, $3::text)) & 63, $3::text::uuid, $4, $5, '{"a": [1, 2]}', now(),
    'dead', $6, 1, 'HTTP 410 Gone', now())`, sink, seq, id, topic, k, stops && key != ""); err != nil {
			t.Fatal(err)
		}
	}
	return id, seq
}

// state is the state of an event's delivery on sink ("gone" without one).
func (tb *testBundle) state(t *testing.T, seq int64, sink string) string {
	t.Helper()
	var state string
	err := tb.pool.QueryRow(context.Background(), "SELECT state FROM "+tb.tables.Deliveries()+" WHERE seq = $1 AND sink = $2", seq, sink).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func TestDeadLetterAPI(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	// a stops its key on hook; b is dead on hook and kafka; c died before
	// any sink (the routing step).
	a, seqA := tb.insertDead(t, "orders.created", "o-1", true, "hook")
	b, seqB := tb.insertDead(t, "orders.paid", "o-2", false, "hook", "kafka")
	c, seqC := tb.insertDead(t, "users.created", "", false, "")
	base := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})

	list := func(query string) []deadletter.DeadLetter {
		t.Helper()
		r := call(t, "GET", base+"/dlq"+query, "", "")
		if r.code != 200 {
			t.Fatalf("GET /dlq%s: %+v", query, r)
		}
		var out []deadletter.DeadLetter
		if err := json.Unmarshal([]byte(r.body), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	namesOf := func(ds []deadletter.DeadLetter) string {
		var s []string
		for _, d := range ds {
			s = append(s, d.ID+"/"+d.Sink)
		}
		return strings.Join(s, ",")
	}
	if got := namesOf(list("")); got != a+"/hook,"+b+"/hook,"+b+"/kafka,"+c+"/" {
		t.Fatalf("all: %s", got)
	}
	if got := namesOf(list("?topic=orders.*&sink=hook")); got != a+"/hook,"+b+"/hook" {
		t.Fatalf("orders.* on hook: %s", got)
	}
	if got := namesOf(list("?key=o-2")); got != b+"/hook,"+b+"/kafka" {
		t.Fatalf("key: %s", got)
	}
	if got := namesOf(list("?error=gone&limit=1")); got != a+"/hook" {
		t.Fatalf("error, limit 1: %s", got)
	}
	if got := namesOf(list(fmt.Sprintf("?after_seq=%d", seqA))); got != b+"/hook,"+b+"/kafka,"+c+"/" {
		t.Fatalf("after_seq: %s", got)
	}
	if got := namesOf(list(fmt.Sprintf("?after_seq=%d&after_sink=hook", seqB))); got != b+"/kafka,"+c+"/" {
		t.Fatalf("after_seq and after_sink: %s", got)
	}
	if got := namesOf(list("?id=" + c + "&id=" + a)); got != a+"/hook,"+c+"/" {
		t.Fatalf("ids: %s", got)
	}
	if got := namesOf(list("?since=" + time.Now().Add(time.Hour).UTC().Format(time.RFC3339))); got != "" {
		t.Fatalf("since the future: %s", got)
	}
	r := call(t, "GET", base+"/dlq?limit=1", "", "")
	if !strings.Contains(r.body, `"sink": "hook"`) || !strings.Contains(r.body, `"stops_key": true`) || !strings.Contains(r.body, `"died_at": "`) {
		t.Fatalf("JSON field names: %s", r.body)
	}
	for _, q := range []string{"?limit=0", "?limit=x", "?since=yesterday", "?older_than=3", "?id=nope", "?after_seq=z", "?after_sink=hook"} {
		if r := call(t, "GET", base+"/dlq"+q, "", ""); r.code != 400 || !strings.Contains(r.body, "error") {
			t.Fatalf("GET /dlq%s: %+v", q, r)
		}
	}

	r = call(t, "GET", base+"/dlq/"+b, "", "")
	var shown map[string]any
	if err := json.Unmarshal([]byte(r.body), &shown); r.code != 200 || err != nil {
		t.Fatalf("show: %+v", r)
	}
	hook, _ := shown["deliveries"].(map[string]any)["hook"].(map[string]any)
	if shown["id"] != b || shown["status"] != "dead" || fmt.Sprint(shown["payload"]) != "map[a:[1 2]]" ||
		hook["state"] != "dead" || hook["error"] != "HTTP 410 Gone" || fmt.Sprint(hook["attempts"]) != "1" || hook["dead_at"] == nil {
		t.Fatalf("show: %s", r.body)
	}
	if r := call(t, "GET", base+"/dlq/0190a0b0-0000-7000-8000-000000000000", "", ""); r.code != 404 {
		t.Fatalf("show unknown: %+v", r)
	}
	if r := call(t, "GET", base+"/dlq/nope", "", ""); r.code != 400 {
		t.Fatalf("show bad id: %+v", r)
	}

	for _, body := range []string{`{}`, `{"all": true, "topic": "x"}`, `{"topic": "x", "frob": 1}`, `not json`, `{"older_than": "soon"}`, `{"ids": ["x"]}`} {
		for _, op := range []string{"replay", "purge"} {
			if r := call(t, "POST", base+"/dlq/"+op, "", body); r.code != 400 {
				t.Fatalf("POST /dlq/%s %s: %+v", op, body, r)
			}
		}
	}
	if r := call(t, "POST", base+"/dlq/purge", "", `{"all": true, "all_sinks": true}`); r.code != 400 {
		t.Fatalf("purge with all_sinks: %+v", r)
	}

	// Dry runs change nothing.
	before := tb.tableDump(t)
	r = call(t, "POST", base+"/dlq/replay", "", `{"topic": "orders.*", "dry_run": true}`)
	var res admin.OperationResult
	if err := json.Unmarshal([]byte(r.body), &res); r.code != 200 || err != nil || !res.DryRun || res.Count != 3 || len(res.DeadLetters) != 3 {
		t.Fatalf("replay dry run: %+v", r)
	}
	r = call(t, "POST", base+"/dlq/purge", "", `{"all": true, "dry_run": true}`)
	if err := json.Unmarshal([]byte(r.body), &res); r.code != 200 || err != nil || res.Count != 4 {
		t.Fatalf("purge dry run: %+v", r)
	}
	if after := tb.tableDump(t); after != before {
		t.Fatalf("a dry run changed the tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// a's dead letter stopped its key: replayed, it is the head again.
	missing := "0190a0b0-0000-7000-8000-000000000000"
	r = call(t, "POST", base+"/dlq/replay", "", `{"ids": ["`+a+`", "`+missing+`"]}`)
	res = admin.OperationResult{}
	if err := json.Unmarshal([]byte(r.body), &res); r.code != 200 || err != nil || res.Count != 1 || len(res.Missing) != 1 || res.Missing[0] != missing {
		t.Fatalf("replay: %+v", r)
	}
	e, err := tb.store.Show(ctx, a)
	if err != nil || e.Status != "queued" || e.Deliveries["hook"].State != "ready" || e.Deliveries["hook"].Attempts != 0 || e.Deliveries["hook"].StopsKey {
		t.Fatalf("replayed: %+v, %v", e, err)
	}
	// b goes back to the routing step: its dead letters on both sinks go.
	r = call(t, "POST", base+"/dlq/replay", "", `{"key": "o-2", "sink": "kafka", "all_sinks": true}`)
	if r.code != 200 || !strings.Contains(r.body, `"count": 1`) {
		t.Fatalf("replay all sinks: %+v", r)
	}
	if got := tb.state(t, seqB, "") + " " + tb.state(t, seqB, "hook") + " " + tb.state(t, seqB, "kafka"); got != "ready gone gone" {
		t.Fatalf("replayed to all sinks (routing step, hook, kafka): %s", got)
	}
	r = call(t, "POST", base+"/dlq/purge", "", `{"all": true}`)
	if r.code != 200 || !strings.Contains(r.body, `"count": 1`) {
		t.Fatalf("purge: %+v", r)
	}
	if _, err := tb.store.Show(ctx, c); !errors.Is(err, deadletter.ErrNotFound) || tb.state(t, seqC, "") != "gone" {
		t.Fatalf("purged event still there: %v", err)
	}
}

// failingSink acknowledges every event except those whose payload says
// "fail", which it rejects for good.
type failingSink struct{ name string }

func (s failingSink) Name() string { return s.name }
func (s failingSink) Publish(_ context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	for i, e := range events {
		if bytes.Contains(e.Payload, []byte("fail")) {
			errs[i] = sinks.Permanent(errors.New("rejected"))
		}
	}
	return errs
}
func (s failingSink) Close(context.Context) error { return nil }

// TestMetricsAfterWorkload runs a real relay with the metrics observer: 50
// events to one sink, 3 of them rejected for good, and reads /metrics.
func TestMetricsAfterWorkload(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.NewPostgres(tb.pool, relay.Config{
		Tables: tb.tables, PollOnly: true, PollInterval: 20 * time.Millisecond, Observer: m, MetricsTopics: []string{"orders"},
		Routes: []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: failingSink{"hook"}}}}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.pool.Exec(ctx, `INSERT INTO `+tb.tables.Outbox()+` (topic, payload)
SELECT 'orders', CASE WHEN i IN (7, 21, 42) THEN '"fail"' ELSE '"ok"' END::json FROM generate_series(1, 50) AS i`); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var left, deadN int
		if err := tb.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+tb.tables.Outbox()+"), (SELECT count(*) FROM "+tb.tables.Deliveries()+" WHERE state = 'dead')").Scan(&left, &deadN); err != nil {
			t.Fatal(err)
		}
		if left == 0 && deadN == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workload not done: %d pending, %d dead", left, deadN)
		}
		time.Sleep(20 * time.Millisecond)
	}
	totals, err := tb.store.Totals(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.SetBacklog(totals) // what RefreshBacklog does once a minute
	base := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store, PausedSinks: r.PausedSinks,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
	var body string
	deadline = time.Now().Add(10 * time.Second)
	for {
		body = call(t, "GET", base+"/metrics", "", "").body
		if strings.Contains(body, "herald_backlog_dead_events 3") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		`herald_events_published_total{sink="hook",topic="orders"} 47`,
		// As many failed attempts as dead letters: none was retried.
		`herald_delivery_attempts_failed_total{sink="hook",topic="orders"} 3`,
		`herald_dead_letters_total{sink="hook",topic="orders"} 3`,
		`herald_events_claimed_total 50`,
		`herald_commit_to_publish_seconds_count{sink="hook"} 47`,
		`herald_backlog_dead_events 3`,
		`herald_backlog_pending_events 0`,
		`herald_backlog_oldest_pending_age_seconds 0`,
		`herald_backlog_refresh_errors_total 0`,
		`herald_sink_paused{sink="hook"} 0`, // exported from the start, never paused
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, absent := range []string{"herald_events_deferred_total{", "herald_mysql_history_list_length"} {
		if strings.Contains(body, absent) {
			t.Errorf("/metrics has %q after a workload on PostgreSQL without retries or pauses", absent)
		}
	}
	// Every Publish call and claim was timed: their counts add up.
	if !strings.Contains(body, `herald_publish_duration_seconds_count{sink="hook"} `) || !strings.Contains(body, "herald_claim_duration_seconds_count ") {
		t.Errorf("/metrics lacks the latency histograms")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
