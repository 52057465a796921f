package relay

import "time"

// Observer receives the relay's measurements; the metrics package implements
// it. Methods are called from the relay's loop and must not block. A topic
// they are given is the event's topic label (Config.MetricsTopics): the
// first of those patterns the topic matches, or OtherTopics; never an
// event's own topic, which may be any of countless strings.
type Observer interface {
	// Claimed reports one claim round trip: how many events and how long.
	Claimed(events int, took time.Duration)
	// Published reports an event a sink acknowledged, with the time from the
	// event's creation to the acknowledgement.
	Published(sink, topic string, latency time.Duration)
	// Failed reports a failed delivery; outcome is "retry", "dead" or "paused".
	Failed(sink, topic, outcome string)
	// DeadLettered reports a dead letter: an event dead on one sink (or on
	// the routing step, when no route matched or it could not be read).
	DeadLettered(topic string)
	// SinkPaused reports a sink being paused (true) or resumed (false).
	SinkPaused(sink string, paused bool)
	// Recorded reports one outcome-recording round trip.
	Recorded(events int, took time.Duration)
	// SinkPublish reports one Publish call to a sink: how many events it
	// was handed and how long the call took.
	SinkPublish(sink string, events int, took time.Duration)
}

// StoreObserver is an Observer that also receives figures of the
// database itself, which the relay reads at each look of its table
// maintenance (every 10 seconds, and more often while it records many
// events). The metrics package implements it; Observers passes them on to
// those of its list that do.
type StoreObserver interface {
	Observer
	// HistoryLength reports InnoDB's history list length on MySQL and
	// MariaDB: undo records not yet purged, over which claims slow down
	// (a long transaction anywhere on the server holds purge back). It is
	// 0 on PostgreSQL, and when the relay's user may not read it (MySQL 8
	// wants the PROCESS privilege).
	HistoryLength(n int64)
}

// NopObserver ignores every measurement.
type NopObserver struct{}

// Claimed implements Observer.
func (NopObserver) Claimed(int, time.Duration) {}

// Published implements Observer.
func (NopObserver) Published(string, string, time.Duration) {}

// Failed implements Observer.
func (NopObserver) Failed(string, string, string) {}

// DeadLettered implements Observer.
func (NopObserver) DeadLettered(string) {}

// SinkPaused implements Observer.
func (NopObserver) SinkPaused(string, bool) {}

// Recorded implements Observer.
func (NopObserver) Recorded(int, time.Duration) {}

// SinkPublish implements Observer.
func (NopObserver) SinkPublish(string, int, time.Duration) {}

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

func (t observers) DeadLettered(topic string) {
	for _, o := range t {
		o.DeadLettered(topic)
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

func (t observers) HistoryLength(n int64) {
	for _, o := range t {
		if so, ok := o.(StoreObserver); ok {
			so.HistoryLength(n)
		}
	}
}
