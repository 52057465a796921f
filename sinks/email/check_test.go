package email_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/email"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestCheck: Check connects, greets and authenticates as a delivery would,
// and keeps the connection for the next event; a wrong password or a server
// that is not there fails it as unavailable.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := startServer(t, serverOpts{})
	s := newSink(t, config(ts), nil)
	var _ sinks.Checker = s
	for range 2 {
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
	requireOK(t, publish(t, s, sinktest.Event("orders.paid", "k", order("a@example.com", nil))))
	if n := ts.sessionCount(); n != 1 {
		t.Fatalf("%d SMTP sessions, want 1: the checked connection serves the delivery", n)
	}

	// With STARTTLS and AUTH: the right password passes, a wrong one fails.
	serverTLS, caFile := selfSignedCert(t)
	auth := startServer(t, serverOpts{tls: serverTLS, user: "shop", pass: password})
	cfg := config(auth)
	cfg.SMTP.TLS = email.TLSStartTLS
	cfg.SMTP.TLSConfig.CAFile = caFile
	cfg.SMTP.Username, cfg.SMTP.Password = "shop", password
	if err := newSink(t, cfg, nil).Check(ctx); err != nil {
		t.Fatalf("Check with STARTTLS and AUTH: %v", err)
	}
	cfg.SMTP.Password = "wrong-" + password
	err := newSink(t, cfg, nil).Check(ctx)
	if !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), "535") || strings.Contains(err.Error(), password) {
		t.Fatalf("Check with a wrong password = %v, want unavailable carrying 535 and no password", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := config(&testServer{host: "127.0.0.1", port: ln.Addr().(*net.TCPAddr).Port})
	ln.Close()
	if err := newSink(t, down, nil).Check(ctx); !sinks.IsUnavailable(err) {
		t.Fatalf("Check with no server = %v, want unavailable", err)
	}
}
