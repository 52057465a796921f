// Package console is Herald's web console: server-rendered pages for
// operators, served by the admin server under /ui/. admin.NewForRelay
// mounts it behind the Host and Origin checks of its JSON API; it is
// internal so that nothing serves it without them.
//
//	GET  /ui/                  overview: relays and their lanes, each sink's
//	                           state (deadletter.Status's, over every relay),
//	                           last error, rates, queue, dead letters and
//	                           throughput chart
//	GET  /ui/live              the overview's body alone, polled every 2 s
//	GET  /ui/dead              dead letters: filters, keyset pages
//	POST /ui/dead/confirm      the dry run of a replay or purge: the count
//	POST /ui/dead/run          the replay or purge itself, and its result
//	GET  /ui/event/{id}        one event: payload, headers, deliveries, and
//	                           its key's queues; for an id with no row, what
//	                           became of it (delivered after a replay from
//	                           this console, purged, or what leaves no row)
//	GET  /ui/search?q=         an event id opens the event, anything else
//	                           the key's page (/ui/key?key=)
//	GET  /ui/held              keys held back on some sink
//	GET  /ui/login, POST /ui/login, POST /ui/logout
//	GET  /ui/static/...        the stylesheet and script, embedded
//
// # Security
//
// The pages are html/template, whose contextual escaping covers what an
// attacker controls: payloads, headers, topics, keys and error texts. Every
// answer carries a Content-Security-Policy that allows only this server's
// own script and stylesheet (no inline script, no inline style), forbids
// framing, and X-Content-Type-Options: nosniff.
//
// With Config.Token set, a visitor signs in once with the token and gets a
// session: a random id in an HttpOnly, SameSite=Strict cookie (Secure over
// TLS), kept in memory, bounded in number and expiring. Failed sign-ins
// are limited per client address (Config.LoginFailures per LoginWindow;
// past them 429 with Retry-After), in a bounded table. Without a token a
// session is opened on the first page; the admin server then answers only
// requests addressed to a loopback name. Either way, every request that
// changes state is a POST carrying the session's CSRF token, compared in
// constant time: 403 without it. Config.ReadOnly hides replay and purge
// and answers their POSTs with 403.
package console

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/throughput"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// Config configures the console.
type Config struct {
	// Token, when set, is asked for on a login form before any page is
	// shown (the admin server's token). Defaults to none: the console is
	// open to whoever reaches it, which the admin server limits to this
	// machine.
	Token sinkconfig.Secret
	// ReadOnly hides replay and purge and refuses them with 403. Defaults
	// to false.
	ReadOnly bool
	// MaxSessions bounds the sessions kept; signing in past it ends the
	// oldest. Defaults to 100.
	MaxSessions int
	// SessionTTL is how long a session lasts from sign-in. Defaults to 12
	// hours.
	SessionTTL time.Duration
	// LoginFailures is how many failed sign-ins a client (an address) may
	// make per LoginWindow; past them its sign-ins are answered 429 with
	// Retry-After, the token not even compared. Defaults to 5.
	LoginFailures int
	// LoginWindow is the window of LoginFailures: a client that used them
	// up may try again once every LoginWindow/LoginFailures. Defaults to
	// a minute.
	LoginWindow time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxSessions == 0 {
		c.MaxSessions = 100
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 12 * time.Hour
	}
	if c.LoginFailures == 0 {
		c.LoginFailures = 5
	}
	if c.LoginWindow == 0 {
		c.LoginWindow = time.Minute
	}
	return c
}

// Validate returns an error naming the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxSessions < 0:
		return fmt.Errorf("console: MaxSessions must not be negative, got %d", c.MaxSessions)
	case c.SessionTTL < 0:
		return fmt.Errorf("console: SessionTTL must not be negative, got %s", c.SessionTTL)
	case c.LoginFailures < 0:
		return fmt.Errorf("console: LoginFailures must not be negative, got %d", c.LoginFailures)
	case c.LoginWindow < 0:
		return fmt.Errorf("console: LoginWindow must not be negative, got %s", c.LoginWindow)
	}
	return nil
}

