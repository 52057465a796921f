package relaybench

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/heraldhq/herald/relay"
)

// observer collects the relays' per-batch timings (relay.Observer).
type observer struct {
	relay.NopObserver // measurements it does not use

	mu        sync.Mutex
	claims    []time.Duration // claims that returned events
	records   []time.Duration
	publishes []time.Duration
	claimed   int64

	recorded atomic.Int64 // events whose outcome was recorded
	failed   atomic.Int64
	// handedOff counts events a batch stopped waiting for (a sink had not
	// answered them within relay.Config.HandOffAfter).
	handedOff  atomic.Int64
	onRecorded func()
}

func (o *observer) Claimed(events int, took time.Duration) {
	if events == 0 {
		return
	}
	o.mu.Lock()
	o.claims = append(o.claims, took)
	o.claimed += int64(events)
	o.mu.Unlock()
}

// claimsSince returns the timings of the claims after the first pos, and
// the position after them.
func (o *observer) claimsSince(pos int) ([]time.Duration, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	pos = min(pos, len(o.claims)) // reset meanwhile
	return slices.Clone(o.claims[pos:]), len(o.claims)
}

func (o *observer) Recorded(events int, took time.Duration) {
	o.mu.Lock()
	o.records = append(o.records, took)
	o.mu.Unlock()
	o.recorded.Add(int64(events))
	if o.onRecorded != nil {
		o.onRecorded()
	}
}

func (o *observer) SinkPublish(_ string, events int, took time.Duration) {
	if events == 0 {
		return
	}
	o.mu.Lock()
	o.publishes = append(o.publishes, took)
	o.mu.Unlock()
}

func (o *observer) Failed(string, string, string) { o.failed.Add(1) }

func (o *observer) SinkHandedOff(_ string, events int) { o.handedOff.Add(int64(events)) }

// reset forgets the timings and counts so far: a measured phase begins.
func (o *observer) reset() {
	o.mu.Lock()
	o.claims, o.records, o.publishes, o.claimed = nil, nil, nil, 0
	o.mu.Unlock()
	o.recorded.Store(0)
	o.failed.Store(0)
}

func (o *observer) summary() (claim, publish, record *Percentiles, meanBatch float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.claims) > 0 {
		meanBatch = float64(o.claimed) / float64(len(o.claims))
	}
	return durations(o.claims), durations(o.publishes), durations(o.records), meanBatch
}

func durations(ds []time.Duration) *Percentiles {
	ns := make([]int64, len(ds))
	for i, d := range ds {
		ns[i] = d.Nanoseconds()
	}
	return percentiles(ns)
}

// percentiles sorts ns (nanoseconds) and summarises it in milliseconds, or
// returns nil when it is empty.
func percentiles(ns []int64) *Percentiles {
	if len(ns) == 0 {
		return nil
	}
	slices.Sort(ns)
	at := func(q float64) float64 {
		i := int(q*float64(len(ns))+0.5) - 1 // nearest rank
		return float64(ns[min(max(i, 0), len(ns)-1)]) / 1e6
	}
	return &Percentiles{Count: len(ns), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: float64(ns[len(ns)-1]) / 1e6}
}
