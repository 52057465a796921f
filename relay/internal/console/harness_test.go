package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/admin"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

// screenshots is where the browser tests save a screenshot of each page, in
// light and dark: -screenshots, or $HERALD_CONSOLE_SCREENSHOTS, or a
// temporary directory. `go test ./relay/internal/console -run Browser
// -screenshots=$PWD/docs/img` refreshes the README's.
var screenshots = flag.String("screenshots", os.Getenv("HERALD_CONSOLE_SCREENSHOTS"), "directory for the console's screenshots (default: a temporary one)")

// chromiumPath is Debian's Chromium, or $CHROMIUM.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// The tests share one browser: each test opens its own browser context (its
// own cookies) in it.
var (
	browserOnce   sync.Once
	browserCtx    context.Context
	browserErr    error
	browserCancel = func() {}
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	browserCancel()
	os.Exit(code)
}

// startBrowser starts headless Chromium with the flags a closed network
// needs (it otherwise retries its own connections).
func startBrowser() {
	dir, err := os.MkdirTemp("", "herald-console-chromium-")
	if err != nil {
		browserErr = err
		return
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(dir),
	)
	ctx, cancel := chromedp.NewContext(allocCtx)
	browserCancel = func() {
		cancel()
		cancelAlloc()
		_ = os.RemoveAll(dir)
	}
	browserCtx = ctx
	browserErr = chromedp.Do(ctx)
}

// newTab returns a tab of its own browser context (no cookies shared with
// other tests), failing under CI=true when Chromium is missing and skipping
// otherwise. A dialog (alert, confirm) opened by any page is counted in
// dialogs and dismissed.
func newTab(t *testing.T) (ctx context.Context, dialogs *atomic.Int32) {
	t.Helper()
	if _, err := exec.LookPath(chromiumPath()); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Chromium is required under CI (%s): %v", chromiumPath(), err)
		}
		t.Skipf("Chromium not found at %s (%v): install it (apt-get install chromium) or set CHROMIUM", chromiumPath(), err)
	}
	browserOnce.Do(startBrowser)
	if browserErr != nil {
		t.Fatalf("starting Chromium: %v", browserErr)
	}
	ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	dialogs = &atomic.Int32{}
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			// Answering from the listener would block its loop.
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
			}()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)); err != nil {
		t.Fatal(err)
	}
	return ctx, dialogs
}

// run runs browser steps, each bounded so a missing element fails the test
// rather than hanging it.
func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v\npage text:\n%s", err, pageText(ctx))
	}
}

// pageText is the page's text, for failure messages.
func pageText(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string]("location.href + '\\n' + (document.body ? document.body.innerText : '')"))
	return s
}

// navigate runs steps that load a page (a click on a link or a submit
// button, a form submitted) and waits until it has loaded, returning its
// status.
func navigate(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, steps...)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return resp.Status
}

// text returns the text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("browser: text of %s: %v", sel, err)
	}
	return s
}

// eval evaluates a JavaScript expression on the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("browser: %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript predicate until it holds (60 s at most).
func waitFor(t *testing.T, ctx context.Context, predicate string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 70*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("browser: waiting for %s: %v\npage text:\n%s", predicate, err, pageText(ctx))
	}
}

// shoot saves a screenshot of the page in light and in dark mode, as
// name-light.png and name-dark.png.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := *screenshots
	if dir == "" {
		dir = t.TempDir()
	}
	for _, scheme := range []string{"light", "dark"} {
		_, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		if err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+"-"+scheme+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{}); err != nil {
		t.Fatal(err)
	}
}

// receiver is a webhook endpoint the tests make fail and recover. It
// records the event ids (webhook-id) of the requests it accepted.
type receiver struct {
	srv *httptest.Server
	// answer is the status every request gets.
	answer atomic.Int32
	// body is what a refused request's body says (it becomes the dead
	// letter's error).
	body atomic.Value
	mu   sync.Mutex
	got  map[string]int
	// changed is closed and replaced whenever got changes.
	changed chan struct{}
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{got: map[string]int{}, changed: make(chan struct{})}
	rc.answer.Store(http.StatusOK)
	rc.body.Store("")
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		code := int(rc.answer.Load())
		if code != http.StatusOK {
			w.WriteHeader(code)
			_, _ = io.WriteString(w, rc.body.Load().(string))
			return
		}
		rc.mu.Lock()
		rc.got[r.Header.Get("webhook-id")]++
		close(rc.changed)
		rc.changed = make(chan struct{})
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// waitDelivered waits until every id was delivered, at most 60 s.
func (rc *receiver) waitDelivered(t *testing.T, ids []string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		rc.mu.Lock()
		missing := 0
		for _, id := range ids {
			if rc.got[id] == 0 {
				missing++
			}
		}
		changed := rc.changed
		rc.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the receiver is still missing %d of %d events", missing, len(ids))
		}
	}
}

