package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/heraldhq/herald/internal/pgtest"
	_ "github.com/heraldhq/herald/internal/pgtest/pgcontainer" // a container when no server answers
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = sinkconfig.Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")

// arrival is one webhook request as the receiver got it.
type arrival struct {
	id, key string
	event   orderEvent
}

// receiver is the webhook's peer: a real HTTP server that checks every
// signature and records arrivals in order. It answers the first request of
// each key with 503, so every key is retried before it goes on.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	got    []arrival
	failed map[string]bool
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{t: t, failed: map[string]bool{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
			t.Errorf("receiver: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var env struct {
			ID      string     `json:"id"`
			Key     string     `json:"key"`
			Payload orderEvent `json:"payload"`
		}
		if err := json.Unmarshal(body, &env); err != nil {
			t.Errorf("receiver: %v in %s", err, body)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if !rc.failed[env.Key] {
			rc.failed[env.Key] = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rc.got = append(rc.got, arrival{id: env.ID, key: env.Key, event: env.Payload})
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// distinct returns the arrivals with re-deliveries of an event removed.
func (rc *receiver) distinct() []arrival {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	seen := map[string]bool{}
	var out []arrival
	for _, a := range rc.got {
		if !seen[a.id] {
			seen[a.id] = true
			out = append(out, a)
		}
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testDatabase returns the test server's URL, a pool for checks, and the
// schema to run the service in, dropped at the end. The service migrates
// the schema itself.
func testDatabase(t *testing.T) (string, *pgxpool.Pool, migrations.Tables) {
	url := pgtest.URL(t)
	pool := pgtest.Pool(t)
	tables := migrations.Tables{Schema: pgtest.UniqueName("embedded"), Table: "outbox"}
	t.Cleanup(func() { pgtest.DropSchema(t, pool, tables.Schema) })
	return url, pool, tables
}

func putOrder(client *http.Client, base, id, status string) error {
	req, err := http.NewRequest(http.MethodPut, base+"/orders/"+id, strings.NewReader(fmt.Sprintf(`{"status":%q}`, status)))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("PUT /orders/%s: %s: %s", id, resp.Status, b)
	}
	return nil
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// TestEmbeddedRelay runs the service in this process against PostgreSQL
// and a real webhook receiver: orders change concurrently over HTTP, every
// event reaches the receiver signed, each order's in the order of its
// changes, across a retry of every key; the relay's admin endpoints are
// served on the service's mux; and cancelling the context stops the server and the
// relay, which records everything it published and gives back its lanes
// (goleak then checks no goroutine is left).
func TestEmbeddedRelay(t *testing.T) {
	url, pool, tables := testDatabase(t)
	rc := newReceiver(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	owner := pgtest.UniqueName("embedded-relay")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, ln, options{
			DatabaseURL: url, Schema: tables.Schema, WebhookURL: rc.srv.URL, WebhookSecret: secret,
			AdminToken: "admin-token", RelayOwner: owner, Logger: slog.New(slog.DiscardHandler),
		})
	}()

	const orders, changes = 20, 5
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, orders)
	for o := range orders {
		wg.Go(func() {
			for c := range changes {
				if err := putOrder(client, base, fmt.Sprintf("order-%d", o), fmt.Sprintf("step%d", c+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	waitFor(t, 90*time.Second, "every event at the receiver", func() bool { return len(rc.distinct()) == orders*changes })
	next := map[string]int{}
	for _, a := range rc.distinct() {
		next[a.key]++
		if a.event.ID != a.key || a.event.Version != next[a.key] || a.event.Status != fmt.Sprintf("step%d", next[a.key]) {
			t.Fatalf("key %s: got %+v, want version %d (step%[3]d): out of order", a.key, a.event, next[a.key])
		}
	}

	// Bad requests are refused, naming what is wrong, and write nothing.
	for _, c := range []struct{ body, want string }{
		{body: `{"status":`, want: "body: unexpected EOF"},
		{body: `{}`, want: "body: status: required"},
		{body: `{"status":"` + strings.Repeat("x", 65) + `"}`, want: "body: status: required, at most 64 bytes"},
	} {
		req, _ := http.NewRequest(http.MethodPut, base+"/orders/bad", strings.NewReader(c.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Fatalf("PUT %s: %s %q, want 400 saying %q", c.body, resp.Status, body, c.want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM `+tables.Outbox()+` WHERE key = 'bad'`); n != 0 {
		t.Fatalf("refused requests wrote %d events", n)
	}

	// The admin endpoints, mounted under /herald/.
	for _, c := range []struct {
		path, token string
		status      int
		body        string
	}{
		{path: "/herald/readyz", status: http.StatusOK},
		{path: "/herald/metrics", status: http.StatusOK, body: `herald_events_published_total{sink="billing"`},
		{path: "/herald/dlq", status: http.StatusUnauthorized},
		{path: "/herald/dlq", token: "admin-token", status: http.StatusOK, body: "[]"},
	} {
		req, _ := http.NewRequest(http.MethodGet, base+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !bytes.Contains(body, []byte(c.body)) {
			t.Fatalf("GET %s (token %q): %s %.2000s; want %d with %q", c.path, c.token, resp.Status, body, c.status, c.body)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the service did not stop within 60s of its context ending")
	}
	if _, err := client.Get(base + "/herald/healthz"); err == nil {
		t.Fatal("the HTTP server still answers after the service stopped")
	}
	if n := count(t, pool, `SELECT count(*) FROM `+tables.Lanes()+` WHERE owner = $1`, owner); n != 0 {
		t.Fatalf("the stopped relay still holds %d lanes", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM `+tables.Outbox()) + count(t, pool, `SELECT count(*) FROM `+tables.Deliveries()); n != 0 {
		t.Fatalf("%d rows left in the outbox and its deliveries: the relay did not record what it published", n)
	}
}

func TestEmbeddedRefusesBadSettings(t *testing.T) {
	for _, c := range []struct {
		name string
		o    options
		want string
	}{
		{name: "no webhook", o: options{Schema: "public"}, want: "WEBHOOK_URL is required"},
		{name: "bad schema", o: options{Schema: strings.Repeat("s", 64), WebhookURL: "http://127.0.0.1:1"}, want: "database.schema: \"" + strings.Repeat("s", 64) + "\" is longer than 44 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			c.o.Logger = slog.New(slog.DiscardHandler)
			if err := run(context.Background(), ln, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestEmbeddedBinaryStopsOnSIGTERM builds the service and runs it as a
// process: an order's event reaches the webhook, and SIGTERM stops it with
// exit status 0.
func TestEmbeddedBinaryStopsOnSIGTERM(t *testing.T) {
	url, _, tables := testDatabase(t)
	rc := newReceiver(t)
	bin := filepath.Join(t.TempDir(), "embedded")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the service listens on it; another process taking it meanwhile fails the test loudly

	var stderr bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "HERALD_SCHEMA="+tables.Schema, "LISTEN_ADDR="+addr,
		"WEBHOOK_URL="+rc.srv.URL, "WEBHOOK_SECRET="+string(secret))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	waitFor(t, 60*time.Second, "the service to take an order", func() bool {
		return putOrder(client, "http://"+addr, "order-1", "paid") == nil
	})
	waitFor(t, 60*time.Second, "the event at the receiver", func() bool { return len(rc.distinct()) == 1 })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit within 60s of SIGTERM\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "embedded: stopped") {
		t.Fatalf("stderr does not say the service stopped:\n%s", stderr.String())
	}
}
