package email

import (
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
		got := Config{SMTP: SMTPConfig{Host: tc.host, TLS: tc.tls}}.withDefaults().SMTP
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
