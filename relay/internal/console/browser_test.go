package console_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// TestBrowserOverviewShowsPauseAndRecovery: the webhook refuses the sink
// (403, which pauses it), and the overview, refreshing itself, shows the
// sink paused with why; once the endpoint takes events again it shows it
// flowing, with the event delivered.
func TestBrowserOverviewShowsPauseAndRecovery(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusForbidden)
	e.rc.body.Store("no entry")
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#sink-hook")))
	if got := text(t, ctx, "#sink-hook .state"); got != "flowing" {
		t.Fatalf("before any event: sink state %q, want flowing", got)
	}
	id := e.insert(t, "orders.created", "o-1", `{"total": 12}`, nil)
	// The page is not reloaded: the 2 s refresh brings the change.
	waitFor(t, ctx, `document.querySelector('#sink-hook [data-state="paused"]') !== null`)
	if got := text(t, ctx, "#sink-hook .error-text"); !strings.Contains(got, "403") {
		t.Errorf("paused sink's last error %q, want the endpoint's 403", got)
	}
	if got := text(t, ctx, "#relays .lanes"); got != "64 (0–63)" {
		t.Errorf("relay lanes %q, want all 64 held by the one relay, as a range", got)
	}
	shoot(t, ctx, "overview-paused")
	e.rc.answer.Store(http.StatusOK)
	e.rc.waitDelivered(t, []string{id})
	waitFor(t, ctx, `document.querySelector('#sink-hook [data-state="flowing"]') !== null`)
	waitFor(t, ctx, `document.querySelector('#sink-hook polyline.delivered') !== null`)
	shoot(t, ctx, "overview")
}

// TestBrowserOverviewShowsRefusals: an endpoint refusing every event
// (400, a permanent error) makes dead letters, not a pause: the overview
// shows the sink failing, not flowing, with the endpoint's answer as its
// last error (without the event id the row does not show) and the dead
// letters of the last minute. Once the endpoint takes events again, the
// sink is refusing while those dead letters are recent.
func TestBrowserOverviewShowsRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusBadRequest)
	e.rc.body.Store("amount must be positive")
	for i := range 5 {
		e.insert(t, "orders.created", fmt.Sprintf("o-%d", i), `{"amount": -1}`, nil)
	}
	e.waitDead(t, 5)
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/"))
	waitFor(t, ctx, `document.querySelector('#sink-hook [data-state="failing"]') !== null`)
	lastError := text(t, ctx, "#sink-hook .error-text")
	if !strings.Contains(lastError, "400 Bad Request") || !strings.Contains(lastError, "amount must be positive") ||
		strings.Contains(lastError, "publishing event") {
		t.Errorf("last error %q, want the endpoint's answer without the event's id", lastError)
	}
	if got := text(t, ctx, "#sink-hook .dead"); got != "5 +5 last min" {
		t.Errorf("dead column %q, want 5 with 5 in the last minute", got)
	}
	// The rate counts complete 5 s steps: it shows once the step ends.
	waitFor(t, ctx, `document.querySelector('#sink-hook td:nth-child(6)').textContent !== '0'`)
	shoot(t, ctx, "overview-failing")
	// Deliveries get through again; the recent dead letters remain.
	e.rc.answer.Store(http.StatusOK)
	id := e.insert(t, "orders.created", "o-ok", `{"amount": 3}`, nil)
	e.rc.waitDelivered(t, []string{id})
	waitFor(t, ctx, `document.querySelector('#sink-hook [data-state="refusing"]') !== null`)
	if got := text(t, ctx, "#delivered"); got == "0" {
		t.Errorf("deliveries of the last minute %q after one delivered", got)
	}
}

// TestBrowserEventAfterReplay: an event replayed from its page and then
// delivered has no row left (retention off); its page says it was
// delivered, with a link back, instead of "not found". An id no event has
// is a 404 that says what leaves no row.
func TestBrowserEventAfterReplay(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusUnprocessableEntity)
	e.rc.body.Store("order rejected")
	id := e.insert(t, "orders.created", "o-1", `{"n": 1}`, nil)
	e.waitDead(t, 1)
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/event/"+id))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#event-replay")))
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#event-replay")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#dry-count")))
	e.rc.answer.Store(http.StatusOK)
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#confirm")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#result")))
	e.rc.waitDelivered(t, []string{id})
	e.waitGone(t, id)
	if code := navigate(t, ctx, chromedp.Click(chromedp.CSS("#to-event"))); code != http.StatusOK {
		t.Errorf("the delivered event's page: %d, want 200", code)
	}
	status := text(t, ctx, "#gone-status")
	if !strings.HasPrefix(status, "Delivered: this console replayed its dead letters") || strings.Contains(text(t, ctx, "main"), "Not Found") {
		t.Errorf("the delivered event's page says %q", status)
	}
	if got := text(t, ctx, "#gone"); !strings.Contains(got, "With retention off (relay.retention: 0, the default), a delivered event's row is deleted at once") {
		t.Errorf("the page does not say why the row is gone:\n%s", got)
	}
	if got := eval[string](t, ctx, `document.querySelector('#back-dead').getAttribute('href')`); got != "/ui/dead" {
		t.Errorf("link back %q", got)
	}
	shoot(t, ctx, "event-delivered")

	unknown := "0190a0b0-0000-7000-8000-00000000abcd"
	if code := navigate(t, ctx, chromedp.Navigate(e.base+"/ui/event/"+unknown)); code != http.StatusNotFound {
		t.Errorf("an unknown id: %d, want 404", code)
	}
	if got := text(t, ctx, "#gone"); !strings.Contains(got, "No event "+unknown+" is in the outbox") || !strings.Contains(got, "relay.retention: 0") {
		t.Errorf("an unknown id's page:\n%s", got)
	}
}

