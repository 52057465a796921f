package relay

import (
	"time"
)

// A flight is a key's events on one sink that a batch handed off while its
// Publish call was still running: the batch stopped waiting for them (see
// batch.publish), and its record made the first of them its key's queue
// head on that sink, due only when the call must have ended (a lease), the
// others waiting behind it. The database then holds the order: later
// events of the key join the queue instead of being sent, and neither this
// relay's queue claims nor another relay taking the lane over send the
// head while the call may still be delivering it. When every event of the
// flight has its result, the worker settles them as deliveries claimed from
// the queue (landed), in the next record.
type flight struct {
	call *sinkCall
	// targets are the flight's events on the sink, in seq order, each
	// with its item copied as a delivery of the sink's queue: the first is
	// the head (leased), the others wait behind it.
	targets []target
	// lane and epoch: the lease its events were claimed under. A flight
	// whose lane changed hands since is dropped: its record would be
	// fenced out.
	lane  int
	epoch int64
}

// newFlight starts a flight at t, a head whose call has not answered it.
func (w *worker) newFlight(t *target) *flight {
	f := &flight{call: t.call, lane: int(t.item.lane), epoch: w.leases.Epochs[t.item.lane]}
	f.add(t)
	f.targets[0].leased = true
	f.targets[0].item.head = true
	return f
}

// add appends t, a later event of the flight's key sent in its call.
func (f *flight) add(t *target) {
	it := *t.item // without what a settled delivery does not need
	it.payload, it.headers, it.queued, it.elsewhere = nil, nil, nil, nil
	it.delivery, it.sink, it.head = true, t.name, false
	f.targets = append(f.targets, target{item: &it, sink: t.sink, name: t.name, tries: t.tries, call: t.call, at: t.at})
}

// landed reports whether every event of the flight has its result.
func (f *flight) landed() bool {
	for i := range f.targets {
		if _, ok := f.call.result(f.targets[i].at); !ok {
			return false
		}
	}
	return true
}

// flightLease is how long a head handed off in call stays due later: until
// the call must have ended (its deadline), and a margin for its results to
// be recorded.
func (w *worker) flightLease(c *sinkCall) time.Duration {
	return time.Until(c.deadline) + flightMargin
}

// flightMargin is added to a flight's lease: the time its worker has, once
// the call ended, to record its results before the head is due again.
const flightMargin = 2 * time.Second

// landedTargets removes the flights whose events all have their results
// and returns their targets, judged, for the next record.
func (w *worker) landedTargets() []target {
	var out []target
	kept := w.flights[:0]
	for _, f := range w.flights {
		if !f.landed() {
			kept = append(kept, f)
			continue
		}
		for i := range f.targets {
			t := f.targets[i]
			err, _ := f.call.result(t.at)
			w.r.judge(&t, err)
			out = append(out, t)
		}
	}
	clear(w.flights[len(kept):])
	w.flights = kept
	return out
}

// dropStaleFlights forgets the flights of lanes no longer held under the
// lease they were claimed with: their record would be fenced out, and the
// lane's new owner sends their events again once the heads' leases end.
func (w *worker) dropStaleFlights() {
	kept := w.flights[:0]
	for _, f := range w.flights {
		if w.leases.Mask&(1<<uint(f.lane)) != 0 && w.leases.Epochs[f.lane] == f.epoch {
			kept = append(kept, f)
			continue
		}
		w.log.Warn("relay: a lane changed hands while events of it were in flight; they are sent again by its owner",
			"lane", f.lane, "sink", f.call.sink.name, "events", len(f.targets))
	}
	clear(w.flights[len(kept):])
	w.flights = kept
}

// flightLanes is the mask of lanes with events in flight.
func (w *worker) flightLanes() uint64 {
	var mask uint64
	for _, f := range w.flights {
		mask |= 1 << uint(f.lane)
	}
	return mask
}
