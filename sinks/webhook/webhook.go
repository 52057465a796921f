// Package webhook is the sink that POSTs each event to an HTTP endpoint,
// signed per the Standard Webhooks specification (https://www.standardwebhooks.com).
//
// # Requests
//
// Every event is one POST to the configured URL (never to an address taken
// from the event). Each request carries:
//
//   - webhook-id: the event id, the consumer's dedupe key (the same on every
//     retry);
//   - webhook-timestamp: the unix time in seconds of this attempt;
//   - webhook-signature: "v1,<base64>" per configured secret, space
//     separated, where <base64> is the HMAC-SHA256 of the id, the timestamp
//     and the body joined with dots ("<id>.<timestamp>.<body>"), keyed with
//     the bytes that the base64 after the secret's "whsec_" encodes (see
//     Verify);
//   - Content-Type, User-Agent "herald/<version>", the configured static
//     headers, and traceparent / tracestate when the event's headers carry
//     them (lowercase names, valid header values).
//
// In the envelope format (the default) the body is a JSON object:
//
//	{"id":"0190…","topic":"orders","key":"order-42","headers":{"x-tenant":"acme"},
//	 "content_type":"application/json","created_at":"2025-01-02T03:04:05.123456Z",
//	 "payload":{"total":12}}
//
// key and headers are omitted when empty. A JSON payload is embedded as
// JSON under "payload" (compacted, not HTML-escaped); any other payload is
// base64 (standard, padded) under "payload_base64" instead: exactly one of
// the two is present. In the raw format the body is the payload bytes as is,
// with the event's content type, and every other event header travels as a
// request header named HeaderPrefix + its name, lowercased
// ("x-tenant" becomes "herald-header-x-tenant"); the prefix keeps event
// data from setting Content-Type, the signatures or the static headers. A
// header whose name is not an HTTP token or whose value holds a control
// character is not sent. The key and topic are not sent. Like the rest of
// the headers, these are not covered by the signature, which signs the id,
// timestamp and body.
//
// In the cloudevents format the request is a CloudEvent per the CloudEvents
// HTTP protocol binding (package cloudevents gives the attributes). In the
// binary mode (cloudevents.mode: binary, the default) the body is the
// payload, Content-Type is datacontenttype, and every other attribute is a
// ce- header with a percent-encoded value (ce-specversion, ce-id,
// ce-source, ce-type, ce-subject, ce-time, and the extensions: ce-traceparent,
// ce-tracestate, ce-<header> for event headers with [a-z0-9] names). In the
// structured mode the body is the JSON event format with Content-Type
// application/cloudevents+json. The webhook-* headers and their signature
// of the body are sent in both.
//
// # Results
//
// 2xx is success. 408, 429, 5xx, timeouts and broken connections are
// retryable; a Retry-After header (seconds or HTTP date) on them is reported
// with sinks.RetryAfter. 401 and 403 mean the endpoint refuses Herald itself
// (a wrong token or secret), so they are sinks.Unavailable, like refused
// connections, DNS failures and TLS handshake or certificate failures: the
// relay pauses the sink instead of failing events. Other 3xx and 4xx are
// permanent. retry_on and permanent_on override these classes per status.
//
// # Redirects
//
// Redirects are not followed unless follow_redirects is true, and then only
// 307 and 308 (which resend the same POST), at most 10, and only within the
// endpoint's origin (scheme, host and port). A redirect to another origin
// is refused, as a permanent error naming the Location: the request carries
// the configured headers, secrets such as an API key, and the signatures,
// and refusing keeps all of them from a host nobody configured. Stripping
// them instead would deliver the event unauthenticated to that host. To
// follow an endpoint that moved, update url.
//
// A request the HTTP client could never build fails permanently, naming
// the field. The only request part taken from the event that the client
// checks is the raw format's Content-Type, the event's content_type: one
// holding a control character (CR, LF, NUL…) is refused before sending. The
// URL and the header names come from the configuration, and static header
// values are checked when it is loaded.
//
// # Delivery
//
// Delivery is at least once: an event whose response was lost is sent again
// with the same webhook-id. Events of one key are sent one after the other in
// order; once one fails, the later ones of that key in the same Publish are
// not sent (sinks.ErrSkipped). Events of different keys, and events without a
// key, are sent concurrently, at most Concurrency at a time over all the
// relay's calls at once.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Sink POSTs events to one endpoint. It implements sinks.Sink.
type Sink struct {
	name   string
	cfg    Config
	url    *url.URL
	keys   [][]byte
	static http.Header
	client *http.Client
	logger *slog.Logger
	agent  string
	// limit bounds the requests in flight over every Publish call.
	limit *sinks.Limiter
}

