package sinkconfig_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// TestIsTLSError dials real servers: one whose certificate the client does
// not trust, one trusted but for another name, and one that does not speak
// TLS.
func TestIsTLSError(t *testing.T) {
	t.Parallel()
	secure := httptest.NewUnstartedServer(nil)
	secure.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	secure.StartTLS()
	defer secure.Close()
	plain := httptest.NewServer(nil)
	defer plain.Close()
	roots := secure.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	hostport := func(url string) string { return url[strings.Index(url, "//")+2:] }
	for name, c := range map[string]struct {
		addr string
		cfg  *tls.Config
	}{
		"untrusted":  {hostport(secure.URL), &tls.Config{}},
		"other name": {hostport(secure.URL), &tls.Config{RootCAs: roots, ServerName: "elsewhere.example"}},
		"not TLS":    {hostport(plain.URL), &tls.Config{InsecureSkipVerify: true}},
	} {
		conn, err := tls.Dial("tcp", c.addr, c.cfg)
		if err == nil {
			conn.Close()
		}
		if err == nil || !sinkconfig.IsTLSError(fmt.Errorf("connecting: %w", err)) {
			t.Errorf("%s: %v, want a TLS error", name, err)
		}
	}
	conn, err := tls.Dial("tcp", hostport(secure.URL), &tls.Config{RootCAs: roots, ServerName: "example.com"})
	if err != nil {
		t.Fatalf("a trusted handshake failed: %v", err)
	}
	conn.Close()
	if sinkconfig.IsTLSError(errors.New("connection refused")) {
		t.Error("a plain error is taken for a TLS error")
	}
}
