package email_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/email"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// config returns a sink configuration for ts using the shipped templates.
func config(ts *testServer) email.Config {
	return email.Config{
		SMTP:         email.SMTPConfig{Host: ts.host, Port: ts.port},
		From:         "Shop <shop@example.com>",
		TemplatesDir: "testdata/templates",
		Template:     "order_paid",
		Subject:      "Your order is paid",
		Timeout:      5 * time.Second,
	}
}

func newSink(t *testing.T, cfg email.Config, logger *slog.Logger) *email.Sink {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s, err := email.New("mail", cfg, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// order returns an order_paid payload for to, with fields overridden by
// extra (a nil value deletes the field).
func order(to string, extra map[string]any) []byte {
	p := map[string]any{
		"to":       to,
		"order_id": "A-1001",
		"customer": map[string]any{"name": "Ann", "email": to},
		"total":    "42.50",
		"currency": "EUR",
		"items":    []any{map[string]any{"name": "Green tea", "qty": 2, "price": "12.50"}},
	}
	for k, v := range extra {
		if v == nil {
			delete(p, k)
		} else {
			p[k] = v
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return b
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

func requireOK(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, _ string) sinks.Sink {
			s, err := email.New("mail", config(ts), nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, _ string) sinks.Sink {
			cfg := config(ts)
			host, port, _ := net.SplitHostPort(sinktest.ClosedAddr(t))
			cfg.SMTP.Host = host
			cfg.SMTP.Port, _ = strconv.Atoi(port)
			s, err := email.New("mail", cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range ts.messages() {
				if m.header("X-Herald-Topic") != destination {
					continue
				}
				body, err := io.ReadAll(m.msg.Body)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, sinktest.Received{ID: m.header("X-Herald-Event-Id"), Key: m.header("X-Herald-Key"),
					Destination: destination, Payload: body})
			}
			return out
		},
		Payload: func(i int, key string) []byte {
			return order(fmt.Sprintf("user%d@example.com", i), map[string]any{"subject": fmt.Sprintf("Order %d (%s)", i, key)})
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event(destination, key, []byte(`{"subject": "an order with no recipient"}`))
		},
		Features: sinktest.Features{Keys: true, ReportsEarly: true},
	})
}

// parts returns the decoded MIME parts of a received message by media type.
func parts(t *testing.T, m received) map[string]string {
	t.Helper()
	mediaType, params, err := mime.ParseMediaType(m.msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	if !strings.HasPrefix(mediaType, "multipart/") {
		if got := m.msg.Header.Get("Content-Transfer-Encoding"); got != "quoted-printable" {
			t.Fatalf("Content-Transfer-Encoding = %q", got)
		}
		b, err := io.ReadAll(quotedprintable.NewReader(m.msg.Body))
		if err != nil {
			t.Fatal(err)
		}
		out[mediaType] = string(b)
		return out
	}
	if mediaType != "multipart/alternative" {
		t.Fatalf("Content-Type = %s, want multipart/alternative", mediaType)
	}
	r := multipart.NewReader(m.msg.Body, params["boundary"])
	for {
		p, err := r.NextPart() // decodes quoted-printable
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		pt, _, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		out[pt] = string(b)
	}
}

func TestMessageHeadersAndBodies(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	cfg := config(ts)
	cfg.ToField = "customer.email"
	s := newSink(t, cfg, nil)
	to := "Zoë Müller <zoe@example.com>"
	e := sinktest.Event("orders.paid", "order-1", order("ignored@example.com", map[string]any{
		"subject":  "Ihre Bestellung — bezahlt ✓",
		"customer": map[string]any{"name": `<b>Ann & "Bob"</b>`, "email": to},
	}))
	e.CreatedAt = time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)
	requireOK(t, publish(t, s, e))

	msgs := ts.messages()
	if len(msgs) != 1 {
		t.Fatalf("server holds %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.from != "shop@example.com" || len(m.to) != 1 || m.to[0] != "zoe@example.com" {
		t.Fatalf("envelope from %q to %v", m.from, m.to)
	}
	for name, want := range map[string]string{
		"Message-ID":        "<" + e.ID + "@example.com>",
		"Subject":           "Ihre Bestellung — bezahlt ✓",
		"From":              `"Shop" <shop@example.com>`,
		"Date":              "Sun, 01 Mar 2026 12:30:00 +0000",
		"MIME-Version":      "1.0",
		"X-Herald-Event-Id": e.ID,
		"X-Herald-Topic":    "orders.paid",
		"X-Herald-Key":      "order-1",
	} {
		if got := m.header(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if to, err := m.msg.Header.AddressList("To"); err != nil || len(to) != 1 || to[0].Name != "Zoë Müller" || to[0].Address != "zoe@example.com" {
		t.Errorf("To = %q: %v, %v", m.msg.Header.Get("To"), to, err)
	}
	if raw := m.msg.Header.Get("Subject"); !strings.HasPrefix(raw, "=?utf-8?q?") {
		t.Errorf("raw Subject %q is not RFC 2047 encoded", raw)
	}
	for _, line := range strings.Split(string(m.data), "\r\n") {
		if len(line) > 998 {
			t.Fatalf("line of %d bytes", len(line))
		}
		for _, c := range []byte(line) {
			if c >= 0x80 {
				t.Fatalf("raw non-ASCII byte in %q", line)
			}
		}
	}

	p := parts(t, m)
	text, html := p["text/plain"], p["text/html"]
	if len(p) != 2 {
		t.Fatalf("parts %v, want text/plain and text/html", p)
	}
	for _, want := range []string{`Hello <b>Ann & "Bob"</b>,`, "42.50 EUR for order A-1001", "2 x Green tea at 12.50 EUR", "Reference: " + e.ID} {
		if !strings.Contains(text, want) {
			t.Errorf("text part lacks %q:\n%s", want, text)
		}
	}
	for _, want := range []string{"Hello &lt;b&gt;Ann &amp; &#34;Bob&#34;&lt;/b&gt;,", "<strong>42.50 EUR</strong>", "<td>Green tea</td>", "Reference: " + e.ID} {
		if !strings.Contains(html, want) {
			t.Errorf("html part lacks %q:\n%s", want, html)
		}
	}
	if strings.Contains(html, "<b>Ann") {
		t.Errorf("html part carries the payload's markup unescaped:\n%s", html)
	}
}

func TestDefaultsAndRecipientLists(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	s := newSink(t, config(ts), nil)
	// No subject or template field: the configured defaults apply. The
	// recipient field may be a list, as a string or an array.
	list := sinktest.Event("orders.paid", "", order("a@example.com, B <b@example.com>", nil))
	array := sinktest.Event("orders.paid", "", order("", map[string]any{"to": []any{"c@example.com", "D <d@example.com>"}}))
	requireOK(t, publish(t, s, list, array))
	msgs := ts.messages()
	if len(msgs) != 2 {
		t.Fatalf("server holds %d messages, want 2", len(msgs))
	}
	for i, want := range [][]string{{"a@example.com", "b@example.com"}, {"c@example.com", "d@example.com"}} {
		if fmt.Sprint(msgs[i].to) != fmt.Sprint(want) {
			t.Errorf("message %d: envelope recipients %v, want %v", i, msgs[i].to, want)
		}
		if got := msgs[i].header("Subject"); got != "Your order is paid" {
			t.Errorf("message %d: Subject %q, want the configured default", i, got)
		}
	}
	if got := msgs[0].header("To"); got != `<a@example.com>, "B" <b@example.com>` {
		t.Errorf("To = %q", got)
	}
}

func TestSingleBodyTemplates(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	dir := t.TempDir()
	write(t, dir, "plain.txt", "Total: {{.total}} <{{.Event.Topic}}>")
	write(t, dir, "rich.html", "<p>Total: {{.total}} {{.Event.Key}}</p>")
	cfg := config(ts)
	cfg.TemplatesDir, cfg.Template = dir, ""
	s := newSink(t, cfg, nil)
	requireOK(t, publish(t, s,
		sinktest.Event("t.plain", "k1", order("a@example.com", map[string]any{"template": "plain"})),
		sinktest.Event("t.rich", "k2", order("a@example.com", map[string]any{"template": "rich"}))))
	msgs := ts.messages()
	if got := parts(t, msgs[0]); len(got) != 1 || got["text/plain"] != "Total: 42.50 <t.plain>\r\n" {
		t.Errorf("text-only message parts %q", got)
	}
	if got := parts(t, msgs[1]); len(got) != 1 || got["text/html"] != "<p>Total: 42.50 k2</p>\r\n" {
		t.Errorf("html-only message parts %q", got)
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBadPayloadsArePermanent covers hostile payloads, among them JSON
// nested one level past sinkconfig.MaxJSONDepth (stored by PostgreSQL, refused by
// encoding/json), whose error must say it nests too deep rather than that it
// is not a JSON object.
func TestBadPayloadsArePermanent(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	cfg := config(ts)
	cfg.Template, cfg.Subject = "", ""
	s := newSink(t, cfg, nil)
	ok := map[string]any{"subject": "Hi", "template": "order_paid"}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range ok {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		payload []byte
		ctype   string
		want    string
	}{
		{"not JSON", []byte("{oops"), "", "payload is not valid JSON: invalid character 'o'"},
		{"nested too deep", []byte(`{"to":` + strings.Repeat("[", sinkconfig.MaxJSONDepth) + strings.Repeat("]", sinkconfig.MaxJSONDepth) + `}`), "", "deeper than 10000 levels"},
		{"array", []byte(`[1]`), "", "payload is not a JSON object"},
		{"trailing data", []byte(`{"to":"a@example.com"} {}`), "", "data after the object"},
		{"not JSON content type", []byte("x"), "text/plain", `content type "text/plain" is not JSON`},
		{"no recipient", order("", with("to", nil)), "", `no recipient field "to"`},
		{"invalid address", order("not an address", ok), "", `payload field "to": "not an address" is not a valid address`},
		{"recipient not a string", order("", with("to", 42)), "", `payload field "to": want an address string or an array of them, got a number`},
		{"empty recipient array", order("", with("to", []any{})), "", `payload field "to": no recipient`},
		{"invalid address in array", order("", with("to", []any{"a@example.com", "bad"})), "", `payload field "to"[1]`},
		{"no subject", order("a@example.com", with("subject", nil)), "", `no field "subject" and no default subject`},
		{"subject not a string", order("a@example.com", with("subject", true)), "", `payload field "subject": want a string, got a boolean`},
		{"no template", order("a@example.com", with("template", nil)), "", `no field "template" and no default template`},
		{"unknown template", order("a@example.com", with("template", "../secret")), "", `payload field "template": no template "../secret"`},
		{"missing template key", order("a@example.com", with("customer", nil)), "", "rendering order_paid.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := sinktest.Event("orders.bad", "k", tc.payload)
			if tc.ctype != "" {
				bad.ContentType = tc.ctype
			}
			later := sinktest.Event("orders.bad", "k", order("a@example.com", ok))
			other := sinktest.Event("orders.bad", "other", order("b@example.com", ok))
			before := len(ts.messages())
			errs := publish(t, s, bad, later, other)
			if !sinks.IsPermanent(errs[0]) {
				t.Fatalf("error %v is not permanent", errs[0])
			}
			for _, want := range []string{bad.ID, tc.want} {
				if !strings.Contains(errs[0].Error(), want) {
					t.Errorf("error %q does not mention %q", errs[0], want)
				}
			}
			if !errors.Is(errs[1], sinks.ErrSkipped) {
				t.Errorf("later event of the same key: %v, want ErrSkipped", errs[1])
			}
			if errs[2] != nil {
				t.Errorf("event of another key: %v", errs[2])
			}
			if got := ts.messages()[before:]; len(got) != 1 || got[0].to[0] != "b@example.com" {
				t.Errorf("server received %d new messages, want only the other key's", len(got))
			}
		})
	}
}

func TestServerRefusals(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	s := newSink(t, config(ts), nil)
	for _, tc := range []struct {
		to        string
		permanent bool
		code      string
	}{
		{"reject550@example.com", true, "550"},
		{"busy451@example.com", false, "451"},
		{"rejectdata554@example.com", true, "554"},
		{"busydata452@example.com", false, "452"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			bad := sinktest.Event("orders.refused", "k", order(tc.to, nil))
			later := sinktest.Event("orders.refused", "k", order("a@example.com", nil))
			other := sinktest.Event("orders.refused", "", order("b@example.com", nil))
			before := len(ts.messages())
			errs := publish(t, s, bad, later, other)
			err := errs[0]
			if err == nil || sinks.IsPermanent(err) != tc.permanent || sinks.IsUnavailable(err) {
				t.Fatalf("error %v: permanent %v (want %v), unavailable %v", err, sinks.IsPermanent(err), tc.permanent, sinks.IsUnavailable(err))
			}
			if !strings.Contains(err.Error(), tc.code) || !strings.Contains(err.Error(), bad.ID) {
				t.Errorf("error %q does not name the code and the event", err)
			}
			if !errors.Is(errs[1], sinks.ErrSkipped) {
				t.Errorf("later event of the same key: %v, want ErrSkipped", errs[1])
			}
			// The transaction was reset: the connection serves the next event.
			if errs[2] != nil {
				t.Fatalf("next event after the refusal: %v", errs[2])
			}
			if got := ts.messages()[before:]; len(got) != 1 || got[0].to[0] != "b@example.com" {
				t.Errorf("server received %d new messages, want only the next event's", len(got))
			}
		})
	}
	if n := ts.sessionCount(); n != 1 {
		t.Errorf("server saw %d sessions, want the one connection reused throughout", n)
	}
}

func TestSenderRefusedIsUnavailable(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	cfg := config(ts)
	cfg.From = "blocked@example.com"
	s := newSink(t, cfg, nil)
	errs := publish(t, s, sinktest.Event("orders.sender", "a", order("a@example.com", nil)),
		sinktest.Event("orders.sender", "b", order("b@example.com", nil)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) || sinks.IsPermanent(err) || !strings.Contains(err.Error(), "553") {
			t.Fatalf("event %d: %v, want unavailable with the server's 553", i, err)
		}
	}
}

func TestReusesConnectionAcrossCalls(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	s := newSink(t, config(ts), nil)
	var events []sinks.Event
	for i := range 10 {
		events = append(events, sinktest.Event("orders.reuse", fmt.Sprint(i%3), order(fmt.Sprintf("u%d@example.com", i), nil)))
	}
	requireOK(t, publish(t, s, events[:6]...))
	requireOK(t, publish(t, s, events[6:]...))
	msgs := ts.messages()
	next := map[string]int{} // key → index of its next event
	for i, m := range msgs {
		key := m.header("X-Herald-Key")
		for next[key] < len(events) && events[next[key]].Key != key {
			next[key]++
		}
		if got := m.header("X-Herald-Event-Id"); next[key] == len(events) || got != events[next[key]].ID {
			t.Fatalf("message %d is event %s, not the next one of key %s", i, got, key)
		}
		next[key]++
	}
	if len(msgs) != 10 || ts.sessionCount() != 1 {
		t.Fatalf("%d messages over %d sessions, want 10 over 1", len(msgs), ts.sessionCount())
	}
}

func TestReconnectsAfterServerClosedIdleConnection(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{readTimeout: 100 * time.Millisecond})
	s := newSink(t, config(ts), nil)
	requireOK(t, publish(t, s, sinktest.Event("orders.idle", "", order("a@example.com", nil))))
	// The server drops the idle connection.
	deadline := time.Now().Add(10 * time.Second)
	for ts.endedCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server did not close the idle connection within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	requireOK(t, publish(t, s, sinktest.Event("orders.idle", "", order("b@example.com", nil))))
	if len(ts.messages()) != 2 || ts.sessionCount() != 2 {
		t.Fatalf("%d messages over %d sessions, want 2 over 2", len(ts.messages()), ts.sessionCount())
	}
}

func TestServerDownIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	cfg := config(&testServer{host: "127.0.0.1", port: port})
	s := newSink(t, cfg, nil)
	errs := publish(t, s, sinktest.Event("orders.down", "a", order("a@example.com", nil)),
		sinktest.Event("orders.down", "b", order("b@example.com", nil)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
	}
	if !strings.Contains(errs[0].Error(), fmt.Sprintf("127.0.0.1:%d", port)) {
		t.Errorf("error %q does not name the server", errs[0])
	}
}

// lockedBuffer collects log output from concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func debugLogger() (*slog.Logger, *lockedBuffer) {
	var buf lockedBuffer
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

const password = "s3cret-Pa55word"

func TestStartTLSWithAuth(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSignedCert(t)
	ts := startServer(t, serverOpts{tls: serverTLS, user: "shop", pass: password})
	cfg := config(ts)
	cfg.SMTP.TLS = email.TLSStartTLS
	cfg.SMTP.TLSConfig.CAFile = caFile
	cfg.SMTP.Username, cfg.SMTP.Password = "shop", password
	logger, logs := debugLogger()
	s := newSink(t, cfg, logger)
	requireOK(t, publish(t, s, sinktest.Event("orders.tls", "", order("a@example.com", nil))))
	m := ts.messages()[0]
	if !m.tls || m.user != "shop" {
		t.Fatalf("message received with TLS %v as user %q, want TLS as shop", m.tls, m.user)
	}
	if strings.Contains(logs.String(), password) || strings.Contains(fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg), password) {
		t.Fatal("the password appears in the logs or the formatted config")
	}
}

func TestAuthFailureIsUnavailable(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSignedCert(t)
	ts := startServer(t, serverOpts{tls: serverTLS, user: "shop", pass: "the-right-one"})
	cfg := config(ts)
	cfg.SMTP.TLS = email.TLSStartTLS
	cfg.SMTP.TLSConfig.CAFile = caFile
	cfg.SMTP.Username, cfg.SMTP.Password = "shop", password
	logger, logs := debugLogger()
	s := newSink(t, cfg, logger)
	errs := publish(t, s, sinktest.Event("orders.auth", "", order("a@example.com", nil)),
		sinktest.Event("orders.auth", "", order("b@example.com", nil)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("event %d: %v, want unavailable", i, err)
		}
		if strings.Contains(err.Error(), password) {
			t.Fatalf("error %q reveals the password", err)
		}
	}
	if !strings.Contains(errs[0].Error(), "535") {
		t.Errorf("error %q does not carry the server's 535", errs[0])
	}
	if strings.Contains(logs.String(), password) {
		t.Fatal("the password appears in the logs")
	}
	if len(ts.messages()) != 0 {
		t.Fatal("server accepted a message without authentication")
	}
}

func TestAuthRequiredIsUnavailable(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{user: "shop", pass: password})
	s := newSink(t, config(ts), nil) // no username: the server answers MAIL with 530
	errs := publish(t, s, sinktest.Event("orders.noauth", "", order("a@example.com", nil)),
		sinktest.Event("orders.noauth", "", order("b@example.com", nil)))
	for i, err := range errs {
		if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "530") {
			t.Fatalf("event %d: %v, want unavailable with 530", i, err)
		}
	}
}

func TestImplicitTLS(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSignedCert(t)
	ts := startServer(t, serverOpts{tls: serverTLS, implicit: true, user: "shop", pass: password})
	cfg := config(ts)
	cfg.SMTP.TLS = email.TLSImplicit
	cfg.SMTP.TLSConfig.CAFile = caFile
	cfg.SMTP.Username, cfg.SMTP.Password = "shop", password
	s := newSink(t, cfg, nil)
	requireOK(t, publish(t, s, sinktest.Event("orders.smtps", "", order("a@example.com", nil))))
	if m := ts.messages()[0]; !m.tls || m.user != "shop" {
		t.Fatalf("message received with TLS %v as user %q, want TLS as shop", m.tls, m.user)
	}
}

func TestTLSFailuresAreUnavailable(t *testing.T) {
	t.Parallel()
	serverTLS, caFile := selfSignedCert(t)
	plain := startServer(t, serverOpts{})
	starttls := startServer(t, serverOpts{tls: serverTLS})
	implicit := startServer(t, serverOpts{tls: serverTLS, implicit: true})
	for _, tc := range []struct {
		name   string
		server *testServer
		mode   string
		ca     string
		want   string
	}{
		{"starttls not offered", plain, email.TLSStartTLS, caFile, "doesn't support STARTTLS"},
		{"starttls untrusted certificate", starttls, email.TLSStartTLS, "", "certificate"},
		{"implicit untrusted certificate", implicit, email.TLSImplicit, "", "certificate"},
		{"implicit against plain server", plain, email.TLSImplicit, caFile, "TLS handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(tc.server)
			cfg.SMTP.TLS = tc.mode
			cfg.SMTP.TLSConfig.CAFile = tc.ca
			cfg.Timeout = 2 * time.Second
			s := newSink(t, cfg, nil)
			errs := publish(t, s, sinktest.Event("orders.tlsfail", "", order("a@example.com", nil)))
			if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), tc.want) {
				t.Fatalf("error %v, want unavailable mentioning %q", errs[0], tc.want)
			}
		})
	}
	if len(plain.messages())+len(starttls.messages())+len(implicit.messages()) != 0 {
		t.Fatal("a server accepted a message")
	}
}

