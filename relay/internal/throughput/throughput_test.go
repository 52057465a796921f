package throughput

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// clock is a settable time for a History under test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// base is the start of a step of every length used here.
var base = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newTest(window, step time.Duration) (*History, *clock) {
	h := New(window, step)
	c := &clock{t: base}
	h.now = c.now
	return h, c
}

func TestSeriesCountsPerStep(t *testing.T) {
	t.Parallel()
	h, c := newTest(time.Minute, 5*time.Second)
	// Step 0 (12:00:00-05): 10 delivered, 5 failed on hook; step 2: 20
	// delivered; the step under way (3): 7 delivered, not shown yet.
	for range 10 {
		h.Published("hook")
	}
	for range 5 {
		h.Failed("hook")
	}
	h.Published("mail")
	c.set(base.Add(12 * time.Second))
	for range 20 {
		h.Published("hook")
	}
	c.set(base.Add(17 * time.Second))
	for range 7 {
		h.Published("hook")
	}

	s := h.Series("hook", base.Add(19*time.Second))
	if len(s) != 12 {
		t.Fatalf("%d points, want 12 (a minute in 5 s steps)", len(s))
	}
	last := s[len(s)-1]
	if !last.At.Equal(base.Add(15 * time.Second)) {
		t.Fatalf("last point at %s, want the end of the last complete step, %s", last.At.UTC(), base.Add(15*time.Second))
	}
	want := map[time.Duration][2]float64{5 * time.Second: {2, 1}, 15 * time.Second: {4, 0}}
	for i, p := range s {
		if i > 0 && p.At.Sub(s[i-1].At) != 5*time.Second {
			t.Fatalf("points %d and %d are %s apart", i-1, i, p.At.Sub(s[i-1].At))
		}
		w := want[p.At.Sub(base)]
		if p.Delivered != w[0] || p.Failed != w[1] {
			t.Errorf("point at %s: %v delivered/s, %v failed/s, want %v", p.At.Sub(base), p.Delivered, p.Failed, w)
		}
	}
	// A step later the step that was under way shows.
	if p := h.Series("hook", base.Add(20*time.Second))[11]; p.Delivered != 7.0/5 {
		t.Errorf("step 3: %v delivered/s, want 1.4", p.Delivered)
	}
	if got := h.Sinks(); !slices.Equal(got, []string{"hook", "mail"}) {
		t.Errorf("sinks %v", got)
	}
	for _, p := range h.Series("never", base.Add(20*time.Second)) {
		if p.Delivered != 0 || p.Failed != 0 {
			t.Fatalf("a sink never reported has %+v", p)
		}
	}
}

func TestOldStepsLeaveTheWindow(t *testing.T) {
	t.Parallel()
	h, c := newTest(time.Minute, 5*time.Second)
	h.Published("hook")
	// A window later the step's slot is reused by a new step: the old count
	// is neither shown nor added to the new one.
	c.set(base.Add(65 * time.Second))
	h.Published("hook")
	h.Published("hook")
	var total float64
	for _, p := range h.Series("hook", base.Add(70*time.Second)) {
		total += p.Delivered * 5
	}
	if total != 2 {
		t.Fatalf("%v events in the window, want the 2 of the last step", total)
	}
	// Long after, with no event since, everything is zero.
	for _, p := range h.Series("hook", base.Add(time.Hour)) {
		if p.Delivered != 0 {
			t.Fatalf("an hour later: %+v", p)
		}
	}
	// A clock gone back a window drops its count instead of adding it to
	// the newer step sharing the slot.
	c.set(base.Add(5 * time.Second))
	h.Published("hook")
	if p := h.Series("hook", base.Add(70*time.Second))[11]; p.Delivered*5 != 2 {
		t.Fatalf("after the clock went back: %v events in the last step, want 2", p.Delivered*5)
	}
}

func TestRatesOverTheLastMinute(t *testing.T) {
	t.Parallel()
	h, c := newTest(15*time.Minute, 5*time.Second)
	// 600 delivered and 60 failed spread over the minute 12:01-12:02, 300
	// more delivered before it (outside the rate's minute).
	for i := range 300 {
		c.set(base.Add(time.Duration(i) * 200 * time.Millisecond))
		h.Published("hook")
	}
	for i := range 600 {
		c.set(base.Add(time.Minute + time.Duration(i)*100*time.Millisecond))
		h.Published("hook")
		if i%10 == 0 {
			h.Failed("hook")
		}
	}
	d, f := h.Rates("hook", base.Add(2*time.Minute+3*time.Second))
	if d != 10 || f != 1 {
		t.Fatalf("rates %v delivered/s, %v failed/s, want 10 and 1", d, f)
	}
	if d, f := h.Rates("other", base); d != 0 || f != 0 {
		t.Fatalf("a sink never reported: %v, %v", d, f)
	}
	if n := len(h.Series("hook", base)); n != 180 {
		t.Fatalf("%d points in 15 minutes of 5 s steps, want 180", n)
	}
}

func TestNewRoundsItsArguments(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		window, step time.Duration
		points       int
	}{
		{time.Minute, 5 * time.Second, 12},
		{61 * time.Second, 5 * time.Second, 13},
		{time.Second, 5 * time.Second, 1},
		{time.Second, 0, 1000},
	} {
		if n := len(New(c.window, c.step).Series("x", base)); n != c.points {
			t.Errorf("New(%s, %s): %d points, want %d", c.window, c.step, n, c.points)
		}
	}
}

// TestConcurrentObservers is for the race detector: the relay's loops
// report while the console reads.
func TestConcurrentObservers(t *testing.T) {
	t.Parallel()
	h, _ := newTest(time.Minute, time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range 1000 {
				h.Published([]string{"a", "b"}[w%2])
				h.Failed("a")
				_ = h.Series("a", base.Add(time.Second))
			}
		})
	}
	wg.Wait()
	p := h.Series("a", base.Add(time.Second))[59]
	if p.Delivered != 2000 || p.Failed != 4000 {
		t.Fatalf("%+v, want 2000 delivered and 4000 failed in the step", p)
	}
}
