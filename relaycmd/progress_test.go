package relaycmd

import (
	"strings"
	"testing"
)

// TestProgressNeverPassesItsTotal: a bulk change that finds one more dead
// letter than its plan counted (one dead before the count, committed after
// it) raises the total instead of printing past 100 %.
func TestProgressNeverPassesItsTotal(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	p := newProgress(&out, "replayed", 5)
	p.report(5)
	p.report(6)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "replayed 5/5 dead letters (100%") ||
		!strings.HasPrefix(lines[1], "replayed 6/6 dead letters (100%") {
		t.Fatalf("progress:\n%s", out.String())
	}
}
