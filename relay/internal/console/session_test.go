package console

import (
	"testing"
	"time"
)

// TestSessionsAreBoundedAndExpire: past the bound, opening a session ends
// the one that expires first; an expired session is gone; ids and CSRF
// tokens are distinct and long.
func TestSessionsAreBoundedAndExpire(t *testing.T) {
	t.Parallel()
	s := newSessions(2, time.Hour)
	a, b := s.open(), s.open()
	if a.id == b.id || a.csrf == b.csrf || a.id == a.csrf || len(a.id) < 40 {
		t.Fatalf("ids and tokens not distinct random values: %+v %+v", a, b)
	}
	c := s.open()
	if s.get(a.id) != nil || s.get(b.id) == nil || s.get(c.id) == nil || len(s.byID) != 2 {
		t.Fatalf("after a third session: %d kept, the first still live: %v", len(s.byID), s.get(a.id) != nil)
	}
	b.expires = time.Now().Add(-time.Second)
	if s.get(b.id) != nil {
		t.Fatal("an expired session is still live")
	}
	s.end(c.id)
	if s.get(c.id) != nil || len(s.byID) != 0 {
		t.Fatalf("%d sessions after ending the last", len(s.byID))
	}
}

// TestSafeNext: a redirect after signing in stays under Prefix.
func TestSafeNext(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"":                    Prefix,
		"/ui/held":            "/ui/held",
		"/ui/dead?key=a%20b":  "/ui/dead?key=a%20b",
		"/uix":                Prefix,
		"//evil/ui/":          Prefix,
		"http://evil/ui/":     Prefix,
		"/ui":                 "/ui", // the mux sends it on to /ui/
		"javascript:alert(1)": Prefix,
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