// delivered counts the distinct events the receiver accepted.
func (rc *receiver) delivered() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// env is a relay running against its own schema, delivering to a
// receiver through a webhook sink "hook", with the admin server serving
// the console.
type env struct {
	pool   *pgxpool.Pool
	tables migrations.Tables
	store  *deadletter.Store
	rc     *receiver
	base   string
}

// envOpts vary the console.
type envOpts struct {
	token    sinkconfig.Secret
	readOnly bool
	// noRelay leaves the relay out: the test writes dead letters itself.
	noRelay bool
}

func setup(t *testing.T, o envOpts) *env {
	t.Helper()
	pool := pgtest.Pool(t)
	e := &env{pool: pool, tables: pgtest.Schema(t, pool), rc: newReceiver(t)}
	var err error
	if e.store, err = deadletter.New(pool, e.tables); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	hook, err := webhook.New("hook", webhook.Config{URL: e.rc.srv.URL, Timeout: 5 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	// The relay is built either way (the admin server is the relay's); it
	// runs unless noRelay.
	r, err := relay.NewPostgres(pool, relay.Config{
		Tables: e.tables, PollInterval: 20 * time.Millisecond, Lease: 5 * time.Second,
		// A failed delivery waits a minute: the tests see it retrying.
		Backoff:   relay.Backoff{Initial: time.Minute, Max: time.Minute},
		SinkPause: relay.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Routes:    []relay.Route{{Topics: []string{"*"}, Targets: []relay.Target{{Sink: hook}}}},
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.NewForRelay(r, admin.Opts{
		Config: admin.Config{Listen: "127.0.0.1:0", Token: o.token},
		DB:     pool, DeadLetters: e.store, Console: true, ConsoleReadOnly: o.readOnly, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	e.base = "http://" + ln.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("admin Serve: %v", err)
		}
	})
	if !o.noRelay {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("relay Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		wg.Wait()
		_ = hook.Close(context.Background())
	})
	return e
}

// insert commits one event and returns its id.
func (e *env) insert(t *testing.T, topic, key, payload string, headers map[string]string) string {
	t.Helper()
	if headers == nil {
		headers = map[string]string{}
	}
	h, err := json.Marshal(headers)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := e.pool.QueryRow(context.Background(), "INSERT INTO "+e.tables.Outbox()+" (topic, key, payload, headers) VALUES ($1, $2, $3, $4) RETURNING id::text",
		topic, optional(key), optional(payload), h).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitDead waits until n dead letters exist, polling the count (at most
// 60 s).
func (e *env) waitDead(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := e.store.Count(context.Background(), deadletter.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d dead letters, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond) // a poll interval, not an assertion delay
	}
}

// waitGone waits until event id has no row left, in the outbox or the
// deliveries (at most 60 s).
func (e *env) waitGone(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := e.pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+e.tables.Outbox()+" WHERE id = $1) + (SELECT count(*) FROM "+
			e.tables.Deliveries()+" WHERE id = $1)", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s still has %d rows", id, n)
		}
		time.Sleep(20 * time.Millisecond) // a poll interval, not an assertion delay
	}
}

// optional is nil for "", so that the column is NULL.
func optional(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// insertDead writes n dead letters on sink "hook" in one statement, as a
// relay would have left them (topics orders.N%10, keys k-N, an error naming
// N), for tests and benchmarks that need many without a relay.
func (e *env) insertDead(tb testing.TB, n int) {
	tb.Helper()
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload,
    created_at, state, stops_key, attempts, last_error, dead_at)
SELECT 'hook', nextval(pg_get_serial_sequence($1, 'seq')), hashtext('k-' || i) & 63, gen_random_uuid(), 'orders.' || (i % 10), 'k-' || i,
    '{"n": 1}', now(), 'dead', false, 10, 'endpoint answered 500 for event ' || i, now() - make_interval(secs => $2 - i)
FROM generate_series(1, $2) AS i`, e.tables.Outbox(), n); err != nil {
		tb.Fatal(err)
	}
}
