package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// request is one request as the receiver got it.
type request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// receiver is a real HTTP server recording what it receives; handle (nil
// means 200 OK) answers.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []request
	handle func(w http.ResponseWriter, r *http.Request, body []byte)
}

func newReceiver(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *receiver {
	t.Helper()
	rc := &receiver{handle: handle}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body.Bytes()})
	rc.mu.Unlock()
	if rc.handle != nil {
		rc.handle(w, r, body.Bytes())
	}
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.reqs...)
}

// newSecret returns a fresh random whsec_ secret.
func newSecret(t testing.TB) sinkconfig.Secret {
	t.Helper()
	return sinkconfig.Secret("whsec_" + base64.StdEncoding.EncodeToString([]byte(rand.Text())))
}

// quiet drops the logs of sinks whose logs a test does not read.
var quiet = slog.New(slog.DiscardHandler)

// newSink builds a sink closed at the end of the test.
func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	s, err := New("hook", cfg, quiet)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func publish(t *testing.T, s *Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

// rawEvent is a text event whose body the receiver can read directly in the
// raw format.
func rawEvent(key, text string) sinks.Event {
	e := sinktest.Event("unused", key, []byte(text))
	e.ContentType = "text/plain"
	return e
}

// class names how the relay would treat err.
func class(err error) string {
	switch {
	case err == nil:
		return "ok"
	case sinks.IsUnavailable(err):
		return "unavailable"
	case sinks.IsPermanent(err):
		return "permanent"
	default:
		return "retry"
	}
}

// verifyIndependently checks a Standard Webhooks signature with code of its
// own: it returns how many of the header's signatures match secret.
func verifyIndependently(t *testing.T, secret sinkconfig.Secret, h http.Header, body []byte) int {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret.Reveal(), "whsec_"))
	if err != nil {
		t.Fatalf("test secret: %v", err)
	}
	signed := fmt.Sprintf("%s.%s.%s", h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), body)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signed))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	n := 0
	for _, sig := range strings.Split(h.Get("Webhook-Signature"), " ") {
		if sig == want {
			n++
		}
	}
	return n
}

