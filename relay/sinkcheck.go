package relay

import (
	"context"
	"sync"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// sinkCheckInterval is how often the relay checks its sinks after the
// check at start: often enough that /readyz follows a destination going
// and coming back within a scrape or two, rarely enough to cost nothing.
const sinkCheckInterval = 15 * time.Second

// sinkCheckTimeout bounds one sink's check.
const sinkCheckTimeout = 10 * time.Second

// SinkCheck is the outcome of a sink's latest check (sinks.Checker).
type SinkCheck struct {
	// At is when the check ended.
	At time.Time
	// Err is nil when the destination answered, else why it did not.
	Err error
}

// checkSinks runs Check, in parallel, on every sink that implements
// sinks.Checker, and keeps each outcome for SinkChecks. A failure is
// logged when it starts and when it ends; delivery to every sink goes on
// meanwhile (a sink that is really down is paused by its publishes).
func (r *Relay) checkSinks(ctx context.Context) {
	var wg sync.WaitGroup
	for _, name := range r.sinkNames {
		c, ok := r.sinkStates[name].Sink.(sinks.Checker)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, sinkCheckTimeout)
			err := c.Check(cctx)
			cancel()
			if ctx.Err() != nil {
				return // stopping: the outcome says nothing of the sink
			}
			r.checksMu.Lock()
			prev, seen := r.checks[name]
			r.checks[name] = SinkCheck{At: time.Now(), Err: err}
			r.checksMu.Unlock()
			switch {
			case err != nil && (!seen || prev.Err == nil):
				r.log.Error("relay: sink check failed: its destination does not answer; other sinks go on", "sink", name, "error", err)
			case err == nil && seen && prev.Err != nil:
				r.log.Info("relay: sink check passes again", "sink", name)
			}
		}()
	}
	wg.Wait()
}

// sinkCheckLoop checks the sinks every sinkCheckInterval until ctx ends
// (the first check runs in Run, before claiming).
func (r *Relay) sinkCheckLoop(ctx context.Context) {
	for sleep(ctx, sinkCheckInterval) {
		r.checkSinks(ctx)
	}
}

// SinkChecks returns the latest check of every sink that implements
// sinks.Checker and has been checked, by name. The relay checks them when
// Run starts and every 15 s after. It is safe to call from any goroutine.
func (r *Relay) SinkChecks() map[string]SinkCheck {
	r.checksMu.Lock()
	defer r.checksMu.Unlock()
	out := make(map[string]SinkCheck, len(r.checks))
	for name, c := range r.checks {
		out[name] = c
	}
	return out
}
