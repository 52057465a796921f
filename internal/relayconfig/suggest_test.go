package relayconfig

import "testing"

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"abc", "", 3}, {"lease", "lease", 0},
		{"max_attemps", "max_attempts", 1}, // a letter left out
		{"bach_size", "batch_size", 1},
		{"exchnage", "exchange", 1}, // two neighbours swapped
		{"kitten", "sitting", 3},
		{"ca", "abc", 3},      // optimal string alignment: no edit of a swapped pair
		{"héllo", "hello", 1}, // runes, not bytes
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestNearestKey(t *testing.T) {
	t.Parallel()
	known := []string{"max_attempts", "batch_size", "lease", "poll_interval", "poll_only", "retention"}
	for key, want := range map[string]string{
		"max_attemps":    "max_attempts",
		"MaxAttempts":    "max_attempts",
		"max-attempts":   "max_attempts",
		"poll_intervall": "poll_interval",
		"lese":           "lease",
		"leases":         "lease",
		"poll":           "", // too far from either poll_ key to be a typo of one
		"brokers":        "",
		"x":              "",
	} {
		if got := nearestKey(key, known); got != want {
			t.Errorf("nearestKey(%q) = %q, want %q", key, got, want)
		}
	}
	// A tie goes to the first in sorted order, whatever the order given.
	if got := nearestKey("ab", []string{"ac", "aa"}); got != "aa" {
		t.Errorf("nearestKey(ab) among ac, aa = %q, want aa", got)
	}
}