func TestMessageOverServerLimitIsTooLarge(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{maxBytes: 2000})
	s := newSink(t, config(ts), nil)
	big := sinktest.Event("orders.big", "", order("a@example.com", map[string]any{"order_id": strings.Repeat("x", 4000)}))
	small := sinktest.Event("orders.big", "", order("a@example.com", map[string]any{"items": []any{}}))
	errs := publish(t, s, big, small)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "limit of 2000 bytes") {
		t.Fatalf("big message: %v, want permanent naming the limit", errs[0])
	}
	if errs[1] != nil {
		t.Fatalf("small message after the big one: %v", errs[1])
	}
}

func TestNonASCIIRecipientNeedsSMTPUTF8(t *testing.T) {
	t.Parallel()
	without := startServer(t, serverOpts{})
	with := startServer(t, serverOpts{utf8: true})
	e := sinktest.Event("orders.utf8", "", order("jörg@example.com", nil))
	errs := publish(t, newSink(t, config(without), nil), e)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "SMTPUTF8") {
		t.Fatalf("without SMTPUTF8: %v, want permanent", errs[0])
	}
	requireOK(t, publish(t, newSink(t, config(with), nil), e))
	if got := with.messages()[0].to[0]; got != "jörg@example.com" {
		t.Fatalf("envelope recipient %q", got)
	}
}

