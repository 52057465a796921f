package relaybench

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/heraldhq/herald/sinks"
)

// Errors the bench's failing sinks report.
var (
	// errSinkDown is what a sink refuses events with during an outage: the
	// relay pauses the sink and counts no attempt.
	errSinkDown = sinks.Unavailable(errors.New("relaybench: the sink is down (a simulated outage)"))
	// errHotKey is the retryable failure of the hot key's events.
	errHotKey = errors.New("relaybench: the hot key's events fail (a simulated retryable error)")
)

// fault makes the instances of one bench sink (one per relay) fail on
// purpose: all of their events while down, and the events of one key while
// that key fails. It is safe for concurrent use.
type fault struct {
	down atomic.Bool
	// key, when not empty, is the key whose events fail with errHotKey
	// while keyFails is set.
	key      string
	keyFails atomic.Bool

	// refused counts Publish calls refused as a whole while down (the
	// relay's probes of a paused sink, and the first call of the outage).
	refused atomic.Int64
	// keyRefused counts the Publish calls in which the key's first event
	// failed: the attempts of its queue's head.
	keyRefused atomic.Int64
}

// faultSink is a sinks.Sink that fails as its fault says and hands
// everything else to the sink it wraps.
type faultSink struct {
	sinks.Sink
	f *fault
}

// PublishesConcurrently implements sinks.ConcurrentPublisher by asking the
// wrapped sink (the fault's state is atomic).
func (s *faultSink) PublishesConcurrently() bool {
	c, ok := s.Sink.(sinks.ConcurrentPublisher)
	return ok && c.PublishesConcurrently()
}

// Publish implements sinks.Sink. While down, every event is refused with
// errSinkDown. While the fault's key fails, its first event in the call
// fails with errHotKey and its later ones are skipped (sinks.ErrSkipped, as
// the Sink contract asks of a sink once an event of a key failed); the other
// events go to the wrapped sink in one call.
func (s *faultSink) Publish(ctx context.Context, events []sinks.Event) []error {
	if s.f.down.Load() {
		s.f.refused.Add(1)
		return sinks.Fill(len(events), errSinkDown)
	}
	if s.f.key == "" || !s.f.keyFails.Load() {
		return s.Sink.Publish(ctx, events)
	}
	results := make([]error, len(events))
	pass := make([]sinks.Event, 0, len(events))
	at := make([]int, 0, len(events))
	failed := false
	for i := range events {
		switch {
		case events[i].Key != s.f.key:
			pass = append(pass, events[i])
			at = append(at, i)
		case failed:
			results[i] = sinks.ErrSkipped
		default:
			results[i] = errHotKey
			failed = true
		}
	}
	if failed {
		s.f.keyRefused.Add(1)
	}
	if len(pass) == 0 {
		return results
	}
	inner := s.Sink.Publish(ctx, pass)
	if len(inner) != len(pass) {
		inner = sinks.Fill(len(pass), errors.New("relaybench: the wrapped sink returned a wrong number of results"))
	}
	for j, i := range at {
		results[i] = inner[j]
	}
	return results
}
