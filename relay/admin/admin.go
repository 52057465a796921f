// Package admin is the relay's HTTP admin server:
//
//	GET  /healthz          200 while the process runs
//	GET  /readyz           200 when the database answers within ReadyTimeout
//	                       and no sink has been paused longer than
//	                       ReadyPauseThreshold; 503 with the reasons otherwise
//	GET  /metrics          Prometheus metrics
//	GET  /dlq              dead letters, one per event and sink, as a JSON
//	                       array of deadletter.DeadLetter (query: id, topic,
//	                       key, sink, error, since, until, older_than, limit,
//	                       after_seq, after_sink)
//	GET  /dlq/{id}         one event and its deliveries (deadletter.Event)
//	POST /dlq/replay       replay dead letters (JSON body, see Selection;
//	                       answer, see OperationResult)
//	POST /dlq/purge        delete dead letters (same)
//	/ui/                   the web console, when Opts.Console is set
//
// NewForRelay builds the server of one relay, console included: it is what
// `relay run` serves, and the one call an embedding service makes. New
// builds the JSON endpoints alone from functions the caller supplies.
//
// The /dlq endpoints require "Authorization: Bearer <token>" when a token is
// configured, compared in constant time. A token is required whenever the
// server listens on anything but a loopback address.
//
// # Browsers
//
// Without a token, any page a browser on the same machine opens could
// otherwise reach the API. So the /dlq endpoints refuse, with 403 and a JSON
// error naming the reason:
//
//   - when no token is configured, a request whose Host is not a loopback
//     name (localhost, 127.0.0.0/8, ::1, with any port): a page on a
//     domain that resolves to 127.0.0.1 (DNS rebinding) sends its own name;
//   - a POST whose Origin header is present and is not this server's own
//     (http:// or https:// followed by the request's Host).
//
// A POST whose Content-Type is not application/json is refused with 415:
// a page can send text/plain across origins without a preflight, never
// application/json. A POST body that repeats a key in one object (compared
// as encoding/json matches fields, ignoring case) is refused with 400 naming
// the key, rather than letting the last one silently win.
//
// The console under /ui/ gets the same Host and Origin checks; it signs its
// users in with the token itself (a session cookie, CSRF tokens on its
// forms), so it is not asked for the bearer header. GET /dlq and GET
// /dlq/{id} answer 405 to other methods, and /dlq/replay and /dlq/purge to
// anything but POST, with an Allow header.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// DefaultListen is the address the admin server listens on by default.
const DefaultListen = "127.0.0.1:9090"

// Config configures the admin server.
type Config struct {
	// Listen is the host:port to listen on. Defaults to DefaultListen.
	Listen string
	// Token, when set, is the bearer token the /dlq endpoints require. It is
	// required when Listen is not a loopback address.
	Token sinkconfig.Secret
	// ReadyPauseThreshold is how long a sink may stay paused (down) before
	// /readyz reports the relay not ready. Defaults to 1 minute.
	ReadyPauseThreshold time.Duration
	// ReadyTimeout bounds the database check of /readyz. Defaults to 2s.
	ReadyTimeout time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.ReadyPauseThreshold == 0 {
		c.ReadyPauseThreshold = time.Minute
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 2 * time.Second
	}
	return c
}

// Validate returns an error naming the first invalid field by its config
// file key (admin.listen, admin.token, ...).
func (c Config) Validate() error {
	loopback, err := IsLoopback(c.Listen)
	if err != nil {
		return fmt.Errorf("admin.listen: %w", err)
	}
	switch {
	case !loopback && c.Token == "":
		return fmt.Errorf("admin.token: required when admin.listen (%s) is not a loopback address: the dead-letter API would be open to the network", c.Listen)
	case c.ReadyPauseThreshold < 0:
		return fmt.Errorf("admin.ready_pause_threshold: must not be negative, got %s", c.ReadyPauseThreshold)
	case c.ReadyTimeout < 0:
		return fmt.Errorf("admin.ready_timeout: must not be negative, got %s", c.ReadyTimeout)
	}
	return nil
}

// IsLoopback reports whether a host:port listen address only accepts
// connections from this machine: localhost or a loopback IP. An empty host
// listens on every interface.
func IsLoopback(listen string) (bool, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return false, fmt.Errorf("%q is not host:port", listen)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return false, fmt.Errorf("%q: port %q is not a number from 0 to 65535", listen, port)
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false, nil // a host name (or empty): may resolve to anything
	}
	return ip.IsLoopback(), nil
}