// wireEnvelope decodes an envelope body independently of the sink's types.
type wireEnvelope struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key"`
	Headers       map[string]string `json:"headers"`
	ContentType   string            `json:"content_type"`
	CreatedAt     time.Time         `json:"created_at"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
}

func conformance(t *testing.T, cfg Config, features sinktest.Features) {
	secret := newSecret(t)
	rc := newReceiver(t, nil)
	format := cfg.Format
	features.ReportsEarly = true // through sinks.Results.PublishEach
	newSink := func(t *testing.T, url string) sinks.Sink {
		cfg := cfg
		cfg.URL, cfg.Secret = url, secret
		s, err := New("hook", cfg, quiet)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return s
	}
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			return newSink(t, rc.srv.URL+"/"+destination)
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return newSink(t, "http://"+sinktest.ClosedAddr(t)+"/"+destination)
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, r := range rc.requests() {
				if r.Path != "/"+destination {
					continue
				}
				if verifyIndependently(t, secret, r.Header, r.Body) != 1 {
					t.Fatalf("request for %s has no valid signature", r.Header.Get("Webhook-Id"))
				}
				got := sinktest.Received{ID: r.Header.Get("Webhook-Id"), Destination: destination, Payload: r.Body}
				if format == FormatEnvelope {
					var env wireEnvelope
					if err := json.Unmarshal(r.Body, &env); err != nil {
						t.Fatalf("envelope: %v: %s", err, r.Body)
					}
					if env.ID != got.ID {
						t.Fatalf("envelope id %q, webhook-id %q", env.ID, got.ID)
					}
					got.Key, got.Headers, got.Payload = env.Key, env.Headers, env.Payload
					if env.PayloadBase64 != nil {
						b, err := base64.StdEncoding.DecodeString(*env.PayloadBase64)
						if err != nil {
							t.Fatalf("payload_base64: %v", err)
						}
						got.Payload = b
					}
				}
				if format == FormatCloudEvents {
					ce := readCloudEvent(t, r)
					if ce.attrs["id"] != got.ID {
						t.Fatalf("CloudEvent id %q, webhook-id %q", ce.attrs["id"], got.ID)
					}
					got.Key, got.Payload = ce.attrs["subject"], ce.data
				}
				out = append(out, got)
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2*DefaultMaxBodyBytes)
		},
		Features: features,
	})
}

func TestConformanceEnvelope(t *testing.T) {
	t.Parallel()
	conformance(t, Config{Format: FormatEnvelope}, sinktest.Features{Headers: true, Binary: true, Keys: true})
}

func TestConformanceRaw(t *testing.T) {
	t.Parallel()
	conformance(t, Config{Format: FormatRaw}, sinktest.Features{Binary: true})
}

// The suite's event headers include x-tenant, which is no valid CloudEvents
// extension name and is left out: Headers is not claimed.
func TestConformanceCloudEventsBinary(t *testing.T) {
	t.Parallel()
	conformance(t, Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/test"}},
		sinktest.Features{Binary: true, Keys: true})
}

func TestConformanceCloudEventsStructured(t *testing.T) {
	t.Parallel()
	conformance(t, Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/test"}},
		sinktest.Features{Binary: true, Keys: true})
}

func TestRequestSignedAndDescribed(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	secret := newSecret(t)
	s := newSink(t, Config{URL: rc.srv.URL + "/in", Secret: secret,
		Headers: map[string]sinkconfig.Secret{"Authorization": "Bearer abc", "X-Team": "billing"}})
	e := sinktest.Event("ignored-destination", "order-42", []byte(`{"total": 12, "note": "<b>&"}`))
	e.Topic = "orders"
	e.Headers = map[string]string{"x-tenant": "acme",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "bad\nvalue"}
	before := time.Now().Unix()
	if err := publish(t, s, e)[0]; err != nil {
		t.Fatal(err)
	}
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("received %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Method != http.MethodPost || r.Path != "/in" {
		t.Fatalf("got %s %s, want POST /in (the configured URL, not the event's destination)", r.Method, r.Path)
	}
	if n := verifyIndependently(t, secret, r.Header, r.Body); n != 1 {
		t.Fatalf("%d valid signatures in %q, want 1", n, r.Header.Get("Webhook-Signature"))
	}
	if got := r.Header.Get("Webhook-Id"); got != e.ID {
		t.Fatalf("webhook-id = %q, want %q", got, e.ID)
	}
	ts, err := strconv.ParseInt(r.Header.Get("Webhook-Timestamp"), 10, 64)
	if err != nil || ts < before || ts > time.Now().Unix() {
		t.Fatalf("webhook-timestamp = %q, want unix seconds of the request", r.Header.Get("Webhook-Timestamp"))
	}
	for name, want := range map[string]string{"Content-Type": "application/json", "Authorization": "Bearer abc",
		"X-Team": "billing", "Traceparent": e.Headers["traceparent"], "Tracestate": ""} {
		if got := r.Header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if ua := r.Header.Get("User-Agent"); !strings.HasPrefix(ua, "herald/") || len(ua) == len("herald/") {
		t.Errorf("User-Agent = %q, want herald/<version>", ua)
	}
	var env wireEnvelope
	if err := json.Unmarshal(r.Body, &env); err != nil {
		t.Fatal(err)
	}
	if env.ID != e.ID || env.Topic != "orders" || env.Key != "order-42" || env.ContentType != sinks.ContentTypeJSON ||
		!env.CreatedAt.Equal(e.CreatedAt) || env.Headers["x-tenant"] != "acme" || env.PayloadBase64 != nil {
		t.Fatalf("envelope = %+v, event = %+v", env, e)
	}
	var payload map[string]any
	if err := json.Unmarshal(env.Payload, &payload); err != nil || payload["note"] != "<b>&" || payload["total"] != 12.0 {
		t.Fatalf("payload = %s (%v)", env.Payload, err)
	}
	if !bytes.Contains(r.Body, []byte(`"<b>&"`)) {
		t.Errorf("payload was HTML-escaped: %s", r.Body)
	}

	// The consumer-side helper accepts what the sink sent, and only that.
	if err := Verify(secret, r.Header, r.Body, 5*time.Minute); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := Verify(secret, r.Header, append(r.Body, ' '), 5*time.Minute); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("Verify(tampered body) = %v, want ErrBadSignature", err)
	}
	if err := Verify(newSecret(t), r.Header, r.Body, 5*time.Minute); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("Verify(other secret) = %v, want ErrBadSignature", err)
	}
}

func TestRawFormatSendsPayloadAsIs(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw})
	e := sinktest.Event("d", "", []byte("not json {"))
	e.ContentType = "application/json" // raw does not parse the payload
	if err := publish(t, s, e)[0]; err != nil {
		t.Fatal(err)
	}
	r := rc.requests()[0]
	if string(r.Body) != "not json {" || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("body %q content type %q", r.Body, r.Header.Get("Content-Type"))
	}
	if r.Header.Get("Webhook-Signature") != "" {
		t.Fatalf("unsigned sink sent webhook-signature %q", r.Header.Get("Webhook-Signature"))
	}
}

// TestRawFormatPassesEventHeaders: in the raw format the event's headers,
// which the envelope carries in its body, arrive as prefixed request
// headers; they cannot replace the request's own, and names or values HTTP
// cannot carry are left out.
func TestRawFormatPassesEventHeaders(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw, Headers: map[string]sinkconfig.Secret{"Authorization": "Bearer static"}})
	e := sinktest.Event("d", "", []byte(`{"n":1}`))
	e.Headers = map[string]string{
		"X-Tenant":      "acme",
		"content-type":  "text/evil",
		"Authorization": "Bearer from-event",
		"bad name":      "dropped",
		"x-newline":     "a\r\nInjected: yes",
		"traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	if err := publish(t, s, e)[0]; err != nil {
		t.Fatal(err)
	}
	h := rc.requests()[0].Header
	for name, want := range map[string]string{
		"Herald-Header-X-Tenant":      "acme",
		"Herald-Header-Content-Type":  "text/evil",
		"Herald-Header-Authorization": "Bearer from-event",
		"Content-Type":                "application/json",
		"Authorization":               "Bearer static",
		"Traceparent":                 "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Herald-Header-Traceparent":   "",
		"Herald-Header-X-Newline":     "",
		"Injected":                    "",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	for name := range h {
		if strings.Contains(strings.ToLower(name), "bad") {
			t.Errorf("header %q with a name HTTP cannot carry was sent", name)
		}
	}
}

// TestInvalidJSONPayloadIsPermanent covers hostile JSON payloads in the
// envelope format: broken syntax, and nesting one level past
// sinkconfig.MaxJSONDepth (PostgreSQL stores it, encoding/json refuses it), whose
// error must say it nests too deep and name the limit, not call it invalid.
// Neither is sent.
func TestInvalidJSONPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.srv.URL})
	deep := strings.Repeat("[", sinkconfig.MaxJSONDepth+1) + strings.Repeat("]", sinkconfig.MaxJSONDepth+1)
	for payload, want := range map[string]string{
		"{oops": "not valid JSON",
		deep:    "payload nests arrays and objects deeper than 10000 levels",
	} {
		err := publish(t, s, sinktest.Event("d", "", []byte(payload)))[0]
		if class(err) != "permanent" || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "application/json") {
			t.Fatalf("err = %v, want permanent saying %q and naming the content type", err, want)
		}
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver got %d requests", n)
	}
}

func TestSecretRotationSendsEverySignature(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	old, next, third := newSecret(t), newSecret(t), newSecret(t)
	s := newSink(t, Config{URL: rc.srv.URL, Secret: old, Secrets: []sinkconfig.Secret{next}})
	if err := publish(t, s, sinktest.Event("d", "k", []byte(`{}`)))[0]; err != nil {
		t.Fatal(err)
	}
	r := rc.requests()[0]
	if sigs := strings.Fields(r.Header.Get("Webhook-Signature")); len(sigs) != 2 {
		t.Fatalf("webhook-signature = %q, want two signatures", r.Header.Get("Webhook-Signature"))
	}
	for _, sec := range []sinkconfig.Secret{old, next} {
		if n := verifyIndependently(t, sec, r.Header, r.Body); n != 1 {
			t.Fatalf("%d signatures match a configured secret, want 1", n)
		}
		if err := Verify(sec, r.Header, r.Body, time.Minute); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	}
	if n := verifyIndependently(t, third, r.Header, r.Body); n != 0 {
		t.Fatalf("an unconfigured secret matched %d signatures", n)
	}
}

func TestStatusClasses(t *testing.T) {
	t.Parallel()
	status := func(code int) func(http.ResponseWriter, *http.Request, []byte) {
		return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			if code >= 300 && code < 400 {
				w.Header().Set("Location", "https://elsewhere.example/hook")
			}
			w.WriteHeader(code)
			fmt.Fprintf(w, "answer %d", code)
		}
	}
	refused := func(t *testing.T) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return "http://" + addr + "/hook"
	}
	hijack := func(reply string) func(http.ResponseWriter, *http.Request, []byte) {
		return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			buf.WriteString(reply)
			buf.Flush()
			conn.Close()
		}
	}
	cases := []struct {
		name    string
		handle  func(http.ResponseWriter, *http.Request, []byte)
		url     func(t *testing.T) string // overrides the receiver's URL
		want    string
		message string
	}{
		{"200", status(200), nil, "ok", ""},
		{"201", status(201), nil, "ok", ""},
		{"204", status(204), nil, "ok", ""},
		{"301", status(301), nil, "permanent", `redirected (301 Moved Permanently) to "https://elsewhere.example/hook"`},
		{"307", status(307), nil, "permanent", "not followed"},
		{"400", status(400), nil, "permanent", `400 Bad Request: "answer 400"`},
		{"401", status(401), nil, "unavailable", "refuses the sink"},
		{"403", status(403), nil, "unavailable", "refuses the sink"},
		{"404", status(404), nil, "permanent", "404 Not Found"},
		{"409", status(409), nil, "permanent", "409 Conflict"},
		{"422", status(422), nil, "permanent", "422"},
		{"408", status(408), nil, "retry", "408 Request Timeout"},
		{"429", status(429), nil, "retry", "429 Too Many Requests"},
		{"500", status(500), nil, "retry", "500 Internal Server Error"},
		{"503", status(503), nil, "retry", "503 Service Unavailable"},
		{"connection refused", nil, refused, "unavailable", "connecting to the endpoint"},
		{"DNS failure", nil, func(*testing.T) string { return "http://herald-test.invalid/hook" }, "unavailable", "resolving the endpoint"},
		{"closed before answering", hijack(""), nil, "retry", "sending request"},
		{"closed mid-response", hijack("HTTP/1.1 20"), nil, "retry", "sending request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, c.handle)
			u := rc.srv.URL + "/hook"
			if c.url != nil {
				u = c.url(t)
			}
			s := newSink(t, Config{URL: u, Timeout: 5 * time.Second})
			e := sinktest.Event("d", "k", []byte(`{}`))
			err := publish(t, s, e)[0]
			if got := class(err); got != c.want {
				t.Fatalf("class = %s (%v), want %s", got, err, c.want)
			}
			if err == nil {
				return
			}
			msg := err.Error()
			if !strings.Contains(msg, c.message) || !strings.Contains(msg, e.ID) || !strings.Contains(msg, "hook") {
				t.Fatalf("error %q should name the event, the sink and %q", msg, c.message)
			}
			if strings.Contains(msg, u) {
				t.Fatalf("error %q repeats the URL", msg)
			}
		})
	}
}

func TestTimeoutIsRetryableAndBounded(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	})
	s := newSink(t, Config{URL: rc.srv.URL, Timeout: 200 * time.Millisecond})
	start := time.Now()
	err := publish(t, s, sinktest.Event("d", "k", []byte(`{}`)))[0]
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Fatalf("Publish took %s with a 200ms timeout: it waited for the receiver's minute", elapsed)
	}
	if class(err) != "retry" || !strings.Contains(err.Error(), "no response within timeout 200ms") {
		t.Fatalf("err = %v, want retryable timeout", err)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, header string
		code         int
		min, max     time.Duration // want a sinks.RetryAfter mark with a delay in [min, max]
		none         bool          // want no sinks.RetryAfter mark
		date         bool          // header: an HTTP date 30 s after the response
	}{
		{name: "seconds", code: 503, header: "7", min: 7 * time.Second, max: 7 * time.Second},
		{name: "zero", code: 429, header: "0", min: 0, max: 0},
		// An HTTP date 30 s after the response; the delay is checked against
		// the times around the publish, however long it took.
		{name: "date", code: 429, date: true},
		{name: "past date", code: 503, header: "Mon, 02 Jan 2006 15:04:05 GMT", min: 0, max: 0},
		{name: "garbage", code: 503, header: "soon", none: true},
		{name: "negative", code: 503, header: "-5", none: true},
		{name: "ignored on permanent", code: 400, header: "7", none: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var sentDate atomic.Value // time.Time: the date the receiver sent
			rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				header := c.header
				if c.date {
					at := time.Now().Add(30 * time.Second).UTC().Truncate(time.Second)
					sentDate.Store(at)
					header = at.Format(http.TimeFormat)
				}
				w.Header().Set("Retry-After", header)
				w.WriteHeader(c.code)
			})
			s := newSink(t, Config{URL: rc.srv.URL})
			before := time.Now()
			err := publish(t, s, sinktest.Event("d", "k", []byte(`{}`)))[0]
			after := time.Now()
			if c.date {
				// The sink measured the delay from some instant in
				// [before, after] to the date it was sent.
				at := sentDate.Load().(time.Time)
				c.min, c.max = at.Sub(after), at.Sub(before)
			}
			if err == nil {
				t.Fatal("want an error")
			}
			delay, ok := sinks.RetryDelay(err)
			if c.none {
				if ok {
					t.Fatalf("got a Retry-After mark on %v, want none", err)
				}
				return
			}
			if !ok {
				t.Fatalf("err = %v, want a sinks.RetryAfter mark", err)
			}
			if class(err) != "retry" || delay < c.min || delay > c.max {
				t.Fatalf("class %s, delay %s, want retry with delay in [%s, %s]", class(err), delay, c.min, c.max)
			}
			if !strings.Contains(err.Error(), "retry after") {
				t.Fatalf("message %q does not mention the delay", err)
			}
		})
	}
}

func TestStatusOverrides(t *testing.T) {
	t.Parallel()
	var code atomic.Int64
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(int(code.Load()))
	})
	s := newSink(t, Config{URL: rc.srv.URL, RetryOn: []int{409, 401}, PermanentOn: []int{503}})
	for _, c := range []struct {
		code int
		want string
	}{{409, "retry"}, {401, "retry"}, {503, "permanent"}, {500, "retry"}, {400, "permanent"}} {
		code.Store(int64(c.code))
		err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]
		if got := class(err); got != c.want {
			t.Fatalf("status %d: class %s (%v), want %s", c.code, got, err, c.want)
		}
		if delay, ok := sinks.RetryDelay(err); c.code == 409 && (!ok || delay != 3*time.Second || !strings.Contains(err.Error(), "retry_on")) {
			t.Fatalf("409 under retry_on: %v, want Retry-After honoured", err)
		}
	}
}

func TestKeyStopsAfterFailure(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		if string(body) == "K1-2" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw, Concurrency: 4})
	var events []sinks.Event
	for i := 1; i <= 5; i++ {
		for _, k := range []string{"K1", "K2", "K3"} {
			events = append(events, rawEvent(k, fmt.Sprintf("%s-%d", k, i)))
		}
		events = append(events, rawEvent("", fmt.Sprintf("none-%d", i)))
	}
	errs := publish(t, s, events...)
	sent := map[string]bool{}
	order := map[string][]string{}
	for _, r := range rc.requests() {
		sent[string(r.Body)] = true
		k, _, _ := strings.Cut(string(r.Body), "-")
		order[k] = append(order[k], string(r.Body))
	}
	for i, e := range events {
		body := string(e.Payload)
		switch {
		case body == "K1-1" || e.Key != "K1":
			if errs[i] != nil || !sent[body] {
				t.Errorf("%s: err %v, sent %v; want delivered", body, errs[i], sent[body])
			}
		case body == "K1-2":
			if class(errs[i]) != "retry" || !sent[body] {
				t.Errorf("%s: err %v, sent %v; want a retryable failure", body, errs[i], sent[body])
			}
		default:
			if !errors.Is(errs[i], sinks.ErrSkipped) || sent[body] {
				t.Errorf("%s: err %v, sent %v; want ErrSkipped and not sent", body, errs[i], sent[body])
			}
		}
	}
	for _, k := range []string{"K2", "K3"} {
		want := []string{k + "-1", k + "-2", k + "-3", k + "-4", k + "-5"}
		if fmt.Sprint(order[k]) != fmt.Sprint(want) {
			t.Errorf("key %s arrived as %v, want %v", k, order[k], want)
		}
	}
}

// inflight answers after a pause and records the most requests it saw at once.
type inflight struct {
	now, peak atomic.Int64
}

func (f *inflight) handle(w http.ResponseWriter, _ *http.Request, _ []byte) {
	n := f.now.Add(1)
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(30 * time.Millisecond)
	f.now.Add(-1)
}

func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		concurrency int
		key         func(i int) string
		want        int64
	}{
		{"keyless", 3, func(int) string { return "" }, 3},
		{"distinct keys", 5, func(i int) string { return fmt.Sprint("k", i) }, 5},
		{"one key", 8, func(int) string { return "same" }, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var f inflight
			rc := newReceiver(t, f.handle)
			s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw, Concurrency: c.concurrency})
			var events []sinks.Event
			for i := range 24 {
				events = append(events, rawEvent(c.key(i), fmt.Sprint(i)))
			}
			for i, err := range publish(t, s, events...) {
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			if got := f.peak.Load(); got != c.want {
				t.Fatalf("peak concurrent requests = %d, want %d", got, c.want)
			}
			if c.want == 1 {
				for i, r := range rc.requests() {
					if string(r.Body) != fmt.Sprint(i) {
						t.Fatalf("request %d carried event %s", i, r.Body)
					}
				}
			}
		})
	}
}

func TestCancelStopsPublish(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 10)
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw, Concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := []sinks.Event{rawEvent("a", "a1"), rawEvent("a", "a2"), rawEvent("", "b")}
	done := make(chan []error)
	go func() { done <- s.Publish(ctx, events) }()
	<-arrived
	cancel()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish did not return after cancel")
	}
	if !errors.Is(errs[0], context.Canceled) || class(errs[0]) != "retry" {
		t.Errorf("in-flight event: %v, want retryable context.Canceled", errs[0])
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) {
		t.Errorf("later event of the key: %v, want ErrSkipped", errs[1])
	}
	if !errors.Is(errs[2], context.Canceled) || !strings.Contains(errs[2].Error(), "not sent") {
		t.Errorf("unstarted event: %v, want not sent: context.Canceled", errs[2])
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("receiver got %d requests, want 1", n)
	}
}

func TestTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	for _, format := range []Format{FormatRaw, FormatEnvelope} {
		s := newSink(t, Config{URL: rc.srv.URL, Format: format, MaxBodyBytes: 64})
		e := rawEvent("", strings.Repeat("x", 60)) // 60 raw bytes fit; the envelope does not
		err := publish(t, s, e)[0]
		if format == FormatRaw {
			if err != nil {
				t.Fatalf("raw 60 bytes under a 64 byte limit: %v", err)
			}
			e = rawEvent("", strings.Repeat("x", 65))
			err = publish(t, s, e)[0]
		}
		if class(err) != "permanent" || !strings.Contains(err.Error(), "limit of 64 bytes") || !strings.Contains(err.Error(), "max_body_bytes") {
			t.Fatalf("%s: err = %v, want permanent TooLarge naming max_body_bytes", format, err)
		}
	}
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("receiver got %d requests, want only the one under the limit", n)
	}
}

func TestRedirects(t *testing.T) {
	t.Parallel()
	target := newReceiver(t, nil)
	var redirects atomic.Int64
	redirect := func(code int, to string) func(http.ResponseWriter, *http.Request, []byte) {
		return func(w http.ResponseWriter, r *http.Request, _ []byte) {
			redirects.Add(1)
			http.Redirect(w, r, to, code)
		}
	}
	secret := newSecret(t)

	// 307 within the origin followed: same POST, same body, valid
	// signature at the new path.
	moved := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.URL.Path != "/final" {
			http.Redirect(w, r, "/final", http.StatusTemporaryRedirect)
		}
	})
	s := newSink(t, Config{URL: moved.srv.URL, Secret: secret, FollowRedirects: true})
	if err := publish(t, s, sinktest.Event("d", "", []byte(`{"a":1}`)))[0]; err != nil {
		t.Fatalf("307 with follow_redirects: %v", err)
	}
	got := moved.requests()
	if len(got) != 2 || got[1].Method != http.MethodPost || got[1].Path != "/final" || verifyIndependently(t, secret, got[1].Header, got[1].Body) != 1 {
		t.Fatalf("endpoint received %+v", got)
	}

	// 302 would turn the POST into a GET: not followed even when asked.
	found := newReceiver(t, redirect(http.StatusFound, target.srv.URL+"/final"))
	s = newSink(t, Config{URL: found.srv.URL, FollowRedirects: true})
	if err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]; class(err) != "permanent" || !strings.Contains(err.Error(), "/final") {
		t.Fatalf("302 with follow_redirects: %v, want permanent naming the Location", err)
	}

	// A loop stops after 10 hops.
	var loop *receiver
	loop = newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		http.Redirect(w, r, loop.srv.URL+"/again", http.StatusPermanentRedirect)
	})
	s = newSink(t, Config{URL: loop.srv.URL, FollowRedirects: true})
	if err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]; class(err) != "permanent" || !strings.Contains(err.Error(), "/again") {
		t.Fatalf("redirect loop: %v, want permanent", err)
	}
	if n := len(loop.requests()); n != 11 {
		t.Fatalf("loop received %d requests, want 11", n)
	}
	if len(target.requests()) != 0 {
		t.Fatalf("target received %d requests, want none", len(target.requests()))
	}
}

// TestCrossOriginRedirectIsRefused covers a hostile or compromised endpoint
// answering 307 or 308 with a Location on another origin (another host, or
// the same host on another port or scheme), directly or after a hop within
// its own origin: with follow_redirects on, the sink refuses the redirect as
// a permanent error naming the Location, and the other origin receives
// nothing, so neither the secret static header X-Api-Key nor Authorization
// nor the signature reaches it.
func TestCrossOriginRedirectIsRefused(t *testing.T) {
	t.Parallel()
	const apiKey, bearer = "api-key-0xFEEDFACE", "Bearer tok-0xC0FFEE"
	elsewhere := newReceiver(t, nil)
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		for name, firstHop := range map[string]bool{"direct": false, "after a hop": true} {
			t.Run(fmt.Sprintf("%d %s", code, name), func(t *testing.T) {
				to := elsewhere.srv.URL + "/collect?k=1"
				endpoint := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
					if firstHop && r.URL.Path == "/" {
						http.Redirect(w, r, "/hop", code)
						return
					}
					http.Redirect(w, r, to, code)
				})
				s := newSink(t, Config{URL: endpoint.srv.URL, Secret: newSecret(t), FollowRedirects: true,
					Headers: map[string]sinkconfig.Secret{"X-Api-Key": apiKey, "Authorization": bearer}})
				e := sinktest.Event("d", "k", []byte(`{"a":1}`))
				later := sinktest.Event("d", "k", []byte(`{"a":2}`))
				errs := publish(t, s, e, later)
				if class(errs[0]) != "permanent" || !strings.Contains(errs[0].Error(), fmt.Sprintf("%q", to)) ||
					!strings.Contains(errs[0].Error(), "another origin") {
					t.Fatalf("cross-origin redirect: %v, want permanent naming the Location %s", errs[0], to)
				}
				if !errors.Is(errs[1], sinks.ErrSkipped) {
					t.Fatalf("later event of the key: %v, want ErrSkipped", errs[1])
				}
				if msg := fmt.Sprintf("%v %+v", errs[0], errs[0]); strings.Contains(msg, apiKey) || strings.Contains(msg, "0xC0FFEE") {
					t.Fatalf("error shows a secret header: %s", msg)
				}
				wantHops := 1
				if firstHop {
					wantHops = 2
				}
				if got := endpoint.requests(); len(got) != wantHops || got[0].Header.Get("X-Api-Key") != apiKey {
					t.Fatalf("endpoint received %d requests (want %d, with X-Api-Key)", len(got), wantHops)
				}
			})
		}
	}
	// Publish returned: a followed redirect would have been answered by now.
	if got := elsewhere.requests(); len(got) != 0 {
		t.Fatalf("the other origin received %d requests, the first with headers %v", len(got), got[0].Header)
	}
	// The same host on another port is another origin too.
	u, err := url.Parse(elsewhere.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"http://h.example/x", "http://H.EXAMPLE:80/y", true},
		{"https://h.example/x", "https://h.example:443/y", true},
		{"http://h.example/x", "https://h.example/x", false},
		{"http://h.example/x", "http://h.example:8080/x", false},
		{"http://" + u.Host, "http://" + u.Hostname() + ":1", false},
	} {
		a, _ := url.Parse(tc.a)
		b, _ := url.Parse(tc.b)
		if got := origin(a) == origin(b); got != tc.same {
			t.Errorf("same origin(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// TestUnbuildableRequestIsPermanent covers an event whose content_type holds
// CR LF (a header injection attempt), NUL or DEL, sent in the raw format as
// the Content-Type header: Go's HTTP client refuses to build such a
// request, so the sink fails it permanently, naming content_type, rather
// than retrying it through every attempt; nothing is sent and the later
// events of its key are skipped.
func TestUnbuildableRequestIsPermanent(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatRaw})
	for _, ct := range []string{"text/plain\r\nX-Injected: 1", "text/plain\x00", "text/\x7fplain", "text/plain\n"} {
		bad := rawEvent("k", "body")
		bad.ContentType = ct
		later := rawEvent("k", "later")
		errs := publish(t, s, bad, later)
		if class(errs[0]) != "permanent" || !strings.Contains(errs[0].Error(), "content_type") ||
			!strings.Contains(errs[0].Error(), fmt.Sprintf("%q", ct)) {
			t.Fatalf("content type %q: %v, want permanent naming content_type and the value", ct, errs[0])
		}
		if !errors.Is(errs[1], sinks.ErrSkipped) {
			t.Fatalf("later event of the key: %v, want ErrSkipped", errs[1])
		}
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver got %d requests", n)
	}
	ok := rawEvent("", "fine")
	ok.ContentType = "text/plain; charset=utf-8\t"
	if err := publish(t, s, ok)[0]; err != nil {
		t.Fatalf("a content type with a tab: %v", err)
	}
}

// writePEM writes PEM blocks to a file in dir and returns its path.
func writePEM(t *testing.T, dir, name string, blocks ...*pem.Block) string {
	t.Helper()
	var buf bytes.Buffer
	for _, b := range blocks {
		if err := pem.Encode(&buf, b); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := writePEM(t, dir, "ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	// Untrusted certificate: the endpoint is unavailable, with a clear error;
	// verification is never skipped silently.
	s := newSink(t, Config{URL: srv.URL})
	err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]
	if class(err) != "unavailable" || !strings.Contains(err.Error(), "TLS handshake with the endpoint failed") ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted certificate: %v, want unavailable TLS error", err)
	}

	// Trusted through tls.ca_file.
	s = newSink(t, Config{URL: srv.URL, TLS: sinkconfig.TLSConfig{CAFile: caFile}})
	if err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]; err != nil {
		t.Fatalf("with ca_file: %v", err)
	}

	// https:// to a server that speaks plain HTTP, or another protocol.
	plain := newReceiver(t, nil)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	go func() {
		for {
			conn, err := other.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			conn.Close()
		}
	}()
	for _, u := range []string{strings.Replace(plain.srv.URL, "http://", "https://", 1), "https://" + other.Addr().String()} {
		s = newSink(t, Config{URL: u})
		if err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]; class(err) != "unavailable" || !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("%s: %v, want unavailable", u, err)
		}
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 {
			w.WriteHeader(http.StatusTeapot)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake failures are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := writePEM(t, dir, "ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	// Without a client certificate the server refuses the handshake.
	s := newSink(t, Config{URL: srv.URL, TLS: sinkconfig.TLSConfig{CAFile: caFile}})
	err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]
	if class(err) != "unavailable" || !strings.Contains(err.Error(), "TLS handshake") {
		t.Fatalf("no client certificate: %v, want unavailable", err)
	}

	// With one (the server's own pair, which RequireAnyClientCert accepts).
	pair := srv.TLS.Certificates[0]
	key, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile := writePEM(t, dir, "cert.pem", &pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]})
	keyFile := writePEM(t, dir, "key.pem", &pem.Block{Type: "PRIVATE KEY", Bytes: key})
	s = newSink(t, Config{URL: srv.URL, TLS: sinkconfig.TLSConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}})
	if err := publish(t, s, sinktest.Event("d", "", []byte(`{}`)))[0]; err != nil {
		t.Fatalf("with client certificate: %v", err)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	secret, rotated := newSecret(t), newSecret(t)
	const token = "Bearer tok-s3cr3t-value"
	var status atomic.Int64
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) { w.WriteHeader(int(status.Load())) })
	cfg := Config{URL: rc.srv.URL, Secret: secret, Secrets: []sinkconfig.Secret{rotated},
		Headers: map[string]sinkconfig.Secret{"Authorization": token}}
	s, err := New("hook", cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	var printed []string
	for _, code := range []int{200, 401, 500, 400, 301} {
		status.Store(int64(code))
		for _, err := range publish(t, s, sinktest.Event("d", "k", []byte(`{}`)), sinktest.Event("d", "k", []byte(`{}`))) {
			if err != nil {
				printed = append(printed, err.Error())
			}
		}
	}
	down, err := New("hook", Config{URL: "http://herald-test.invalid", Secret: secret}, logger)
	if err != nil {
		t.Fatal(err)
	}
	printed = append(printed, publish(t, down, sinktest.Event("d", "k", []byte(`{}`)))[0].Error())
	// Invalid secrets are refused without being quoted.
	for _, bad := range []Config{
		{URL: "http://x", Secret: "whsec_!!not-base64-" + secret[6:]},
		{URL: "http://x", Secrets: []sinkconfig.Secret{secret[6:]}},
	} {
		_, err := New("hook", bad, logger)
		if err == nil {
			t.Fatalf("config with an invalid secret accepted")
		}
		printed = append(printed, err.Error())
		printed = append(printed, fmt.Sprintf("%v %+v %#v", bad, bad, bad))
	}
	printed = append(printed, fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg), logs.String())
	if len(printed) < 10 || !strings.Contains(logs.String(), "webhook: response") {
		t.Fatalf("expected errors and debug logs to inspect, got %d strings and logs %q", len(printed), logs.String())
	}
	for _, p := range printed {
		for _, leak := range []string{secret.Reveal()[6:], rotated.Reveal()[6:], "tok-s3cr3t"} {
			if strings.Contains(p, leak) {
				t.Fatalf("a secret leaked into %q", p)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{URL: "https://hooks.example/in"}
	cases := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"missing url", func(c *Config) { c.URL = "" }, "url: required"},
		{"ftp url", func(c *Config) { c.URL = "ftp://x/y" }, `url: "ftp://x/y" is not an http(s) URL`},
		{"no host", func(c *Config) { c.URL = "http:///path" }, "url:"},
		{"unparsable url", func(c *Config) { c.URL = "http://a b:%zz" }, "url: not a valid URL"},
		{"password hidden", func(c *Config) { c.URL = "gopher://u:hunter2@x" }, `url: "gopher://u:xxxxx@x"`},
		{"secret prefix", func(c *Config) { c.Secret = "c2VjcmV0" }, `secret: must start with "whsec_"`},
		{"secret base64", func(c *Config) { c.Secret = "whsec_***" }, "secret: the part after"},
		{"secret empty key", func(c *Config) { c.Secret = "whsec_" }, "secret: no key bytes"},
		{"secrets index", func(c *Config) { c.Secrets = []sinkconfig.Secret{"whsec_c2VjcmV0", "nope"} }, "secrets[1]:"},
		{"format", func(c *Config) { c.Format = "xml" }, `format: "xml" must be envelope, raw or cloudevents`},
		{"timeout", func(c *Config) { c.Timeout = -time.Second }, "timeout:"},
		{"concurrency", func(c *Config) { c.Concurrency = -1 }, "concurrency:"},
		{"max_body_bytes", func(c *Config) { c.MaxBodyBytes = -1 }, "max_body_bytes:"},
		{"header name", func(c *Config) { c.Headers = map[string]sinkconfig.Secret{"bad name": "x"} }, `headers: "bad name"`},
		{"empty header name", func(c *Config) { c.Headers = map[string]sinkconfig.Secret{"": "x"} }, `headers: ""`},
		{"header reserved", func(c *Config) { c.Headers = map[string]sinkconfig.Secret{"webhook-signature": "x"} }, "headers.webhook-signature: set by the sink"},
		{"header value", func(c *Config) { c.Headers = map[string]sinkconfig.Secret{"X-A": "a\r\nInjected: 1"} }, "headers.X-A: value must not contain"},
		{"header value with DEL", func(c *Config) { c.Headers = map[string]sinkconfig.Secret{"X-A": "a\x7f"} }, "headers.X-A: value must not contain control characters"},
		{"retry_on range", func(c *Config) { c.RetryOn = []int{200} }, "retry_on[0]: 200"},
		{"permanent_on range", func(c *Config) { c.PermanentOn = []int{500, 600} }, "permanent_on[1]: 600"},
		{"overlap", func(c *Config) { c.RetryOn = []int{409}; c.PermanentOn = []int{409} }, "permanent_on[0]: 409 is also listed in retry_on"},
		{"tls file", func(c *Config) { c.TLS.CAFile = "/nonexistent/ca.pem" }, "tls.ca_file:"},
		{"tls on http", func(c *Config) { c.URL = "http://x"; c.TLS.Enabled = true }, "tls: set, but url is http://"},
	}
	for _, c := range cases {
		cfg := ok
		c.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error %q shows the URL password", c.name, err)
		}
		if _, err := New("hook", cfg, quiet); err == nil || !strings.Contains(err.Error(), "webhook sink hook: ") {
			t.Errorf("%s: New() = %v, want the validation error naming the sink", c.name, err)
		}
	}
	full := Config{URL: "http://x", Secret: "whsec_c2VjcmV0", Secrets: []sinkconfig.Secret{"whsec_b3RoZXI="}, Format: FormatRaw,
		Headers: map[string]sinkconfig.Secret{"X-Api-Key": "k"}, RetryOn: []int{409}, PermanentOn: []int{503}}
	if err := full.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	s, err := New("hook", ok, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Format != FormatEnvelope || s.cfg.Timeout != 10*time.Second || s.cfg.Concurrency != 16 || s.cfg.MaxBodyBytes != 1<<20 || s.Name() != "hook" {
		t.Fatalf("defaults not filled: %+v", s.cfg)
	}
}

func TestVersionFrom(t *testing.T) {
	t.Parallel()
	const module = "github.com/heraldhq/herald"
	cases := []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{nil, "dev"},
		{&debug.BuildInfo{Main: debug.Module{Path: module, Version: "(devel)"}}, "dev"},
		{&debug.BuildInfo{Main: debug.Module{Path: module, Version: "v1.2.3"}}, "v1.2.3"},
		{&debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v9.0.0"},
			Deps: []*debug.Module{{Path: "other", Version: "v0.1.0"}, {Path: module, Version: "v0.4.0"}}}, "v0.4.0"},
	}
	for _, c := range cases {
		if got := versionFrom(c.bi); got != c.want {
			t.Errorf("versionFrom(%+v) = %q, want %q", c.bi, got, c.want)
		}
	}
}

func TestEnvelopeEdgeCases(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s, err := New("hook", Config{URL: rc.srv.URL, Secret: newSecret(t)}, nil) // nil logger: slog.Default
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	empty := sinktest.Event("d", "", nil)
	empty.ContentType = "application/octet-stream"
	future := sinktest.Event("d", "", []byte(`{}`))
	future.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) // JSON time cannot encode it
	errs := publish(t, s, empty, future)
	if errs[0] != nil {
		t.Fatalf("empty binary payload: %v", errs[0])
	}
	var env wireEnvelope
	if err := json.Unmarshal(rc.requests()[0].Body, &env); err != nil || env.PayloadBase64 == nil || *env.PayloadBase64 != "" || env.Payload != nil {
		t.Fatalf("empty binary payload arrived as %s (%v), want payload_base64 \"\"", rc.requests()[0].Body, err)
	}
	if class(errs[1]) != "permanent" || !strings.Contains(errs[1].Error(), "encoding envelope") {
		t.Fatalf("unencodable event: %v, want permanent", errs[1])
	}
}

// TestErrorNamesTheEventAndTheSinkOnce: a refusal reads "publishing event
// ID to SINK: endpoint answered …", the form the relay's dead-letter
// listing cuts the cause from, with no second prefix.
func TestErrorNamesTheEventAndTheSinkOnce(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusGone)
		_, _ = w.Write([]byte("this customer is gone"))
	})
	s := newSink(t, Config{URL: rc.srv.URL})
	e := rawEvent("k", "x")
	err := publish(t, s, e)[0]
	want := "publishing event " + e.ID + ` to hook: endpoint answered 410 Gone: "this customer is gone"`
	if !sinks.IsPermanent(err) || err.Error() != want {
		t.Fatalf("error %q, want permanent %q", err, want)
	}
}