// Deps are what the console shows.
type Deps struct {
	// DeadLetters reads the outbox, the queues and the dead letters, and
	// replays and purges. Required.
	DeadLetters *deadletter.Store
	// Sinks are the configured sink names, shown on the overview even
	// before they carry anything.
	Sinks []string
	// Routes, when set, gives each sink's share of the pending events
	// (deadletter.Store.Status).
	Routes deadletter.RouteFunc
	// PausedSinks returns the paused sinks and since when;
	// (*relay.Relay).PausedSinks. Nil means none are ever paused.
	PausedSinks func() map[string]time.Time
	// PauseErrors returns why each paused sink is down: the error of its
	// latest publish or probe; (*relay.Relay).PauseErrors. Nil shows
	// none.
	PauseErrors func() map[string]error
	// Throughput is the per-sink history of deliveries and failures the
	// overview charts. Nil leaves the rates and charts out.
	Throughput *throughput.History
	// SinkErrors returns the latest check of every checked sink: nil for
	// one that answered. Nil means no sink is checked.
	SinkErrors func() map[string]error
	// Retention is how long the relay keeps a delivered event's row
	// (relay.Config.Retention): the event page uses it to say why an
	// event is gone. Zero, the default, means rows are deleted once
	// delivered.
	Retention time.Duration
	// Logger receives the console's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// Console serves the pages; it is an http.Handler for paths under Prefix.
type Console struct {
	cfg      Config
	deps     Deps
	log      *slog.Logger
	pages    map[string]*template.Template
	sessions *sessions
	logins   *loginLimiter
	recent   *recentOps
	mux      *http.ServeMux
}

// New returns the console.
func New(cfg Config, deps Deps) (*Console, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.DeadLetters == nil {
		return nil, errors.New("console: Deps.DeadLetters is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, deps: deps, log: deps.Logger, pages: pages, sessions: newSessions(cfg.MaxSessions, cfg.SessionTTL),
		logins: newLoginLimiter(cfg.LoginFailures, cfg.LoginWindow, maxLoginClients, time.Now),
		recent: newRecentOps(), mux: http.NewServeMux()}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET "+Prefix+"login", c.loginPage)
	c.mux.HandleFunc("POST "+Prefix+"login", c.login)
	c.mux.Handle("POST "+Prefix+"logout", c.changing(c.logout))
	c.mux.Handle("GET "+Prefix+"{$}", c.signedIn(c.overview))
	c.mux.Handle("GET "+Prefix+"live", c.signedIn(c.overviewLive))
	c.mux.Handle("GET "+Prefix+"dead", c.signedIn(c.deadLetters))
	c.mux.Handle("POST "+Prefix+"dead/confirm", c.changing(c.operating(c.confirm)))
	c.mux.Handle("POST "+Prefix+"dead/run", c.changing(c.operating(c.run)))
	c.mux.Handle("GET "+Prefix+"event/{id}", c.signedIn(c.event))
	c.mux.Handle("GET "+Prefix+"key", c.signedIn(c.key))
	c.mux.Handle("GET "+Prefix+"search", c.signedIn(c.search))
	c.mux.Handle("GET "+Prefix+"held", c.signedIn(c.held))
	return c, nil
}

// ServeHTTP answers a request under Prefix, with the security headers.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No inline script or style anywhere: the pages use the embedded files
	// only, so an injected <script> or style= attribute would not run.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer Chromium sends
	// "Origin: null" with the forms' POSTs, which the admin server's
	// Origin check refuses.
	h.Set("Referrer-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, Prefix+"static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

// page is what every template gets: the layout's fields and the page's
// own Data.
type page struct {
	Title string
	// Nav names the menu entry to mark as current.
	Nav       string
	CSRF      string
	ReadOnly  bool
	SignedIn  bool
	WithToken bool
	Data      any
}

// render writes the named page with data, or a 500 when the template
// fails (the body is rendered before the status is sent).
func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	c.renderTemplate(w, r, code, name, "layout", title, data)
}

func (c *Console) renderTemplate(w http.ResponseWriter, r *http.Request, code int, name, tmpl, title string, data any) {
	p := page{Title: title, Nav: name, ReadOnly: c.cfg.ReadOnly, WithToken: c.cfg.Token != "", Data: data}
	if s := sessionOf(r); s != nil {
		p.CSRF, p.SignedIn = s.csrf, true
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, tmpl, p); err != nil {
		c.log.ErrorContext(r.Context(), "console: rendering "+name+" failed", "error", err)
		http.Error(w, "rendering the page failed; see the relay's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// fail answers with an error page; err is logged, not shown, when the
// failure is the server's.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, doing string, err error) {
	msg := err.Error()
	if code >= 500 {
		c.log.ErrorContext(r.Context(), "console: "+doing+" failed", "error", err)
		msg = doing + " failed; see the relay's log"
	}
	c.render(w, r, code, "error", http.StatusText(code), msg)
}

// pageNames are the templates under templates/, each parsed with the
// layout.
var pageNames = []string{"overview", "dead", "confirm", "result", "event", "gone", "key", "held", "login", "error"}

func parsePages() (map[string]*template.Template, error) {
	layout, err := template.New("layout").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/queues.html")
	if err != nil {
		return nil, fmt.Errorf("console: parsing the layout: %w", err)
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing %s.html: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago":      ago,
	"at":       formatTime,
	"sinkName": sinkName,
	"seconds":  func(s float64) string { return formatDuration(time.Duration(s * float64(time.Second))) },
	"rate":     formatRate,
	// cause is an error without the event id and sink its row shows in
	// other cells; the whole text is kept for the cell's title.
	"cause": deadletter.Cause,
	"lanes": laneRanges,
}

// laneRanges shows lanes (sorted) as ranges: "0–31, 40, 42–47".
func laneRanges(lanes []int16) string {
	var b strings.Builder
	for i := 0; i < len(lanes); {
		j := i
		for j+1 < len(lanes) && lanes[j+1] == lanes[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(int(lanes[i])))
		if j > i {
			b.WriteString("–" + strconv.Itoa(int(lanes[j])))
		}
		i = j + 1
	}
	return b.String()
}

// formatRate shows a rate per second with the precision a low one needs:
// one event in the last minute is 0.02/s, not 0.0.
func formatRate(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

// sinkName shows the routing step, whose sink name is empty, by what it is.
func sinkName(s string) string {
	if s == deadletter.RoutingStep {
		return "(routing)"
	}
	return s
}

// formatTime shows a time in UTC to the second; the zero time as a dash.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago says how long ago t was, coarsely.
func ago(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + formatDuration(-d)
	}
	return formatDuration(d) + " ago"
}

// formatDuration rounds d to what a reader needs: seconds under a minute,
// minutes under an hour, then hours.
func formatDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

// clip cuts s to n bytes on a rune boundary, with an ellipsis when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
