package localpeer

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the test.
type recorder struct {
	testing.TB
	mu      sync.Mutex
	skipped []string
	failed  []string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.skipped = append(r.skipped, args[0].(string))
}
func (r *recorder) Fatal(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, args[0].(string))
}

func TestURLSaysWhatToStart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := "test://" + l.Addr().String()
	defer l.Close()
	down := "test://" + closedAddr(t)
	s := Service{Name: "test server", Env: "HERALD_LOCALPEER_TEST_URL", Default: down, Start: "start-it"}
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	s.URL(r)
	want := "no test server at " + down + " ("
	if len(r.skipped) != 1 || !strings.HasPrefix(r.skipped[0], want) || !strings.HasSuffix(r.skipped[0], "start one: start-it (or set HERALD_LOCALPEER_TEST_URL)") ||
		len(r.failed) != 0 {
		t.Fatalf("skipped %q, failed %q; want a skip naming the URL and what to start", r.skipped, r.failed)
	}
	t.Setenv("CI", "true")
	s.URL(r)
	if len(r.failed) != 1 {
		t.Fatalf("under CI=true a missing service did not fail the test: %q", r.failed)
	}
	t.Setenv("HERALD_LOCALPEER_TEST_URL", up)
	if got := s.URL(r); got != up || len(r.failed) != 1 {
		t.Fatalf("URL = %q (failures %q), want $HERALD_LOCALPEER_TEST_URL", got, r.failed)
	}
}

func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