// New returns a sink called name. It validates cfg and fills its defaults;
// connections are opened on first use. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("webhook sink %s: %w", name, err)
	}
	// Validate checked these three.
	u, _ := cfg.endpoint()
	keys, _ := cfg.keys()
	tlsCfg, _ := cfg.TLS.Build("tls")

	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   cfg.Timeout,
		MaxIdleConns:          cfg.Concurrency,
		MaxIdleConnsPerHost:   cfg.Concurrency,
		MaxConnsPerHost:       cfg.Concurrency,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	client := &http.Client{Transport: transport, CheckRedirect: checkRedirect(cfg.FollowRedirects)}
	static := http.Header{}
	for k, v := range cfg.Headers {
		static.Set(k, v.Reveal())
	}
	if len(keys) == 0 {
		logger.Warn("webhook: sink has no secret, requests are not signed", "sink", name)
	}
	logger.Debug("webhook: sink ready", "sink", name, "endpoint", u.Scheme+"://"+u.Host,
		"format", string(cfg.Format), "concurrency", cfg.Concurrency, "signatures", len(keys))
	return &Sink{name: name, cfg: cfg, url: u, keys: keys, static: static, client: client,
		logger: logger, agent: "herald/" + version(), limit: sinks.NewLimiter(cfg.Concurrency)}, nil
}

// checkRedirect follows only 307 and 308, which resend the same POST, only
// when asked, and only within the endpoint's origin; otherwise the 3xx
// response itself is returned and failed, or, for another origin, a
// *redirectError.
func checkRedirect(follow bool) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		code := req.Response.StatusCode
		if !follow || len(via) > 10 || code != http.StatusTemporaryRedirect && code != http.StatusPermanentRedirect {
			return http.ErrUseLastResponse
		}
		if origin(req.URL) != origin(via[0].URL) {
			return &redirectError{status: req.Response.Status, location: req.Response.Header.Get("Location")}
		}
		return nil
	}
}

// origin is u's scheme, host and port, lower-cased, with the scheme's
// default port written out: two URLs of one origin give the same string.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	switch {
	case port != "":
	case scheme == "https":
		port = "443"
	default:
		port = "80"
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// redirectError is a redirect to another origin, refused because the
// request carries the configured headers and the signatures.
type redirectError struct {
	status, location string
}

// maxLocationShown bounds the Location an error quotes: it is the
// endpoint's text.
const maxLocationShown = 512

func (e *redirectError) Error() string {
	loc := e.location
	if len(loc) > maxLocationShown {
		loc = strings.ToValidUTF8(loc[:maxLocationShown], "") + "…"
	}
	return fmt.Sprintf("endpoint redirected (%s) to %q, another origin: not followed, so that the configured headers "+
		"and the signatures do not go to another host (point url at the new address)", e.status, loc)
}

// version is Herald's module version from the build info, or "dev".
func version() string {
	bi, _ := debug.ReadBuildInfo()
	return versionFrom(bi)
}

// versionFrom finds Herald's module version in bi (nil allowed): the main
// module's, or a dependency's when Herald is a library of the binary.
func versionFrom(bi *debug.BuildInfo) string {
	const module = "github.com/heraldhq/herald"
	if bi == nil {
		return "dev"
	}
	mods := append([]*debug.Module{&bi.Main}, bi.Deps...)
	for _, m := range mods {
		if m.Path == module && m.Version != "" && m.Version != "(devel)" {
			return m.Version
		}
	}
	return "dev"
}

// Name implements sinks.Sink.
func (s *Sink) Name() string { return s.name }