// TestBrowserDeadLetters: 50 events dead-lettered by a webhook answering
// 422 appear on the dead-letter page; a topic filter narrows them to 30;
// once the webhook takes events again, "replay all that match" (after a
// confirmation saying 30) delivers those 30, checked at the receiver; the
// other 20 are purged the same way, and none of them is delivered.
func TestBrowserDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusUnprocessableEntity)
	e.rc.body.Store("order rejected")
	var orders []string
	for i := range 30 {
		orders = append(orders, e.insert(t, "orders.created", fmt.Sprintf("o-%d", i), fmt.Sprintf(`{"n": %d}`, i), nil))
	}
	for i := range 20 {
		e.insert(t, "payments.settled", fmt.Sprintf("p-%d", i), fmt.Sprintf(`{"n": %d}`, i), nil)
	}
	e.waitDead(t, 50)

	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/dead"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#match-count")))
	if got := text(t, ctx, "#match-count"); got != "50" {
		t.Fatalf("match count %q, want 50", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#dead tr.dead-row').length`); n != 50 {
		t.Fatalf("%d rows, want 50", n)
	}
	if got := text(t, ctx, "#dead tr.dead-row .error-text"); !strings.HasPrefix(got, `endpoint answered 422 Unprocessable Entity: "order rejected"`) {
		t.Errorf("the rows show %q, want the endpoint's answer without the event id and sink the row shows", got)
	}
	if got := eval[string](t, ctx, `document.querySelector('#dead tr.dead-row .error-text').title`); !strings.HasPrefix(got, "publishing event ") {
		t.Errorf("the error cell's title %q, want the whole stored text", got)
	}
	if eval[bool](t, ctx, `document.querySelector('#f-topic').hasAttribute('placeholder')`) || !strings.Contains(text(t, ctx, "#f-topic-hint"), "orders.*") {
		t.Errorf("the topic filter has a placeholder that reads as a filter, or no hint")
	}
	shoot(t, ctx, "dead-letters")
	// Newest first by default; the column header turns it around.
	firstTopic := `document.querySelector('#dead tr.dead-row td.topic').textContent`
	if got := eval[string](t, ctx, firstTopic); got != "payments.settled" {
		t.Errorf("first row of the default order: %s, want the newest (payments.settled)", got)
	}
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#sort")))
	if got := eval[string](t, ctx, firstTopic); got != "orders.created" {
		t.Errorf("first row, oldest first: %s, want orders.created", got)
	}

	navigate(t, ctx, chromedp.SetValue(chromedp.CSS("#f-topic"), "orders.*"), chromedp.Click(chromedp.CSS("#apply")))
	waitFor(t, ctx, `document.querySelector('#match-count') && document.querySelector('#match-count').textContent === '30'`)
	if n := eval[int](t, ctx, `[...document.querySelectorAll('#dead td.topic')].filter(td => td.textContent !== 'orders.created').length`); n != 0 {
		t.Fatalf("%d rows of another topic under the filter", n)
	}
	e.rc.answer.Store(http.StatusOK)
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#replay-all")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#dry-count")))
	if got := text(t, ctx, "#dry-count"); got != "30" {
		t.Fatalf("confirmation count %q, want 30", got)
	}
	if e.rc.delivered() != 0 {
		t.Fatalf("the confirmation page replayed something: %d delivered", e.rc.delivered())
	}
	shoot(t, ctx, "confirm")
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#confirm")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := text(t, ctx, "#result"); !strings.HasPrefix(got, "Replayed 30 dead letters.") {
		t.Fatalf("result %q, want Replayed 30 dead letters.", got)
	}
	e.rc.waitDelivered(t, orders)

	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/dead"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#match-count")))
	if got := text(t, ctx, "#match-count"); got != "20" {
		t.Fatalf("after the replay: match count %q, want 20", got)
	}
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#purge-all")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#dry-count")))
	if got := text(t, ctx, "#dry-count"); got != "20" {
		t.Fatalf("purge confirmation count %q, want 20", got)
	}
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#confirm")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := text(t, ctx, "#result"); !strings.HasPrefix(got, "Purged 20 dead letters.") {
		t.Fatalf("result %q, want Purged 20 dead letters.", got)
	}
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#back")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#empty")))
	if got := e.rc.delivered(); got != 30 {
		t.Fatalf("the receiver has %d events, want the 30 replayed", got)
	}
}