// Pinger checks the database answers; *pgxpool.Pool is one. A *sql.DB
// (MySQL) has PingContext instead: wrap it in a type whose Ping calls it,
// as cmd/relay does.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Deps are what the server reports on.
type Deps struct {
	// DB is checked by /readyz.
	DB Pinger
	// PausedSinks returns the paused sinks and since when;
	// (*relay.Relay).PausedSinks. Nil means none are ever paused.
	PausedSinks func() map[string]time.Time
	// RecordFailure returns since when the relay cannot record what it
	// publishes (it publishes nothing meanwhile) and why, the zero time
	// when it records fine; (*relay.Relay).RecordFailure. Nil means never.
	RecordFailure func() (time.Time, error)
	// Superseded returns since when a relay with a newer configuration
	// (routes and sinks) has been live, so that this one claims nothing,
	// the zero time when none is; (*relay.Relay).Superseded. Nil means
	// never.
	Superseded func() time.Time
	// SinkErrors returns the latest check of every checked sink
	// (sinks.Checker): nil for one that answered, else why it did not.
	// Nil means no sink is checked.
	SinkErrors func() map[string]error
	// Metrics serves /metrics. Nil leaves /metrics out.
	Metrics http.Handler
	// DeadLetters serves the /dlq endpoints.
	DeadLetters *deadletter.Store
	// Logger receives the server's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// Server is the admin HTTP server.
type Server struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	mux  *http.ServeMux
}

// New returns a server of the JSON endpoints, without the console; it does
// not listen until Serve.
func New(cfg Config, deps Deps) (*Server, error) { return newServer(cfg, deps, nil) }

// newServer returns a server that also serves ui, when not nil, under /ui/.
func newServer(cfg Config, deps Deps, ui http.Handler) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.DB == nil || deps.DeadLetters == nil {
		return nil, errors.New("admin: Deps.DB and Deps.DeadLetters are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, deps: deps, log: deps.Logger, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	if deps.Metrics != nil {
		s.mux.Handle("GET /metrics", deps.Metrics)
	}
	// Methods are checked by hand, not in the patterns: "GET /dlq/{id}"
	// would also answer GET /dlq/replay, and the mux's own 405 is not JSON.
	s.mux.Handle("/dlq", s.authorized(allow(s.dlqList, http.MethodGet, http.MethodHead)))
	s.mux.Handle("/dlq/{id}", s.authorized(allow(s.dlqShow, http.MethodGet, http.MethodHead)))
	s.mux.Handle("/dlq/replay", s.authorized(allow(s.changing(s.dlqReplay), http.MethodPost)))
	s.mux.Handle("/dlq/purge", s.authorized(allow(s.changing(s.dlqPurge), http.MethodPost)))
	if ui != nil {
		s.mux.Handle("/ui/", s.browserGuard(ui))
	}
	return s, nil
}

// Logger returns the logger the server writes to.
func (s *Server) Logger() *slog.Logger { return s.log }

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler { return s.mux }

// Listen opens the configured address. Serve it with Serve.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin server: listening on %s: %w", s.cfg.Listen, err)
	}
	return ln, nil
}

// Serve answers requests on ln until ctx ends, then shuts down gracefully
// (within 5 seconds) and returns nil.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutCtx)
	}()
	s.log.InfoContext(ctx, "admin: listening", "address", ln.Addr().String(), "dlq_auth", s.cfg.Token != "")
	err := srv.Serve(ln)
	<-stopped
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("admin server: %w", err)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readiness is the /readyz answer.
type readiness struct {
	Ready    bool              `json:"ready"`
	Database string            `json:"database"`
	Paused   map[string]string `json:"paused_sinks,omitempty"`
	// Sinks is the latest check of each checked sink: "ok" or the error.
	Sinks map[string]string `json:"sinks,omitempty"`
	// RecordingFailingSince is when the relay last recorded what it
	// published, if it has been failing since.
	RecordingFailingSince string `json:"recording_failing_since,omitempty"`
	// SupersededSince is when a relay with a newer configuration became
	// live, if one is.
	SupersededSince string   `json:"superseded_since,omitempty"`
	Problems        []string `json:"problems,omitempty"`
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	out := readiness{Ready: true, Database: "ok"}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	if err := s.deps.DB.Ping(ctx); err != nil {
		out.Ready, out.Database = false, "unreachable"
		out.Problems = append(out.Problems, fmt.Sprintf("database did not answer within %s", s.cfg.ReadyTimeout))
	}
	if s.deps.PausedSinks != nil {
		now := time.Now()
		for name, since := range s.deps.PausedSinks() {
			if out.Paused == nil {
				out.Paused = map[string]string{}
			}
			out.Paused[name] = since.UTC().Format(time.RFC3339)
			if d := now.Sub(since); d > s.cfg.ReadyPauseThreshold {
				out.Ready = false
				out.Problems = append(out.Problems, fmt.Sprintf("sink %s paused for %s (threshold %s)", name, d.Round(time.Second), s.cfg.ReadyPauseThreshold))
			}
		}
		slices.Sort(out.Problems)
	}
	if s.deps.SinkErrors != nil {
		var failing []string
		for name, err := range s.deps.SinkErrors() {
			if out.Sinks == nil {
				out.Sinks = map[string]string{}
			}
			out.Sinks[name] = "ok"
			if err != nil {
				out.Sinks[name] = err.Error()
				failing = append(failing, fmt.Sprintf("sink %s check failed: %v", name, err))
			}
		}
		if len(failing) > 0 {
			out.Ready = false
			slices.Sort(failing)
			out.Problems = append(out.Problems, failing...)
		}
	}
	if s.deps.RecordFailure != nil {
		if since, err := s.deps.RecordFailure(); !since.IsZero() {
			out.Ready = false
			out.RecordingFailingSince = since.UTC().Format(time.RFC3339)
			out.Problems = append(out.Problems, fmt.Sprintf("recording outcomes has failed for %s, so nothing is published: %v",
				time.Since(since).Round(time.Second), err))
		}
	}
	if s.deps.Superseded != nil {
		if since := s.deps.Superseded(); !since.IsZero() {
			out.Ready = false
			out.SupersededSince = since.UTC().Format(time.RFC3339)
			out.Problems = append(out.Problems, fmt.Sprintf("a relay with a newer configuration (routes and sinks) has been live for %s: "+
				"this relay claims nothing until it stops or this one is restarted with that configuration", time.Since(since).Round(time.Second)))
		}
	}
	code := http.StatusOK
	if !out.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, out)
}

