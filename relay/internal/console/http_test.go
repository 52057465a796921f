package console_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/console"
)

// deadFilterAll selects every dead letter.
var deadFilterAll = deadletter.Filter{}

// client is a browser without JavaScript: a cookie jar and forms.
type client struct {
	base string
	hc   *http.Client
}

func newClient(t *testing.T, base string) *client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &client{base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := c.hc.Get(c.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf opens a session (a page) and returns its CSRF token.
func (c *client) csrf(t *testing.T) string {
	t.Helper()
	code, body := c.get(t, "/ui/dead")
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET /ui/dead: %d, no CSRF token in:\n%s", code, body)
	}
	return m[1]
}

// post sends a form, with extra headers ("Origin").
func (c *client) post(t *testing.T, path string, form map[string]string, headers ...string) (int, string) {
	t.Helper()
	v := url.Values{}
	for k, val := range form {
		v.Set(k, val)
	}
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(v.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStateChangesNeedTheCSRFToken: a purge POSTed without the session's
// CSRF token, with a wrong one, without a session, or from another origin
// is refused with 403 and changes nothing; the same form with the token
// purges.
func TestStateChangesNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	e.insertDead(t, 1)
	c := newClient(t, e.base)
	csrf := c.csrf(t)
	purge := func(token string) map[string]string {
		f := map[string]string{"op": "purge", "scope": "all"}
		if token != "" {
			f["csrf"] = token
		}
		return f
	}
	for name, try := range map[string]func() (int, string){
		"no token":     func() (int, string) { return c.post(t, "/ui/dead/run", purge("")) },
		"wrong token":  func() (int, string) { return c.post(t, "/ui/dead/run", purge(csrf[:len(csrf)-1]+"x")) },
		"no session":   func() (int, string) { return newClient(t, e.base).post(t, "/ui/dead/run", purge(csrf)) },
		"cross-origin": func() (int, string) { return c.post(t, "/ui/dead/run", purge(csrf), "Origin", "http://evil.example") },
		"foreign Host": func() (int, string) {
			return c.post(t, "/ui/dead/run", purge(csrf), "Host", "evil.example")
		},
		"token in the query": func() (int, string) { return c.post(t, "/ui/dead/run?csrf="+url.QueryEscape(csrf), purge("")) },
	} {
		if code, body := try(); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403:\n%s", name, code, body)
		}
	}
	if n, err := e.store.Count(t.Context(), deadFilterAll); err != nil || n != 1 {
		t.Fatalf("%d dead letters (%v) after refused purges, want 1", n, err)
	}
	if code, body := c.get(t, "/ui/dead/run"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /ui/dead/run: %d, want 405:\n%s", code, body)
	}
	if code, body := c.post(t, "/ui/dead/run", purge(csrf)); code != http.StatusOK || !strings.Contains(body, "Purged 1 dead letter.") {
		t.Fatalf("purge with the token: %d:\n%s", code, body)
	}
	if n, _ := e.store.Count(t.Context(), deadFilterAll); n != 0 {
		t.Fatalf("%d dead letters after the purge, want 0", n)
	}
}

// TestSecurityHeaders: every answer forbids inline script and framing,
// and pages are not cached.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	c := newClient(t, e.base)
	for _, path := range []string{"/ui/", "/ui/dead", "/ui/held", "/ui/static/style.css", "/ui/nope"} {
		resp, err := c.hc.Get(e.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") ||
			resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: CSP %q, nosniff %q", path, csp, resp.Header.Get("X-Content-Type-Options"))
		}
	}
}

