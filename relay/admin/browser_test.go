package admin_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/heraldhq/herald/relay/admin"
)

// request builds a request to base+path with the given headers ("Host"
// sets the Host header the server sees).
func request(t *testing.T, method, base, path, body string, headers map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return req
}

// TestBrowserRequestsAreRefused covers a hostile web page driving the
// browser of someone on the relay's machine, against the default admin
// server (loopback, no token): a cross-site POST to /dlq/purge with
// Origin: http://evil and Content-Type: text/plain (a "simple" request
// sent without a preflight), a DNS-rebound page whose requests carry its own
// Host (evil.example) on reads and writes, and each of those signs alone.
// Each is refused (403 naming the Host or Origin, 415 naming the Content-Type)
// and the dead letter survives; requests from the machine itself, by any
// loopback name, still work.
func TestBrowserRequestsAreRefused(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	id, seq := tb.insertDead(t, "orders", "o-1", false, "hook")
	base := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	own := u.Host
	const purgeAll = `{"all": true}`
	for _, tc := range []struct {
		name         string
		method, path string
		headers      map[string]string
		code         int
		want         string
	}{
		{"the reported attack", "POST", "/dlq/purge", map[string]string{"Host": "evil.example:9090", "Origin": "http://evil", "Content-Type": "text/plain"}, 403, `Host \"evil.example:9090\" is not a loopback name`},
		{"foreign Host on purge", "POST", "/dlq/purge", map[string]string{"Host": "evil.example", "Content-Type": "application/json"}, 403, `Host \"evil.example\"`},
		{"foreign Host on replay", "POST", "/dlq/replay", map[string]string{"Host": "evil.example:" + u.Port(), "Content-Type": "application/json"}, 403, "is not a loopback name"},
		{"foreign Host on list", "GET", "/dlq", map[string]string{"Host": "evil.example:" + u.Port()}, 403, "is not a loopback name"},
		{"foreign Host on show", "GET", "/dlq/" + id, map[string]string{"Host": "rebound.evil.example"}, 403, "is not a loopback name"},
		{"loopback-looking name", "GET", "/dlq", map[string]string{"Host": "127.0.0.1.evil.example"}, 403, "is not a loopback name"},
		{"foreign Origin", "POST", "/dlq/purge", map[string]string{"Origin": "http://evil", "Content-Type": "application/json"}, 403, `Origin \"http://evil\" is not this server's`},
		{"null Origin", "POST", "/dlq/purge", map[string]string{"Origin": "null", "Content-Type": "application/json"}, 403, `Origin \"null\"`},
		{"Origin on another port", "POST", "/dlq/replay", map[string]string{"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"}, 403, "is not this server's"},
		{"text/plain", "POST", "/dlq/purge", map[string]string{"Content-Type": "text/plain"}, 415, `Content-Type \"text/plain\"`},
		{"form", "POST", "/dlq/purge", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"},
		{"no Content-Type", "POST", "/dlq/replay", nil, 415, `Content-Type \"\"`},
		{"a huge Host, quoted bounded", "GET", "/dlq", map[string]string{"Host": strings.Repeat("e", 20000) + ".example"}, 403, "eee…"},
		{"a huge Origin, quoted bounded", "POST", "/dlq/purge", map[string]string{"Origin": "http://" + strings.Repeat("o", 20000), "Content-Type": "application/json"}, 403, "ooo…"},
	} {
		r := do(t, request(t, tc.method, base, tc.path, purgeAll, tc.headers))
		if r.code != tc.code || !strings.Contains(r.body, `"error"`) || !strings.Contains(r.body, tc.want) || len(r.body) > 1024 ||
			r.hdr.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s, want %d with a JSON error containing %s", tc.name, r.code, r.body, tc.code, tc.want)
		}
	}
	if got := tb.state(t, seq, "hook"); got != "dead" {
		t.Fatalf("dead letter after refused requests: %s, want dead", got)
	}

	// The machine itself, by any loopback name and with its own Origin.
	for _, headers := range []map[string]string{
		{"Content-Type": "application/json"},
		{"Content-Type": "application/json; charset=utf-8", "Origin": "http://" + own},
		{"Content-Type": "application/json", "Host": "localhost:" + u.Port(), "Origin": "http://localhost:" + u.Port()},
		{"Content-Type": "application/json", "Host": "LOCALHOST"},
		{"Content-Type": "application/json", "Host": "[::1]:9999"}, // a tunnel's port
		{"Content-Type": "application/json", "Host": "127.0.0.2:" + u.Port()},
	} {
		if r := do(t, request(t, "POST", base, "/dlq/replay", `{"all": true, "dry_run": true}`, headers)); r.code != 200 || !strings.Contains(r.body, `"count": 1`) {
			t.Errorf("dry run with %v: %d %s", headers, r.code, r.body)
		}
		h := map[string]string{"Host": headers["Host"]}
		if h["Host"] == "" {
			h["Host"] = own
		}
		if r := do(t, request(t, "GET", base, "/dlq/"+id, "", h)); r.code != 200 {
			t.Errorf("show with Host %s: %d %s", h["Host"], r.code, r.body)
		}
	}

	// With a token, the token guards reads and the Host is not checked (the
	// server may listen on a public name), but writes still need their own
	// Origin and application/json.
	const token = "T0ken-for-browsers"
	guarded := serve(t, admin.Config{Token: token}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	bearer := "Bearer " + token
	if r := do(t, request(t, "GET", guarded, "/dlq", "", map[string]string{"Host": "relay.internal:9090", "Authorization": bearer})); r.code != 200 {
		t.Fatalf("GET /dlq with the token and a public Host: %d %s", r.code, r.body)
	}
	if r := do(t, request(t, "POST", guarded, "/dlq/purge", purgeAll, map[string]string{"Authorization": bearer, "Origin": "http://evil", "Content-Type": "application/json"})); r.code != 403 {
		t.Fatalf("cross-origin purge with the token: %d %s", r.code, r.body)
	}
	if r := do(t, request(t, "POST", guarded, "/dlq/purge", purgeAll, map[string]string{"Authorization": bearer, "Content-Type": "text/plain"})); r.code != 415 {
		t.Fatalf("text/plain purge with the token: %d %s", r.code, r.body)
	}
	if got := tb.state(t, seq, "hook"); got != "dead" {
		t.Fatalf("dead letter after refused requests: %s, want dead", got)
	}
}

// TestMethodsAreChecked covers requests with methods the endpoints do not
// document (a GET to /dlq/replay used to be read as "show the event
// replay"): each answers 405 with an Allow header and a JSON error, and
// nothing changes.
func TestMethodsAreChecked(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	_, seq := tb.insertDead(t, "orders", "", false, "hook")
	base := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/dlq/replay", "POST"},
		{"GET", "/dlq/purge", "POST"},
		{"PUT", "/dlq/purge", "POST"},
		{"DELETE", "/dlq/purge", "POST"},
		{"PATCH", "/dlq/replay", "POST"},
		{"DELETE", "/dlq/0190a0b0-0000-7000-8000-000000000000", "GET, HEAD"},
		{"POST", "/dlq/0190a0b0-0000-7000-8000-000000000000", "GET, HEAD"},
		{"POST", "/dlq", "GET, HEAD"},
		{"DELETE", "/dlq", "GET, HEAD"},
	} {
		r := do(t, request(t, tc.method, base, tc.path, `{"all": true}`, map[string]string{"Content-Type": "application/json"}))
		if r.code != 405 || r.hdr.Get("Allow") != tc.allow || !strings.Contains(r.body, `"error"`) {
			t.Errorf("%s %s: %d Allow %q %s, want 405 Allow %q", tc.method, tc.path, r.code, r.hdr.Get("Allow"), r.body, tc.allow)
		}
	}
	if got := tb.state(t, seq, "hook"); got != "dead" {
		t.Fatalf("dead letter: %s, want dead", got)
	}
	if r := call(t, "HEAD", base+"/dlq", "", ""); r.code != 200 {
		t.Fatalf("HEAD /dlq: %d", r.code)
	}
}