// TestBrowserEventPageAndHeldKeys: a key whose first event keeps failing
// (500) holds back the two after it; the held-keys page lists it with 2
// waiting behind, the search box finds its head event by id, whose page
// shows the payload, headers, the retrying delivery and the key's queue;
// a binary payload is shown as hex with its length.
func TestBrowserEventPageAndHeldKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusInternalServerError)
	e.rc.body.Store("database is locked")
	head := e.insert(t, "orders.created", "customer-7", `{"order":{"id":7,"lines":[{"sku":"A-1","qty":2}]}}`, map[string]string{"tenant": "acme"})
	e.insert(t, "orders.paid", "customer-7", `{"order":7}`, nil)
	e.insert(t, "orders.shipped", "customer-7", `{"order":7}`, nil)

	// The page does not refresh itself: reload it until the key is held
	// (its head failed once) with both later events behind it.
	deadline := time.Now().Add(60 * time.Second)
	for {
		navigate(t, ctx, chromedp.Navigate(e.base+"/ui/held"))
		run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#held")))
		if eval[bool](t, ctx, `[...document.querySelectorAll('#held tbody tr')].some(tr => tr.textContent.includes('customer-7') && tr.querySelector('td.num').textContent === '2')`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("customer-7 not held with 2 behind; page:\n%s", text(t, ctx, "main"))
		}
	}
	shoot(t, ctx, "held-keys")

	navigate(t, ctx, chromedp.SetValue(chromedp.CSS("#q"), head), chromedp.Submit(chromedp.CSS("#q")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#event-id")))
	if got := text(t, ctx, "#event-id"); got != head {
		t.Fatalf("search opened %q, want %s", got, head)
	}
	payload := text(t, ctx, "#payload")
	if !strings.Contains(payload, "\n") || !strings.Contains(payload, `"sku": "A-1"`) {
		t.Errorf("payload not pretty-printed:\n%s", payload)
	}
	if got := text(t, ctx, "#headers"); !strings.Contains(got, "tenant") || !strings.Contains(got, "acme") {
		t.Errorf("headers %q, want tenant acme", got)
	}
	if got := text(t, ctx, "#deliveries"); !strings.Contains(got, "database is locked") || !strings.Contains(got, "ready") {
		t.Errorf("deliveries %q, want the retrying delivery with its error", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('table.queue tbody tr').length`); n != 3 {
		t.Errorf("the key's queue shows %d deliveries, want 3 (the head and two waiting)", n)
	}
	shoot(t, ctx, "event")

	// A binary payload: hex and length.
	var bin string
	if err := e.pool.QueryRow(t.Context(), "INSERT INTO "+e.tables.Outbox()+" (topic, payload_bin, content_type) VALUES ('blobs', '\\x00ff10', 'application/octet-stream') RETURNING id::text").Scan(&bin); err != nil {
		t.Fatal(err)
	}
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/event/"+bin))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#payload")))
	if got := text(t, ctx, "#payload-info"); !strings.Contains(got, "3 bytes, binary") {
		t.Errorf("binary payload info %q", got)
	}
	if got := text(t, ctx, "#payload"); !strings.Contains(got, "00 ff 10") {
		t.Errorf("binary payload %q, want hex 00 ff 10", got)
	}
	// The search box takes a key too.
	navigate(t, ctx, chromedp.SetValue(chromedp.CSS("#q"), "customer-7"), chromedp.Submit(chromedp.CSS("#q")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("table.queue")))
	if got := eval[string](t, ctx, `document.querySelector('h1').textContent`); got != "Key customer-7" {
		t.Errorf("key search opened %q", got)
	}
}

// TestBrowserEscapesHostileText: a topic, key, header, payload and the
// endpoint's error text carrying <script> and onerror= render as text on
// every page that shows them: no dialog opens and no element is injected.
func TestBrowserEscapesHostileText(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{})
	ctx, dialogs := newTab(t)
	const (
		script = `<script>alert("topic")</script>`
		img    = `<img src=x onerror=alert("key")>`
	)
	e.rc.answer.Store(http.StatusUnprocessableEntity)
	e.rc.body.Store(`<img src=x onerror=alert("error")><script>alert("error")</script>`)
	id := e.insert(t, script, img, `{"html": "<img src=x onerror=alert(\"payload\")>", "s": "</pre><script>alert(\"payload\")</script>"}`,
		map[string]string{`<script>alert("h")</script>`: `"><img src=x onerror=alert("header")>`})
	e.waitDead(t, 1)
	injected := `document.querySelectorAll('img, script:not([src]), main script').length`
	for _, path := range []string{"/ui/dead", "/ui/event/" + id, "/ui/key?key=" + img, "/ui/dead?topic=" + strings.ReplaceAll(script, `"`, "%22")} {
		navigate(t, ctx, chromedp.Navigate(e.base+path))
		run(t, ctx, chromedp.WaitVisible(chromedp.CSS("main")))
		if n := eval[int](t, ctx, injected); n != 0 {
			html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
			t.Fatalf("%s: %d injected elements:\n%s", path, n, html)
		}
		if !eval[bool](t, ctx, `document.querySelector('main').textContent.includes('<script>alert("topic")</script>')`) {
			t.Errorf("%s: the topic is not shown as text", path)
		}
	}
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/event/"+id))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#payload")))
	for sel, want := range map[string]string{
		"#event-topic": script,
		"#event-key":   img,
		"#payload":     `"html": "<img src=x onerror=alert(\"payload\")>"`,
		"#headers":     `"><img src=x onerror=alert("header")>`,
		"#deliveries":  `<img src=x onerror=alert(\"error\")>`,
	} {
		if got := text(t, ctx, sel); !strings.Contains(got, want) {
			t.Errorf("%s shows %q, want it to contain %q", sel, got, want)
		}
	}
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

// TestBrowserReadOnly: a read-only console shows no replay or purge
// button or checkbox, and answers their POSTs, with a valid session and
// CSRF token, with 403; the dead letter stays.
func TestBrowserReadOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, envOpts{readOnly: true})
	ctx, _ := newTab(t)
	e.rc.answer.Store(http.StatusUnprocessableEntity)
	id := e.insert(t, "orders.created", "o-1", `{}`, nil)
	e.waitDead(t, 1)
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/dead"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#dead")))
	if n := eval[int](t, ctx, `document.querySelectorAll('main button, main input[type=checkbox]').length`); n != 1 { // the filter's own button
		t.Errorf("read-only dead-letter page has %d buttons and checkboxes, want only the filter's", n)
	}
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/event/"+id))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#deliveries")))
	if n := eval[int](t, ctx, `document.querySelectorAll('main button, main form[action*="dead"]').length`); n != 0 {
		t.Errorf("read-only event page has %d buttons or forms", n)
	}
	shoot(t, ctx, "read-only")
	c := newClient(t, e.base)
	csrf := c.csrf(t)
	for _, path := range []string{"/ui/dead/confirm", "/ui/dead/run"} {
		code, body := c.post(t, path, map[string]string{"csrf": csrf, "op": "purge", "scope": "all"})
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("POST %s: %d, want 403 saying read-only", path, code)
		}
	}
	if n, _ := e.store.Count(t.Context(), deadFilterAll); n != 1 {
		t.Fatalf("%d dead letters after refused purges, want 1", n)
	}
}

