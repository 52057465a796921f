package console_test

import (
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/relay/deadletter"
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
