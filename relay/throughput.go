package relay

import (
	"time"

	"github.com/heraldhq/herald/relay/internal/throughput"
)

// The throughput history every relay keeps for the admin console's charts:
// the last 15 minutes in 5 s steps, a fixed ring of counters per sink.
const (
	throughputWindow = 15 * time.Minute
	throughputStep   = 5 * time.Second
)

// throughputObserver feeds a relay's deliveries and failures to its
// throughput history.
type throughputObserver struct {
	NopObserver
	history *throughput.History
}

// Published implements Observer.
func (o throughputObserver) Published(sink, _ string, _ time.Duration) { o.history.Published(sink) }

// Failed implements Observer.
func (o throughputObserver) Failed(sink, _, _ string) { o.history.Failed(sink) }

// Throughput returns the relay's per-sink history of deliveries and
// failures over the last 15 minutes, which relay/admin's console charts.
// Its type is internal to Herald: an embedder passes the relay to
// admin.NewForRelay rather than reading it.
func (r *Relay) Throughput() *throughput.History { return r.throughput }
