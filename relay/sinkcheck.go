package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"text/template/parse"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// sinkCheckInterval is how often the relay checks its sinks after the
// check at start: often enough that /readyz follows a destination going
// and coming back within a scrape or two, rarely enough to cost nothing.
const sinkCheckInterval = 15 * time.Second

// sinkRecheckInterval is how often the relay checks its sinks while a
// check fails, so that /readyz turns ready within seconds of the
// destination coming back.
const sinkRecheckInterval = 2 * time.Second

// SinkCheckTimeout bounds the check of one sink.
const SinkCheckTimeout = 10 * time.Second

// SinkCheck is the outcome of a sink's latest check.
type SinkCheck struct {
	// At is when the check ended.
	At time.Time
	// Err is nil when the destination answered, else why it did not.
	Err error
}

// CheckSinks checks, in parallel, each sink of routes that implements
// sinks.Checker and, for one that implements sinks.DestinationChecker,
// the destinations its routes fix before any event: a constant destination
// template, or the exact topics of a route without one. Each check is
// bounded by SinkCheckTimeout. It returns the outcome of every checked
// sink by name (nil: it answered); sinks that cannot be checked are absent.
func CheckSinks(ctx context.Context, routes []Route) map[string]error {
	type plan struct {
		sink         sinks.Sink
		destinations []string
	}
	plans := map[string]*plan{}
	for _, r := range routes {
		for _, t := range r.Targets {
			name := t.Sink.Name()
			p := plans[name]
			if p == nil {
				p = &plan{sink: t.Sink}
				plans[name] = p
			}
			for _, d := range fixedDestinations(r.Topics, t) {
				if !slices.Contains(p.destinations, d) {
					p.destinations = append(p.destinations, d)
				}
			}
		}
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]error{}
	)
	for name, p := range plans {
		c, ok := p.sink.(sinks.Checker)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, SinkCheckTimeout)
			defer cancel()
			err := c.Check(cctx)
			if dc, ok := p.sink.(sinks.DestinationChecker); ok && err == nil && len(p.destinations) > 0 {
				err = dc.CheckDestinations(cctx, p.destinations...)
			}
			if err != nil && cctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w (no answer within %s)", err, SinkCheckTimeout)
			}
			mu.Lock()
			out[name] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// fixedDestinations returns the destinations a route target sends to
// whatever the event: its template's text when the template has no
// actions, or, without a template, the route's topics that are not
// patterns.
func fixedDestinations(topics []string, t Target) []string {
	if t.Destination == nil {
		var out []string
		for _, topic := range topics {
			if !strings.Contains(topic, "*") {
				out = append(out, topic)
			}
		}
		return out
	}
	if t.Destination.Tree == nil {
		return nil
	}
	var b bytes.Buffer
	for _, n := range t.Destination.Tree.Root.Nodes {
		text, ok := n.(*parse.TextNode)
		if !ok {
			return nil // depends on the event
		}
		b.Write(text.Text)
	}
	return []string{b.String()}
}

// checkSinks runs CheckSinks on the relay's routes and keeps each outcome
// for SinkChecks. A failure is logged when it starts and when it ends;
// delivery to every sink goes on meanwhile (a sink that is really down is
// paused by its publishes).
func (r *Relay) checkSinks(ctx context.Context) {
	results := CheckSinks(ctx, r.cfg.Routes)
	if ctx.Err() != nil {
		return // stopping: the outcomes say nothing of the sinks
	}
	now := time.Now()
	r.checksMu.Lock()
	defer r.checksMu.Unlock()
	for name, err := range results {
		prev, seen := r.checks[name]
		r.checks[name] = SinkCheck{At: now, Err: err}
		switch {
		case err != nil && (!seen || prev.Err == nil):
			r.log.Error("relay: sink check failed; other sinks go on", "sink", name, "error", err)
		case err == nil && seen && prev.Err != nil:
			r.log.Info("relay: sink check passes again", "sink", name)
		}
	}
}

// sinkCheckLoop checks the sinks every sinkCheckInterval, or every
// sinkRecheckInterval while one fails, until ctx ends (the first check runs
// in Run, before claiming).
func (r *Relay) sinkCheckLoop(ctx context.Context) {
	for sleep(ctx, r.nextSinkCheck()) {
		r.checkSinks(ctx)
	}
}

// nextSinkCheck is how long until the next check of the sinks.
func (r *Relay) nextSinkCheck() time.Duration {
	r.checksMu.Lock()
	defer r.checksMu.Unlock()
	for _, c := range r.checks {
		if c.Err != nil {
			return sinkRecheckInterval
		}
	}
	return sinkCheckInterval
}

// SinkChecks returns the latest check of every sink CheckSinks checks, by
// name. The relay checks them when Run starts and every 15 s after (every
// 2 s while one fails). It is
// safe to call from any goroutine.
func (r *Relay) SinkChecks() map[string]SinkCheck {
	r.checksMu.Lock()
	defer r.checksMu.Unlock()
	out := make(map[string]SinkCheck, len(r.checks))
	for name, c := range r.checks {
		out[name] = c
	}
	return out
}
