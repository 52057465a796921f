// Package localpeer finds the local services (brokers, servers) that the
// sinks' tests share: a service's URL comes from the environment or a
// default, and its address is dialled once per test binary. When nothing
// answers, a test fails under CI=true and is skipped otherwise, saying what
// to start.
package localpeer

import (
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Service is a local service tests share.
type Service struct {
	// Name names it in messages: "NATS server".
	Name string
	// Env is the variable that may hold its URL: NATS_URL.
	Env string
	// Default is its URL when Env is not set.
	Default string
	// Start is the command that starts one locally.
	Start string
}

// probes caches, per URL, whether a service answered (nil) or why not.
var probes sync.Map // string → error

// URL returns the service's URL: $Env, or Default. When nothing answers
// there, the test fails if CI=true and is skipped otherwise.
func (s Service) URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(s.Env)
	if url == "" {
		url = s.Default
	}
	v, ok := probes.Load(url)
	if !ok {
		v, _ = probes.LoadOrStore(url, dial(url))
	}
	if err, _ := v.(error); err != nil {
		Missing(t, fmt.Sprintf("no %s at %s (%v); start one: %s (or set %s)", s.Name, url, err, s.Start, s.Env))
	}
	return url
}

// Missing ends a test that needs what msg says is missing: it fails when
// CI=true, where every service must be there, and is skipped otherwise.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// dial connects to the address of url (the first of a comma-separated
// list) and disconnects.
func dial(url string) error {
	u, err := neturl.Parse(strings.TrimSpace(strings.Split(url, ",")[0]))
	if err != nil {
		return err
	}
	conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}
