package email

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
)

func TestTLSDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		host, tls string
		wantTLS   string
		wantPort  int
	}{
		{"mail.example.com", "", TLSStartTLS, 587},
		{"localhost", "", TLSNone, 25},
		{"127.0.0.1", "", TLSNone, 25},
		{"::1", "", TLSNone, 25},
		{"localhost", TLSStartTLS, TLSStartTLS, 587},
		{"mail.example.com", TLSImplicit, TLSImplicit, 465},
		{"10.0.0.1", TLSNone, TLSNone, 25},
	} {
		got := Config{SMTP: SMTPConfig{Host: tc.host, TLS: tc.tls}}.WithDefaults().SMTP
		if got.TLS != tc.wantTLS || got.Port != tc.wantPort {
			t.Errorf("host %s, tls %q: got tls %s port %d, want %s %d", tc.host, tc.tls, got.TLS, got.Port, tc.wantTLS, tc.wantPort)
		}
	}
}

// BenchmarkRender measures building one multipart message (payload decoding,
// both templates, headers, quoted-printable) without the network.
func BenchmarkRender(b *testing.B) {
	s, err := New("mail", Config{
		SMTP:         SMTPConfig{Host: "localhost"},
		From:         "Shop <shop@example.com>",
		TemplatesDir: "testdata/templates",
		Template:     "order_paid",
		ToField:      "customer.email",
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	e := sinks.Event{
		ID: "01928f4e-7c1a-7b3e-9f00-2a4b6c8d0e1f", Topic: "orders.paid", Key: "order-1001",
		ContentType: sinks.ContentTypeJSON, CreatedAt: time.Now(),
		Payload: []byte(`{"subject":"Your order A-1001 is paid ✓","order_id":"A-1001",
			"customer":{"name":"Zoë Müller","email":"Zoë Müller <zoe@example.com>"},
			"total":"42.50","currency":"EUR","items":[
			{"name":"Green tea","qty":2,"price":"12.50"},{"name":"Teapot","qty":1,"price":"17.50"}]}`),
	}
	b.ReportAllocs()
	var size int
	for b.Loop() {
		m, err := s.render(e)
		if err != nil {
			b.Fatal(err)
		}
		size = len(m.data)
	}
	b.ReportMetric(float64(size), "bytes/msg")
}

func TestLongSubjectsAreFolded(t *testing.T) {
	t.Parallel()
	s, err := New("mail", Config{SMTP: SMTPConfig{Host: "localhost"}, From: "shop@example.com",
		TemplatesDir: "testdata/templates", Template: "order_paid"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{
		strings.TrimSpace(strings.Repeat("Your order is paid, thank you. ", 60)),
		strings.TrimSpace(strings.Repeat("Ihre Bestellung ist bezahlt — danke schön. ", 60)),
		"Short",
	} {
		payload, _ := json.Marshal(map[string]any{"to": "a@example.com", "subject": subject, "order_id": "1",
			"customer": map[string]any{"name": "Ann"}, "total": "1", "currency": "EUR", "items": []any{}})
		m, err := s.render(sinks.Event{ID: "id-1", ContentType: sinks.ContentTypeJSON, Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := bytes.Cut(m.data, []byte("\r\n\r\n"))
		for _, line := range strings.Split(string(head), "\r\n") {
			// Over 78 characters only where no space allows a break: one
			// encoded word (75 characters) after the header name.
			_, value, named := strings.Cut(line, ": ")
			if len(line) > 78 && (len(line) > 998 || !named || strings.Contains(value, " ")) {
				t.Fatalf("header line of %d characters: %q", len(line), line)
			}
		}
		msg, err := mail.ReadMessage(bytes.NewReader(m.data))
		if err != nil {
			t.Fatal(err)
		}
		got, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
		if err != nil || got != subject {
			t.Fatalf("decoded subject %q (%v), want %q", got, err, subject)
		}
	}
}