// Close implements sinks.Sink: nothing is buffered; it closes idle
// connections.
func (s *Sink) Close(context.Context) error {
	s.client.CloseIdleConnections()
	return nil
}

// Publish implements sinks.Sink: one POST per event, events of one key in
// order, at most Concurrency requests in flight over all calls at once. Each
// event's result is reported as soon as its response arrives
// (sinks.PublishEach).
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	return sinks.NewResults(ctx, events, s.where).PublishEach(s.limit, s.publish)
}

// where names the sink in errors: every event goes to its one endpoint.
func (s *Sink) where(*sinks.Event) string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: calls share
// the limit of Concurrency requests in flight.
func (s *Sink) PublishesConcurrently() bool { return true }

// envelope is the request body in the envelope format.
type envelope struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	ContentType   string            `json:"content_type"`
	CreatedAt     time.Time         `json:"created_at"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitzero"` // non-nil for every non-JSON payload
}

// body returns the request body and its content type. A raw event whose
// content type cannot be sent as a header fails permanently: the HTTP client
// would refuse to build the request on every attempt.
func (s *Sink) body(e *sinks.Event) ([]byte, string, error) {
	if s.cfg.Format == FormatCloudEvents && s.cfg.CloudEvents.Structured() {
		body, err := cloudevents.Structured(*e, s.cfg.CloudEvents.Source)
		return body, cloudevents.MediaType, err
	}
	if s.cfg.Format == FormatRaw || s.cfg.Format == FormatCloudEvents {
		if !validHeaderValue(e.ContentType) {
			return nil, "", sinks.Permanent(fmt.Errorf("content_type %q holds a control character (CR, LF, NUL…) and cannot be sent "+
				"as the Content-Type header: the request can never be built", e.ContentType))
		}
		return e.Payload, e.ContentType, nil
	}
	env := envelope{ID: e.ID, Topic: e.Topic, Key: e.Key, Headers: e.Headers, ContentType: e.ContentType,
		CreatedAt: e.CreatedAt.UTC()}
	if sinks.IsJSON(e.ContentType) {
		if err := sinkconfig.CheckJSON(e.Payload); err != nil {
			return nil, "", sinks.Permanent(fmt.Errorf("%w, although its content type is %s", err, e.ContentType))
		}
		env.Payload = e.Payload
	} else {
		env.PayloadBase64 = e.Payload
		if env.PayloadBase64 == nil {
			env.PayloadBase64 = []byte{}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(env); err != nil {
		return nil, "", sinks.Permanent(fmt.Errorf("encoding envelope: %w", err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), sinks.ContentTypeJSON, nil
}

// publish sends one event and classifies the outcome.
func (s *Sink) publish(ctx context.Context, e *sinks.Event) error {
	body, contentType, err := s.body(e)
	if err != nil {
		return err
	}
	if len(body) > s.cfg.MaxBodyBytes {
		return fmt.Errorf("max_body_bytes: %w", sinks.TooLarge(len(body), s.cfg.MaxBodyBytes))
	}
	return s.send(ctx, e, body, contentType)
}

// send POSTs body once.
func (s *Sink) send(ctx context.Context, e *sinks.Event, body []byte, contentType string) error {
	reqCtx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	u := *s.url
	h := s.static.Clone()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	h["Content-Type"] = []string{contentType}
	h["User-Agent"] = []string{s.agent}
	h[HeaderID] = []string{e.ID}
	h[HeaderTimestamp] = []string{ts}
	if len(s.keys) > 0 {
		h[HeaderSignature] = []string{string(appendSignatures(nil, s.keys, e.ID, ts, body))}
	}
	for _, name := range []string{"traceparent", "tracestate"} {
		if v, ok := e.Headers[name]; ok && validHeaderValue(v) {
			h[name] = []string{v}
		}
	}
	if s.cfg.Format == FormatCloudEvents && !s.cfg.CloudEvents.Structured() {
		// Content-Type, datacontenttype's header, is set above; values are
		// percent-encoded, so every one is a valid header value.
		for _, a := range cloudevents.HTTP.Headers(cloudevents.Attributes(*e, s.cfg.CloudEvents.Source)) {
			if a.Name != cloudevents.HTTP.ContentTypeHeader {
				h[a.Name] = []string{a.Value}
			}
		}
	}
	if s.cfg.Format == FormatRaw {
		for name, v := range e.Headers {
			if name == "traceparent" || name == "tracestate" || !validHeaderName(name) || !validHeaderValue(v) {
				continue
			}
			h[HeaderPrefix+strings.ToLower(name)] = []string{v}
		}
	}
	req := (&http.Request{
		Method:        http.MethodPost,
		URL:           &u,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		GetBody:       func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		ContentLength: int64(len(body)),
		Host:          u.Host,
	}).WithContext(reqCtx)
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		err = s.transportError(ctx, reqCtx, err)
		s.logger.DebugContext(ctx, "webhook: request failed", "sink", s.name, "event", e.ID, "error", err)
		return err
	}
	snippet := readSnippet(resp.Body)
	s.logger.DebugContext(ctx, "webhook: response", "sink", s.name, "event", e.ID,
		"status", resp.StatusCode, "duration", time.Since(start))
	return s.statusError(resp, snippet)
}

// HeaderPrefix starts the request header that carries an event header in
// the raw format (the envelope has them in its body).
const HeaderPrefix = "herald-header-"

// validHeaderValue reports whether v can be sent as a header value.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// readSnippet reads the start of a response body for error messages, drains
// a little more so the connection can be reused, and closes it.
func readSnippet(body io.ReadCloser) string {
	defer body.Close()
	buf := make([]byte, 256)
	n, _ := io.ReadFull(body, buf)
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	return strings.ToValidUTF8(string(buf[:n]), string(utf8.RuneError))
}

// statusError classifies a response status.
func (s *Sink) statusError(resp *http.Response, snippet string) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	err := fmt.Errorf("endpoint answered %s", resp.Status)
	if snippet != "" {
		err = fmt.Errorf("endpoint answered %s: %q", resp.Status, snippet)
	}
	switch {
	case slices.Contains(s.cfg.PermanentOn, code):
		return sinks.Permanent(fmt.Errorf("%w (permanent_on)", err))
	case slices.Contains(s.cfg.RetryOn, code):
		return retryAfter(resp, fmt.Errorf("%w (retry_on)", err))
	case code >= 300 && code < 400:
		return sinks.Permanent(fmt.Errorf("endpoint redirected (%s) to %q, which is not followed (see follow_redirects, or update url)",
			resp.Status, resp.Header.Get("Location")))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return sinks.Unavailable(fmt.Errorf("%w: the endpoint refuses the sink (check secret and headers)", err))
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		return retryAfter(resp, err)
	default:
		return sinks.Permanent(err)
	}
}

// retryAfter marks err with sinks.RetryAfter when resp has a valid
// Retry-After header (seconds or an HTTP date).
func retryAfter(resp *http.Response, err error) error {
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return err
	}
	if secs, perr := strconv.ParseInt(v, 10, 64); perr == nil && secs >= 0 {
		return sinks.RetryAfter(err, time.Duration(min(secs, int64(time.Duration(1<<63-1)/time.Second)))*time.Second)
	}
	if at, perr := http.ParseTime(v); perr == nil {
		return sinks.RetryAfter(err, time.Until(at))
	}
	return err
}

// transportError classifies a failed round trip. It strips the *url.Error
// layer, whose message repeats the URL (which may hold a token).
func (s *Sink) transportError(ctx, reqCtx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("not delivered: %w", ctx.Err())
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var redirect *redirectError
	switch {
	case errors.As(err, &redirect):
		return sinks.Permanent(err)
	case errors.As(err, &dnsErr):
		return sinks.Unavailable(fmt.Errorf("resolving the endpoint: %w", err))
	case isTLSError(err):
		return sinks.Unavailable(fmt.Errorf("TLS handshake with the endpoint failed: %w", err))
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return sinks.Unavailable(fmt.Errorf("connecting to the endpoint: %w", err))
	case reqCtx.Err() != nil:
		return fmt.Errorf("no response within timeout %s: %w", s.cfg.Timeout, err)
	default:
		return fmt.Errorf("sending request: %w", err)
	}
}
