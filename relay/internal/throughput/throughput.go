// Package throughput keeps, in memory, how many events each sink delivered
// and failed per second over a recent window, for the console's charts and
// rates. Every relay keeps one (relay.Relay.Throughput), fed from its
// measurements. A restart empties it.
//
// Memory is fixed per sink: a ring of window/step counters. Sinks are those
// the relay reports, which come from its configuration, so their number is
// bounded.
package throughput

import (
	"slices"
	"sync"
	"time"
)

// History is a per-sink history of deliveries and failures, in steps of a
// fixed length over a fixed window. It is safe for concurrent use; the
// relay's calls take a short mutex and never wait for a reader for longer
// than a copy of one sink's counters.
type History struct {
	step  time.Duration
	steps int // complete steps in the window
	now   func() time.Time

	mu    sync.RWMutex
	sinks map[string]*ring
}

// New returns a History of the last window in steps of step (e.g.
// New(15*time.Minute, 5*time.Second)). A step under a millisecond is a
// millisecond, and a window shorter than a step is one step; a window
// that is not a multiple of the step is rounded up to one.
func New(window, step time.Duration) *History {
	step = max(step, time.Millisecond)
	steps := max(int((window+step-1)/step), 1)
	return &History{step: step, steps: steps, now: time.Now, sinks: map[string]*ring{}}
}

// ring holds a sink's counts of the last steps+1 steps (the one under way
// too), each slot tagged with the step it counts: a slot whose tag is not
// the step asked for counts nothing.
type ring struct {
	mu    sync.Mutex
	slots []slot
}

type slot struct {
	step              int64 // time since the epoch in steps
	delivered, failed uint64
}

// Published counts one event delivered to sink.
func (h *History) Published(sink string) { h.add(sink, 1, 0) }

// Failed counts one delivery to sink that did not succeed, whatever its
// outcome (retry, dead, or held back while the sink is down).
func (h *History) Failed(sink string) { h.add(sink, 0, 1) }

// stepOf is the number of the step t falls in.
func (h *History) stepOf(t time.Time) int64 { return t.UnixNano() / int64(h.step) }

func (h *History) add(sink string, delivered, failed uint64) {
	n := h.stepOf(h.now())
	r := h.ring(sink)
	r.mu.Lock()
	s := &r.slots[n%int64(len(r.slots))]
	switch {
	case s.step == n:
	case s.step < n:
		*s = slot{step: n}
	default:
		// The clock went back past a step counted since: the count is lost
		// rather than added to a newer step.
		r.mu.Unlock()
		return
	}
	s.delivered += delivered
	s.failed += failed
	r.mu.Unlock()
}

// ring returns sink's ring, made on its first measurement.
func (h *History) ring(sink string) *ring {
	h.mu.RLock()
	r := h.sinks[sink]
	h.mu.RUnlock()
	if r != nil {
		return r
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r = h.sinks[sink]; r == nil {
		r = &ring{slots: make([]slot, h.steps+1)}
		for i := range r.slots {
			r.slots[i].step = -1 // counts no step
		}
		h.sinks[sink] = r
	}
	return r
}

// Point is a sink's throughput over one step: events per second delivered
// and failed in the step ending at At.
type Point struct {
	At        time.Time `json:"at"`
	Delivered float64   `json:"delivered"`
	Failed    float64   `json:"failed"`
}

// Series returns sink's throughput over the window before now, oldest
// first: one point per complete step (window/step of them), zeros where
// nothing happened (and for a sink never reported). The step under way is
// left out, so the last point ends at most a step before now.
func (h *History) Series(sink string, now time.Time) []Point {
	last := h.stepOf(now) - 1 // the last complete step
	out := make([]Point, h.steps)
	for i := range out {
		out[i].At = time.Unix(0, (last-int64(h.steps-1-i)+1)*int64(h.step))
	}
	h.mu.RLock()
	r := h.sinks[sink]
	h.mu.RUnlock()
	if r == nil {
		return out
	}
	secs := h.step.Seconds()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range out {
		n := last - int64(h.steps-1-i)
		if n < 0 {
			continue
		}
		if s := r.slots[n%int64(len(r.slots))]; s.step == n {
			out[i].Delivered = float64(s.delivered) / secs
			out[i].Failed = float64(s.failed) / secs
		}
	}
	return out
}

// RateWindow is how far back Rates looks: the last minute, or the whole
// window when it is shorter.
const RateWindow = time.Minute

// Rates returns sink's events per second delivered and failed over the
// complete steps of the last RateWindow before now (rounded up to whole
// steps, at most the window): a rate that is at most a step old and does
// not jump with each event of the step under way.
func (h *History) Rates(sink string, now time.Time) (delivered, failed float64) {
	n := min(max(int((RateWindow+h.step-1)/h.step), 1), h.steps)
	pts := h.Series(sink, now)
	for _, p := range pts[len(pts)-n:] {
		delivered += p.Delivered
		failed += p.Failed
	}
	return delivered / float64(n), failed / float64(n)
}

// Sinks returns the sinks measured so far, sorted by name.
func (h *History) Sinks() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.sinks))
	for s := range h.sinks {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
