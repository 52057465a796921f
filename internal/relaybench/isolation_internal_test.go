package relaybench

import "testing"

// TestBacklogRises counts the reports after the outage, up to the one
// that found the queue empty, whose backlog grew since the report before
// (the first against the backlog at the heal).
func TestBacklogRises(t *testing.T) {
	t.Parallel()
	at := func(s float64, backlog int64) Interval { return Interval{AtSeconds: s, DownBacklog: &backlog} }
	reports := []Interval{at(10, 500), at(20, 1000), at(30, 900), at(40, 950), at(50, 300), at(60, 10), at(70, 40)}
	for _, c := range []struct {
		name            string
		healedAt, until float64
		atHeal          int64
		want            int
	}{
		{"fell at every report but one", 25, 60, 1000, 1},
		{"the first report after the heal is compared with the heal", 25, 60, 800, 2},
		{"reports after the catch-up are not counted", 45, 60, 950, 0},
		{"not caught up: every report after the heal", 45, 1e9, 950, 1},
		{"none after the heal", 80, 1e9, 40, 0},
	} {
		if got := backlogRises(reports, c.healedAt, c.until, c.atHeal); got != c.want {
			t.Errorf("%s: backlogRises = %d, want %d", c.name, got, c.want)
		}
	}
}