// TestLoginRedirectStaysInTheConsole: the page a login returns to is a
// path of the console, never another site.
func TestLoginRedirectStaysInTheConsole(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{token: "tok", noRelay: true})
	c := newClient(t, e.base)
	for next, want := range map[string]string{
		"/ui/dead?topic=a":        "/ui/dead?topic=a",
		"//evil.example/ui/":      "/ui/",
		"https://evil.example/ui": "/ui/",
		"/elsewhere":              "/ui/",
	} {
		resp, err := c.hc.PostForm(e.base+"/ui/login", url.Values{"token": {"tok"}, "next": {next}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || got != want {
			t.Errorf("next=%s: %d to %q, want %q", next, resp.StatusCode, got, want)
		}
	}
	if code, _ := newClient(t, e.base).get(t, "/ui/held"); code != http.StatusSeeOther {
		t.Errorf("a page without a session: %d, want a redirect to the login", code)
	}
}

// TestLoginIsRateLimited: after five wrong tokens from one address, the
// sixth sign-in is answered 429 with Retry-After, even with the right
// token, and sets no cookie; another address signs in with the right
// token at once.
func TestLoginIsRateLimited(t *testing.T) {
	t.Parallel()
	const token = "the-right-token"
	e := setup(t, envOpts{token: token, noRelay: true})
	c := newClient(t, e.base)
	signIn := func(tok string) *http.Response {
		t.Helper()
		resp, err := c.hc.PostForm(e.base+"/ui/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := range 5 {
		resp := signIn("wrong")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	resp := signIn(token)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || retry < 1 || retry > 12 ||
		!strings.Contains(string(body), "Too many failed sign-ins from your address") || len(resp.Cookies()) != 0 {
		t.Fatalf("sign-in after 5 failures: %d, Retry-After %q, cookies %v:\n%s", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Cookies(), body)
	}

	// Another address, on a console of the same settings: the addresses
	// are the requests' own (the admin server's test listener has one).
	con, err := console.New(console.Config{Token: token}, console.Deps{DeadLetters: e.store})
	if err != nil {
		t.Fatal(err)
	}
	post := func(addr, tok string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		con.ServeHTTP(rec, req)
		return rec
	}
	for range 5 {
		post("192.0.2.66:40000", "wrong")
	}
	if rec := post("192.0.2.66:40001", token); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the attacking address, another port: %d, want 429", rec.Code)
	}
	if rec := post("198.51.100.7:5555", token); rec.Code != http.StatusSeeOther || len(rec.Result().Cookies()) != 1 {
		t.Fatalf("another address with the right token: %d, cookies %v, want signed in", rec.Code, rec.Result().Cookies())
	}
}

// TestConfirmedPurgeChangesWhatWasCounted: dead letters that die between
// the confirmation (which counted 3) and the purge are not purged: the
// result says 3, as the confirmation did.
func TestConfirmedPurgeChangesWhatWasCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	e.insertDead(t, 3)
	c := newClient(t, e.base)
	csrf := c.csrf(t)
	code, body := c.post(t, "/ui/dead/confirm", map[string]string{"csrf": csrf, "op": "purge", "scope": "all"})
	planned := regexp.MustCompile(`name="planned" value="([^"]+)"`).FindStringSubmatch(body)
	if code != http.StatusOK || !strings.Contains(body, `<strong id="dry-count">3</strong>`) || planned == nil {
		t.Fatalf("confirmation: %d, want 3 counted and the plan's time:\n%s", code, body)
	}
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO `+e.tables.Deliveries()+` (sink, seq, lane, id, topic, payload, created_at, state, last_error, dead_at)
SELECT 'hook', nextval(pg_get_serial_sequence($1, 'seq')), 0, gen_random_uuid(), 'orders.late', '{}', now(), 'dead', 'HTTP 400', now()
FROM generate_series(1, 2)`, e.tables.Outbox()); err != nil {
		t.Fatal(err)
	}
	code, body = c.post(t, "/ui/dead/run", map[string]string{"csrf": csrf, "op": "purge", "scope": "all", "planned": html.UnescapeString(planned[1])})
	if code != http.StatusOK || !strings.Contains(body, "Purged 3 dead letters.") {
		t.Fatalf("purge: %d, want 3 purged:\n%s", code, body)
	}
	if n, err := e.store.Count(t.Context(), deadFilterAll); err != nil || n != 2 {
		t.Fatalf("%d dead letters left (%v), want the 2 that died after the confirmation", n, err)
	}
	if code, body := c.post(t, "/ui/dead/run", map[string]string{"csrf": csrf, "op": "purge", "scope": "all", "planned": "yesterday"}); code != http.StatusBadRequest ||
		!strings.Contains(body, "planned: &#34;yesterday&#34; is not an RFC 3339 time") {
		t.Fatalf("a bad plan time: %d:\n%s", code, body)
	}
}

// TestDeadLetterPages: 120 dead letters are listed 50 per page, each page
// following the last, in either order, every dead letter once.
func TestDeadLetterPages(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	e.insertDead(t, 120)
	c := newClient(t, e.base)
	row := regexp.MustCompile(`<a href="/ui/event/([0-9a-f-]{36})" class="mono" title=`)
	next := regexp.MustCompile(`<a href="([^"]+)" id="next"`)
	for _, first := range []string{"/ui/dead", "/ui/dead?order=oldest"} {
		seen := map[string]bool{}
		var sizes []int
		for path := first; path != ""; {
			code, body := c.get(t, path)
			if code != http.StatusOK {
				t.Fatalf("GET %s: %d", path, code)
			}
			ids := row.FindAllStringSubmatch(body, -1)
			sizes = append(sizes, len(ids))
			for _, m := range ids {
				if seen[m[1]] {
					t.Fatalf("%s: %s listed twice", first, m[1])
				}
				seen[m[1]] = true
			}
			path = ""
			if m := next.FindStringSubmatch(body); m != nil {
				path = html.UnescapeString(m[1])
			}
		}
		if len(seen) != 120 || fmt.Sprint(sizes) != "[50 50 20]" {
			t.Errorf("%s: %d dead letters in pages of %v, want 120 in [50 50 20]", first, len(seen), sizes)
		}
	}
}