// authorized requires the bearer token when one is configured, and a
// loopback Host when none is (see the package documentation).
func (s *Server) authorized(h http.HandlerFunc) http.Handler {
	want := []byte(s.cfg.Token.Reveal())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(want) == 0 {
			if !s.hostAllowed(w, r) {
				return
			}
		} else {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="herald-admin"`)
				writeError(w, http.StatusUnauthorized, "a valid bearer token is required")
				return
			}
		}
		h(w, r)
	})
}

// browserGuard serves the console with the checks the API makes against
// pages in the operator's browser: a loopback Host when no token is
// configured, and this server's Origin on anything but GET and HEAD. The
// console asks for the token itself.
func (s *Server) browserGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Token == "" && !s.hostAllowed(w, r) {
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !s.sameOrigin(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostAllowed refuses with 403, and reports false, a request whose Host is
// not a loopback name: without a token, that is what stops a page on a
// domain rebound to 127.0.0.1.
func (s *Server) hostAllowed(w http.ResponseWriter, r *http.Request) bool {
	if loopbackHost(r.Host) {
		return true
	}
	s.log.WarnContext(r.Context(), "admin: request refused: Host is not a loopback name", "host", clip(r.Host), "remote", r.RemoteAddr)
	writeError(w, http.StatusForbidden, fmt.Sprintf("Host %q is not a loopback name: without admin.token the API only answers "+
		"requests addressed to localhost, 127.0.0.1 or [::1] (this refuses DNS rebinding)", clip(r.Host)))
	return false
}

// loopbackHost reports whether a Host header names this machine: localhost
// or a loopback IP, with or without a port. The port is not checked: a
// tunnel (ssh -L) may forward another one.
func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// allow answers 405, with an Allow header, to a request whose method is
// not one of methods.
func allow(h http.HandlerFunc, methods ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(methods, r.Method) {
			list := strings.Join(methods, ", ")
			w.Header().Set("Allow", list)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed here (allowed: %s)", r.Method, list))
			return
		}
		h(w, r)
	}
}

// changing guards a request that changes state against a browser sending
// it from another origin: its Origin, when present, must be this server's,
// and its body must be declared application/json, a type no page can send
// across origins without a preflight this server never answers.
func (s *Server) changing(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.sameOrigin(w, r) {
			return
		}
		ct := r.Header.Get("Content-Type")
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			s.log.WarnContext(r.Context(), "admin: request refused: not application/json", "content_type", clip(ct), "remote", r.RemoteAddr)
			writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: the body must be sent as application/json", clip(ct)))
			return
		}
		h(w, r)
	}
}

// sameOrigin refuses with 403, and reports false, a request whose Origin
// header is present and is not this server's (http:// or https:// and the
// request's Host).
func (s *Server) sameOrigin(w http.ResponseWriter, r *http.Request) bool {
	for _, o := range r.Header.Values("Origin") {
		if !strings.EqualFold(o, "http://"+r.Host) && !strings.EqualFold(o, "https://"+r.Host) {
			s.log.WarnContext(r.Context(), "admin: request refused: cross-origin", "origin", clip(o), "host", clip(r.Host), "remote", r.RemoteAddr)
			writeError(w, http.StatusForbidden, fmt.Sprintf("Origin %q is not this server's (http://%s): cross-origin requests are refused", clip(o), clip(r.Host)))
			return false
		}
	}
	return true
}

// maxShown bounds a request header quoted in a log or an error: the
// client's text, possibly hostile.
const maxShown = 200

// clip returns s cut to maxShown bytes on a rune boundary, with an ellipsis
// when cut.
func clip(s string) string {
	if len(s) <= maxShown {
		return s
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// writeJSON answers code with v as JSON. The body is encoded before the
// status is sent: a value that cannot be encoded is a 500, never a 200 with
// an empty body.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code = http.StatusInternalServerError
		body, _ = json.Marshal(map[string]string{"error": "the answer could not be encoded as JSON: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