// TestBrowserLogin: with a token, every page asks for it; a wrong one is
// refused, the right one opens a session whose cookie is HttpOnly,
// SameSite=Strict and is not the token.
func TestBrowserLogin(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-for-the-console"
	e := setup(t, envOpts{token: token, noRelay: true})
	ctx, _ := newTab(t)
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/dead"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#token")))
	shoot(t, ctx, "login")
	navigate(t, ctx, chromedp.SetValue(chromedp.CSS("#token"), "wrong"), chromedp.Submit(chromedp.CSS("#token")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#login-error")))
	cookies, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{e.base + "/ui/"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cookies.Cookies) != 0 {
		t.Fatalf("a wrong token got cookies: %+v", cookies.Cookies)
	}
	navigate(t, ctx, chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Submit(chromedp.CSS("#token")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#match-count")))
	if got := eval[string](t, ctx, `location.pathname`); got != "/ui/dead" {
		t.Errorf("after signing in: %s, want back at /ui/dead", got)
	}
	cookies, err = chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{e.base + "/ui/"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cookies.Cookies) != 1 {
		t.Fatalf("%d cookies, want the session's", len(cookies.Cookies))
	}
	ck := cookies.Cookies[0]
	if !ck.HTTPOnly || ck.SameSite != network.CookieSameSiteStrict || strings.Contains(ck.Value, token) || len(ck.Value) < 40 {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, a random value", ck)
	}
	if eval[string](t, ctx, `document.cookie`) != "" {
		t.Errorf("the page's script can read the session cookie")
	}
	// Signing out ends the session.
	navigate(t, ctx, chromedp.Click(chromedp.CSS("#sign-out")))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#token")))
	navigate(t, ctx, chromedp.Navigate(e.base+"/ui/"))
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#token")))
}
