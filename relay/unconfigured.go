package relay

import (
	"context"
	"maps"
	"slices"
)

// maxUnconfiguredReported bounds the sinks reported as unconfigured: each
// is a series of a gauge, and sink names in the deliveries table come from
// every configuration the relays ever ran.
const maxUnconfiguredReported = 50

// reportUnconfigured counts the deliveries waiting for sinks the routes do
// not name (a sink removed from the configuration, or misspelt in it) and
// reports them: a warning when a sink's count first shows, the Observer's
// gauge each time, and UnconfiguredSinks. Those deliveries are kept, never
// dead-lettered by the relay: the sink may come back with the next
// configuration (its queue then resumes in order), and only an operator
// removes them (`relay queue drop`).
func (r *Relay) reportUnconfigured(ctx context.Context) {
	present, err := r.store.SinksWithDeliveries(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("relay: listing the sinks with deliveries failed", "error", err)
		}
		return
	}
	counts := map[string]int64{}
	for _, sink := range present {
		if sink == "" || slices.Contains(r.sinkNames, sink) {
			continue
		}
		if len(counts) == maxUnconfiguredReported {
			r.log.Warn("relay: more sinks the configuration does not name have deliveries waiting; reporting the first",
				"reported", maxUnconfiguredReported)
			break
		}
		n, err := r.store.CountWaiting(ctx, sink)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("relay: counting the deliveries of a sink the configuration does not name failed", "sink", sink, "error", err)
			}
			return
		}
		if n > 0 {
			counts[sink] = n
		}
	}
	r.unconfiguredMu.Lock()
	before := r.unconfigured
	r.unconfigured = counts
	r.unconfiguredMu.Unlock()
	for sink, n := range counts {
		if before[sink] == 0 {
			r.log.Warn("relay: deliveries wait for a sink the configuration does not name; they are kept, and resume in order if the sink is configured again ('relay queue drop --sink' removes them)",
				"sink", sink, "deliveries", n)
		}
		r.cfg.Observer.SinkUnconfigured(sink, n)
	}
	for sink := range before {
		if counts[sink] == 0 {
			r.cfg.Observer.SinkUnconfigured(sink, 0)
		}
	}
}

// UnconfiguredSinks returns, for each sink the configuration does not name
// that has deliveries waiting, how many, as the relay last counted them
// (at start, then every 10 seconds). It is safe to call from any
// goroutine.
func (r *Relay) UnconfiguredSinks() map[string]int64 {
	r.unconfiguredMu.Lock()
	defer r.unconfiguredMu.Unlock()
	return maps.Clone(r.unconfigured)
}
