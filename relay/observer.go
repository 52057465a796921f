package relay

import "time"

// Observer receives the relay's measurements; the metrics package implements
// it. Methods are called from the relay's loops and the sinks' calls, and
// must not block. A topic they are given is the event's topic label
// (Config.MetricsTopics): the first of those patterns the topic matches, or
// OtherTopics; never an event's own topic, which may be any of countless
// strings.
//
// An implementation embeds NopObserver (the interface has an unexported
// method to make sure of it) and overrides what it wants: a measurement
// added to Observer later then reaches it as a no-op, and its code keeps
// compiling.
type Observer interface {
	// Claimed reports one claim round trip: how many events and how long.
	Claimed(events int, took time.Duration)
	// Published reports an event a sink acknowledged, with the time from the
	// event's creation to the acknowledgement (on the database's clock).
	Published(sink, topic string, latency time.Duration)
	// Failed reports a failed delivery; outcome is "retry", "dead" or "paused".
	Failed(sink, topic, outcome string)
	// DeadLettered reports a dead letter: an event dead on sink (sink is
	// empty at the routing step, when no route matched or the event could
	// not be read). A dead letter on a sink is also reported to Failed,
	// as the attempt that failed, with outcome "dead".
	DeadLettered(sink, topic string)
	// SinkPaused reports a sink being paused (true) or resumed (false).
	SinkPaused(sink string, paused bool)
	// Recorded reports one outcome-recording round trip.
	Recorded(events int, took time.Duration)
	// SinkPublish reports one Publish call to a sink: how many events it
	// was handed and how long the call took.
	SinkPublish(sink string, events int, took time.Duration)
	// SinkHandedOff reports events a sink had not answered when their
	// batch stopped waiting (Config.HandOffAfter): they stay in flight in
	// its queue, and their results are recorded when they come.
	SinkHandedOff(sink string, events int)
	// SinkInFlight reports how many events a sink has in flight (handed to
	// Publish calls not answered yet), at most Config.MaxInFlight.
	SinkInFlight(sink string, events int)
	// RecordFenced reports a record fenced out of lanes: the relay no
	// longer held them under the lease its work was claimed with (they
	// changed hands), so nothing of them was written and their owner sends
	// their events again.
	RecordFenced(lanes int)
	// SinkUnconfigured reports the deliveries waiting for a sink the
	// relay's configuration does not name (0 once there are none): kept,
	// not dead-lettered, until the sink is configured again or an operator
	// drops them.
	SinkUnconfigured(sink string, deliveries int64)
	// HistoryLength reports InnoDB's history list length on MySQL and
	// MariaDB, read at each look of the relay's table maintenance (every
	// 10 seconds, and more often while it records many events): undo
	// records not yet purged, over which claims slow down (a long
	// transaction anywhere on the server holds purge back). It is not
	// called on PostgreSQL; it reports 0 when the relay's user may not read
	// it (MySQL 8 wants the PROCESS privilege).
	HistoryLength(n int64)
	// CaptureLag reports, with CaptureWAL, how far the relay reading the
	// slot is behind (read every 10 seconds by that relay): how long the
	// oldest event read from the WAL and not yet settled has waited since
	// its commit (0 when none), and the WAL the slot keeps on the server's
	// disk and how far its confirmed position is behind the WAL's end, in
	// bytes.
	CaptureLag(behind time.Duration, retainedBytes, behindBytes int64)

	nop()
}

// NopObserver ignores every measurement. Observers embed it.
type NopObserver struct{}

// Claimed implements Observer.
func (NopObserver) Claimed(int, time.Duration) {}

// Published implements Observer.
func (NopObserver) Published(string, string, time.Duration) {}

// Failed implements Observer.
func (NopObserver) Failed(string, string, string) {}

// DeadLettered implements Observer.
func (NopObserver) DeadLettered(string, string) {}

// SinkPaused implements Observer.
func (NopObserver) SinkPaused(string, bool) {}

// Recorded implements Observer.
func (NopObserver) Recorded(int, time.Duration) {}

// SinkPublish implements Observer.
func (NopObserver) SinkPublish(string, int, time.Duration) {}

// SinkHandedOff implements Observer.
func (NopObserver) SinkHandedOff(string, int) {}

// SinkInFlight implements Observer.
func (NopObserver) SinkInFlight(string, int) {}

// RecordFenced implements Observer.
func (NopObserver) RecordFenced(int) {}

// SinkUnconfigured implements Observer.
func (NopObserver) SinkUnconfigured(string, int64) {}

// HistoryLength implements Observer.
func (NopObserver) HistoryLength(int64) {}

// CaptureLag implements Observer.
func (NopObserver) CaptureLag(time.Duration, int64, int64) {}

func (NopObserver) nop() {}

// Observers returns an Observer that passes every measurement to each of
// list in turn (the metrics and the console's throughput history, say).
// Nil entries are left out; with none left it is a NopObserver.
func Observers(list ...Observer) Observer {
	var tee observers
	for _, o := range list {
		if o != nil {
			tee = append(tee, o)
		}
	}
	switch len(tee) {
	case 0:
		return NopObserver{}
	case 1:
		return tee[0]
	}
	return tee
}

type observers []Observer

func (t observers) nop() {}

func (t observers) Claimed(events int, took time.Duration) {
	for _, o := range t {
		o.Claimed(events, took)
	}
}

func (t observers) Published(sink, topic string, latency time.Duration) {
	for _, o := range t {
		o.Published(sink, topic, latency)
	}
}

func (t observers) Failed(sink, topic, outcome string) {
	for _, o := range t {
		o.Failed(sink, topic, outcome)
	}
}

func (t observers) DeadLettered(sink, topic string) {
	for _, o := range t {
		o.DeadLettered(sink, topic)
	}
}

func (t observers) SinkPaused(sink string, paused bool) {
	for _, o := range t {
		o.SinkPaused(sink, paused)
	}
}

func (t observers) Recorded(events int, took time.Duration) {
	for _, o := range t {
		o.Recorded(events, took)
	}
}

func (t observers) SinkPublish(sink string, events int, took time.Duration) {
	for _, o := range t {
		o.SinkPublish(sink, events, took)
	}
}

func (t observers) SinkHandedOff(sink string, events int) {
	for _, o := range t {
		o.SinkHandedOff(sink, events)
	}
}

func (t observers) SinkInFlight(sink string, events int) {
	for _, o := range t {
		o.SinkInFlight(sink, events)
	}
}

func (t observers) RecordFenced(lanes int) {
	for _, o := range t {
		o.RecordFenced(lanes)
	}
}

func (t observers) SinkUnconfigured(sink string, deliveries int64) {
	for _, o := range t {
		o.SinkUnconfigured(sink, deliveries)
	}
}

func (t observers) HistoryLength(n int64) {
	for _, o := range t {
		o.HistoryLength(n)
	}
}

func (t observers) CaptureLag(behind time.Duration, retained, behindBytes int64) {
	for _, o := range t {
		o.CaptureLag(behind, retained, behindBytes)
	}
}