// TestDuplicateKeysAreRefused covers request bodies that repeat a key,
// which encoding/json would accept keeping the last value: {"all": false,
// "all": true} would purge everything behind a reviewer's back, as would
// the same key in another case or with a Kelvin sign for K. Each is refused
// with 400 naming the key, as are bodies nested too deep or followed by
// more data; the dead letters stay.
func TestDuplicateKeysAreRefused(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	_, seq := tb.insertDead(t, "orders", "k", false, "hook")
	base := serve(t, admin.Config{}, admin.Deps{DB: tb.pool, DeadLetters: tb.store})
	for body, want := range map[string]string{
		`{"all": false, "all": true}`:                               `duplicate key \"all\"`,
		`{"all": false, "ALL": true}`:                               `duplicate key \"ALL\" (the same field as \"all\"`,
		`{"key": "x", "\u212Aey": "k", "all": false}`:               `(the same field as \"key\"`,
		`{"topic": "a", "ids": [], "dry_run": false, "ids": ["x"]}`: `duplicate key \"ids\"`,
		`{"all": true, "x": {"a": 1, "a": 2}}`:                      `duplicate key \"a\" in x`,
		`{"all": true} {"all": false}`:                              "data after the JSON object",
		`{"ids": [[[[[[[[[["x"]]]]]]]]]]}`:                          "nested deeper than 8 levels",
	} {
		for _, op := range []string{"purge", "replay"} {
			r := call(t, "POST", base+"/dlq/"+op, "", body)
			if r.code != 400 || !strings.Contains(r.body, want) {
				t.Errorf("POST /dlq/%s %s: %d %s, want 400 containing %s", op, body, r.code, r.body, want)
			}
		}
	}
	if got := tb.state(t, seq, "hook"); got != "dead" {
		t.Fatalf("dead letter: %s, want dead", got)
	}
	if r := call(t, "POST", base+"/dlq/purge", "", `{"key": "k", "sink": "hook"}`); r.code != 200 || !strings.Contains(r.body, `"count": 1`) {
		t.Fatalf("a body without repeated keys: %d %s", r.code, r.body)
	}
}