// TestDeadLetterFilters: each filter field of the dead-letter page narrows
// the count, times typed as the browser's datetime-local input sends them
// (UTC); a time that does not parse is a 400 naming the field.
func TestDeadLetterFilters(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	e.insertDead(t, 20)
	c := newClient(t, e.base)
	count := regexp.MustCompile(`<strong id="match-count">([^<]*)</strong>`)
	future := time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04")
	for query, want := range map[string]string{
		"":                            "20",
		"?since=" + future:            "0",
		"?until=" + future:            "20",
		"?until=2020-01-01T00:00:00":  "0",
		"?error=EVENT+1":              "11", // event 1, 10 to 19
		"?key=k-3":                    "1",
		"?topic=orders.1":             "2",
		"?topic=orders.*&sink=hook":   "20",
		"?sink=(routing)":             "0",
		"?topic=orders.1&error=ent+1": "2",
	} {
		code, body := c.get(t, "/ui/dead"+query)
		m := count.FindStringSubmatch(body)
		if code != http.StatusOK || m == nil || m[1] != want {
			t.Errorf("/ui/dead%s: %d, count %v, want %s", query, code, m, want)
		}
	}
	if code, body := c.get(t, "/ui/dead?since=yesterday"); code != http.StatusBadRequest || !strings.Contains(body, "since: &#34;yesterday&#34; is not a time") {
		t.Errorf("a bad time: %d:\n%s", code, body)
	}
}

// TestOverviewShowsUnconfiguredSinks: a sink the relay's configuration does
// not name, with deliveries waiting, is on the overview as unconfigured
// (they are kept, not dead-lettered); a configured sink is not.
func TestOverviewShowsUnconfiguredSinks(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{noRelay: true})
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.tables.Deliveries()+` (sink, seq, lane, id, topic, key, payload,
    created_at, state, next_at)
SELECT 'gone', nextval(pg_get_serial_sequence($1, 'seq')), 0, gen_random_uuid(), 'orders', 'k', '{}', now(), 'ready', now()`, e.tables.Outbox()); err != nil {
		t.Fatal(err)
	}
	code, body := newClient(t, e.base).get(t, "/ui/")
	if code != http.StatusOK {
		t.Fatalf("GET /ui/: %d", code)
	}
	unconfigured := regexp.MustCompile(`<tr id="sink-(\w+)"[^>]*>\s*<th scope="row">\w+</th>\s*<td><span class="state state-unconfigured"`)
	var got []string
	for _, m := range unconfigured.FindAllStringSubmatch(body, -1) {
		got = append(got, m[1])
	}
	if fmt.Sprint(got) != "[gone]" {
		t.Fatalf("sinks shown unconfigured: %v, want [gone]", got)
	}
}
