package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestScheduleSettings: CHAOS_SEED and CHAOS_DURATION as the README gives
// them, and what a mistyped one says.
func TestScheduleSettings(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 1764612345678901234)
	for _, c := range []struct {
		in   string
		want int64
		err  string
	}{
		{"", 7, ""},
		{"random", now.UnixNano(), ""},
		{"42", 42, ""},
		{"-3", -3, ""},
		{"ten", 0, `"ten": want an integer or "random"`},
	} {
		got, err := parseSeed(c.in, 7, now)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("seed %q: error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("seed %q = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"", 0, ""},
		{"10m", 10 * time.Minute, ""},
		{"90s", 90 * time.Second, ""},
		{"10", 0, `"10": want a positive duration such as 10m`},
		{"-1m", 0, `"-1m": want a positive duration`},
	} {
		got, err := parseDuration(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("duration %q: error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("duration %q = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}