func TestContextEndsStalledDelivery(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverOpts{})
	s := newSink(t, config(ts), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, []sinks.Event{
		sinktest.Event("orders.stall", "", order("hang@example.com", nil)),
		sinktest.Event("orders.stall", "", order("a@example.com", nil)),
	})
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Publish took %s after its context ended", took)
	}
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || sinks.IsPermanent(err) {
			t.Fatalf("event %d: %v, want a retryable error wrapping the deadline", i, err)
		}
	}
	// The sink recovers on a fresh connection.
	requireOK(t, publish(t, s, sinktest.Event("orders.stall", "", order("b@example.com", nil))))
}

func TestStalledGreetingIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	accepted := make(chan net.Conn, 1)
	conns.Go(func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // never greets
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Wait()
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	cfg := config(&testServer{host: "127.0.0.1", port: ln.Addr().(*net.TCPAddr).Port})
	cfg.Timeout = 200 * time.Millisecond
	s := newSink(t, cfg, nil)
	start := time.Now()
	errs := publish(t, s, sinktest.Event("orders.mute", "", order("a@example.com", nil)))
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Publish took %s with a 200ms timeout", took)
	}
	if !sinks.IsUnavailable(errs[0]) || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("error %v, want unavailable after the timeout", errs[0])
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	good := email.Config{SMTP: email.SMTPConfig{Host: "localhost", Port: 1025}, From: "shop@example.com", TemplatesDir: "testdata/templates"}
	if _, err := email.New("mail", good, nil); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	broken := t.TempDir()
	write(t, broken, "ok.txt", "fine")
	write(t, broken, "bad.html", "<p>{{.name</p>")
	empty := t.TempDir()
	write(t, empty, "README.md", "no templates here")
	for _, tc := range []struct {
		name   string
		change func(*email.Config)
		want   string
	}{
		{"no host", func(c *email.Config) { c.SMTP.Host = "" }, "smtp.host: required"},
		{"bad port", func(c *email.Config) { c.SMTP.Port = 70000 }, "smtp.port: 70000"},
		{"bad tls mode", func(c *email.Config) { c.SMTP.TLS = "ssl" }, `smtp.tls: "ssl"`},
		{"tls_config with none", func(c *email.Config) { c.SMTP.TLS = "none"; c.SMTP.TLSConfig.CAFile = "x.pem" }, "smtp.tls_config: set, but smtp.tls is none"},
		{"password alone", func(c *email.Config) { c.SMTP.Password = password }, "smtp.password: set without smtp.username"},
		{"username alone", func(c *email.Config) { c.SMTP.Username = "shop" }, "smtp.password: required"},
		{"auth in clear to a remote host", func(c *email.Config) {
			c.SMTP.Host, c.SMTP.TLS, c.SMTP.Username, c.SMTP.Password = "mail.example.com", "none", "shop", password
		}, "smtp.username: AUTH would send the password in clear text"},
		{"no from", func(c *email.Config) { c.From = "" }, "from: required"},
		{"bad from", func(c *email.Config) { c.From = "shop at example" }, `from: "shop at example" is not a valid address`},
		{"no templates_dir", func(c *email.Config) { c.TemplatesDir = "" }, "templates_dir: required"},
		{"missing templates_dir", func(c *email.Config) { c.TemplatesDir = filepath.Join(empty, "nope") }, "templates_dir: open"},
		{"empty templates_dir", func(c *email.Config) { c.TemplatesDir = empty }, "templates_dir: " + empty + " holds no .txt or .html template"},
		{"template parse error", func(c *email.Config) { c.TemplatesDir = broken }, "templates_dir: parsing " + filepath.Join(broken, "bad.html")},
		{"unknown default template", func(c *email.Config) { c.Template = "welcome" }, "template: no welcome.txt or welcome.html"},
		{"negative timeout", func(c *email.Config) { c.Timeout = -time.Second }, "timeout: must be positive"},
		{"empty path segment", func(c *email.Config) { c.ToField = "customer..email" }, `to_field: "customer..email" has an empty path segment`},
		{"unreadable ca_file", func(c *email.Config) {
			c.SMTP.TLS = "starttls"
			c.SMTP.TLSConfig.CAFile = filepath.Join(empty, "ca.pem")
		}, "smtp.tls_config.ca_file:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.change(&cfg)
			_, err := email.New("mail", cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Fatalf("error %q reveals the password", err)
			}
		})
	}
}
