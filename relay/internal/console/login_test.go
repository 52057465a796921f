package console

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"
)

// TestLoginLimiter: a client may fail burst sign-ins, then waits
// window/burst per further try; other clients are not held back; a
// success forgets the client's failures.
func TestLoginLimiter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l := newLoginLimiter(3, 30*time.Second, 100, func() time.Time { return now })
	for i := range 3 {
		if w := l.wait("a"); w != 0 {
			t.Fatalf("before failure %d: wait %s, want none", i+1, w)
		}
		l.failed("a")
	}
	if w := l.wait("a"); w != 10*time.Second {
		t.Fatalf("after 3 failures: wait %s, want 10s (30s / 3)", w)
	}
	if w := l.wait("b"); w != 0 {
		t.Fatalf("another client waits %s", w)
	}
	now = now.Add(4 * time.Second)
	if w := l.wait("a"); w != 6*time.Second {
		t.Fatalf("4s later: wait %s, want 6s", w)
	}
	now = now.Add(6 * time.Second)
	if w := l.wait("a"); w != 0 {
		t.Fatalf("10s later: wait %s, want none", w)
	}
	l.failed("a")
	if w := l.wait("a"); w != 10*time.Second {
		t.Fatalf("after one more failure: wait %s, want 10s", w)
	}
	l.succeeded("a")
	if w := l.wait("a"); w != 0 || len(l.clients) != 0 {
		t.Fatalf("after a success: wait %s, %d clients kept", w, len(l.clients))
	}
}

// TestLoginLimiterIsBounded: however many addresses fail, at most max
// are kept; refilled ones go first, then those closest to refilled, so a
// client that failed most recently is still held back.
func TestLoginLimiterIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l := newLoginLimiter(2, time.Minute, 100, func() time.Time { return now })
	for i := range 100 {
		l.failed(fmt.Sprintf("old-%d", i))
	}
	now = now.Add(time.Hour) // every old bucket has refilled
	for i := range 250 {
		c := fmt.Sprintf("new-%d", i)
		l.failed(c)
		l.failed(c)
		now = now.Add(time.Millisecond)
		if n := len(l.clients); n > 100 {
			t.Fatalf("%d clients kept, want at most 100", n)
		}
	}
	for i := range 100 {
		if _, kept := l.clients[fmt.Sprintf("old-%d", i)]; kept {
			t.Fatalf("a refilled client is kept while limited ones were dropped")
		}
	}
	if w := l.wait("new-249"); w == 0 {
		t.Fatal("the client that failed last was dropped")
	}
}

func TestClientOf(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{"192.0.2.7:51234": "192.0.2.7", "[2001:db8::1]:443": "2001:db8::1", "pipe": "pipe"} {
		r := httptest.NewRequest("POST", "/ui/login", nil)
		r.RemoteAddr = addr
		if got := clientOf(r); got != want {
			t.Errorf("clientOf(%s) = %s, want %s", addr, got, want)
		}
	}
}
