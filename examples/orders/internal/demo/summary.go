package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/heraldhq/herald/relay"
)

// observer counts the relay's retries and dead letters per sink. Embedding
// NopObserver keeps it compiling when the interface grows.
type observer struct {
	relay.NopObserver
	mu    sync.Mutex
	retry map[string]int64
	dead  map[string]int64
}

func newObserver() *observer {
	return &observer{retry: map[string]int64{}, dead: map[string]int64{}}
}

// Failed implements relay.Observer.
func (o *observer) Failed(sink, _, outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch outcome {
	case "retry":
		o.retry[sink]++
	case "dead":
		o.dead[sink]++
	}
}

func (o *observer) counts(sink string) (retried, dead int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.retry[sink], o.dead[sink]
}

// Summary is what a demo run did and measured.
type Summary struct {
	// Schema is where the demo's tables were (dropped at the end unless
	// kept).
	Schema string `json:"schema"`
	// Container is true when the demo started PostgreSQL with Docker.
	Container bool `json:"container"`
	// OrdersRequested and OrdersPaid count the orders placed and paid.
	OrdersRequested int `json:"orders_requested"`
	OrdersPaid      int `json:"orders_paid"`
	// Events counts the committed events by topic.
	Events map[string]int `json:"events"`
	// Sinks has one entry per sink, in route order.
	Sinks []SinkSummary `json:"sinks"`
	// Outage is how long the webhook answered 503.
	Outage Duration `json:"outage_ms"`
	// WebhookUnavailable and WebhookRefused count the webhook's 503 and 400
	// answers.
	WebhookUnavailable int64 `json:"webhook_unavailable"`
	WebhookRefused     int64 `json:"webhook_refused"`
	// Retried counts failed deliveries scheduled for a retry, all sinks.
	Retried int64 `json:"retried"`
	// DeadLettered counts the events dead before the replay; Replayed those
	// the replay made pending again.
	DeadLettered int64 `json:"dead_lettered"`
	Replayed     int64 `json:"replayed"`
	// PendingLeft and DeadLeft are what the outbox and its queues hold at
	// the end: events not delivered yet, and dead letters.
	PendingLeft int64 `json:"pending_left"`
	DeadLeft    int64 `json:"dead_left"`
	// NATSStored is how many messages the JetStream stream holds.
	NATSStored uint64 `json:"nats_stored"`
	// Latency is commit-to-publish over every delivery of every sink.
	Latency Latency `json:"latency"`
	// Elapsed is the run's duration.
	Elapsed Duration `json:"elapsed_ms"`
}

// SinkSummary is one sink's share.
type SinkSummary struct {
	Name string `json:"name"`
	// Routed counts the committed events the routes send to this sink.
	Routed int `json:"routed"`
	// Published counts the distinct events its peer received.
	Published int `json:"published"`
	// Duplicates counts extra copies its peer received (at least once).
	Duplicates int `json:"duplicates"`
	// Retried and DeadLettered count failed deliveries to it.
	Retried      int64 `json:"retried"`
	DeadLettered int64 `json:"dead_lettered"`
	// Latency is commit-to-publish of its events, measured at its peer.
	Latency Latency `json:"latency"`
}

// Latency is a distribution of commit-to-publish times.
type Latency struct {
	P50 Duration `json:"p50_ms"`
	P99 Duration `json:"p99_ms"`
	Max Duration `json:"max_ms"`
}

// Duration is a time.Duration that encodes in JSON as milliseconds.
type Duration time.Duration

// MarshalJSON writes the duration in milliseconds, to the microsecond.
func (d Duration) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "%.3f", float64(d)/float64(time.Millisecond)), nil
}

// UnmarshalJSON reads milliseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var ms float64
	if _, err := fmt.Sscanf(string(b), "%g", &ms); err != nil {
		return fmt.Errorf("duration in milliseconds: %w", err)
	}
	*d = Duration(ms * float64(time.Millisecond))
	return nil
}

func (d Duration) String() string {
	v := time.Duration(d)
	switch {
	case v >= 10*time.Second:
		return v.Round(100 * time.Millisecond).String()
	case v >= 10*time.Millisecond:
		return v.Round(time.Millisecond).String()
	default:
		return v.Round(10 * time.Microsecond).String()
	}
}

func latencyOf(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	at := func(q float64) Duration {
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		return Duration(ds[max(i, 0)])
	}
	return Latency{P50: at(0.50), P99: at(0.99), Max: Duration(ds[len(ds)-1])}
}

// summary gathers the numbers once everything is delivered.
func (d *run) summary(ctx context.Context) (*Summary, error) {
	totals, err := d.dead.Totals(ctx)
	if err != nil {
		return nil, err
	}
	stored, err := d.nats.stored(ctx)
	if err != nil {
		return nil, err
	}
	s := &Summary{
		Schema:             d.tables.Schema,
		Container:          d.containerd,
		OrdersRequested:    d.opts.Orders,
		OrdersPaid:         int(d.paid.Load()),
		Events:             map[string]int{},
		Outage:             Duration(d.opts.Outage),
		WebhookUnavailable: d.hook.unavailable.Load(),
		WebhookRefused:     d.hook.refused.Load(),
		DeadLettered:       d.deadLettered,
		Replayed:           d.replayed,
		PendingLeft:        totals.Undelivered(),
		DeadLeft:           totals.Dead,
		NATSStored:         stored,
	}
	d.commitMu.Lock()
	commits := d.commits
	for _, topic := range d.topics {
		s.Events[topic]++
	}
	d.commitMu.Unlock()
	routed := d.routed()
	var all []time.Duration
	for _, name := range d.sinkNames() {
		a := d.peers()[name]
		published, dups := a.count()
		retried, dead := d.obs.counts(name)
		var ds []time.Duration
		for id, at := range a.snapshot() {
			if c, ok := commits[id]; ok {
				ds = append(ds, at.Sub(c))
			}
		}
		all = append(all, ds...)
		s.Sinks = append(s.Sinks, SinkSummary{Name: name, Routed: routed[name], Published: published, Duplicates: dups,
			Retried: retried, DeadLettered: dead, Latency: latencyOf(ds)})
		s.Retried += retried
	}
	s.Latency = latencyOf(all)
	s.Elapsed = Duration(time.Since(d.started))
	return s, nil
}

// Check returns an error listing every number that does not add up: orders
// not paid, a sink missing events or receiving unrouted ones, no dead
// letter or a replay count that differs, events left in the outbox, or no
// latency measured.
func (s *Summary) Check() error {
	var errs []error
	if s.OrdersPaid != s.OrdersRequested {
		errs = append(errs, fmt.Errorf("%d orders paid, %d requested", s.OrdersPaid, s.OrdersRequested))
	}
	for _, k := range s.Sinks {
		if k.Published != k.Routed {
			errs = append(errs, fmt.Errorf("sink %s: %d events published, %d routed to it", k.Name, k.Published, k.Routed))
		}
		if k.Routed > 0 && (k.Latency.P50 <= 0 || k.Latency.P99 < k.Latency.P50) {
			errs = append(errs, fmt.Errorf("sink %s: latency p50 %s, p99 %s", k.Name, k.Latency.P50, k.Latency.P99))
		}
	}
	if s.DeadLettered == 0 {
		errs = append(errs, errors.New("no event was dead-lettered"))
	}
	if s.Replayed != s.DeadLettered {
		errs = append(errs, fmt.Errorf("%d dead letters replayed, %d dead-lettered", s.Replayed, s.DeadLettered))
	}
	if s.PendingLeft != 0 || s.DeadLeft != 0 {
		errs = append(errs, fmt.Errorf("%d events pending and %d dead at the end", s.PendingLeft, s.DeadLeft))
	}
	if s.Outage > 0 && s.Retried == 0 {
		errs = append(errs, errors.New("the outage caused no retry"))
	}
	return errors.Join(errs...)
}

// Print writes the summary for people.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "\nHerald demo: %d of %d orders paid in %s\n", s.OrdersPaid, s.OrdersRequested, s.Elapsed)
	topics := make([]string, 0, len(s.Events))
	for t := range s.Events {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	var parts []string
	for _, t := range topics {
		parts = append(parts, fmt.Sprintf("%d %s", s.Events[t], t))
	}
	fmt.Fprintf(w, "events committed with their orders: %s\n\n", strings.Join(parts, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sink\trouted\tpublished\tduplicates\tretried\tdead-lettered\tp50\tp99\tmax\t")
	for _, k := range s.Sinks {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", k.Name, k.Routed, k.Published, k.Duplicates,
			k.Retried, k.DeadLettered, k.Latency.P50, k.Latency.P99, k.Latency.Max)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nwebhook outage: %s of HTTP 503 (%d answers); %d orders.paid refused with HTTP 400\n",
		s.Outage, s.WebhookUnavailable, s.WebhookRefused)
	fmt.Fprintf(w, "retried: %d deliveries   dead-lettered: %d events   replayed: %d   left in the outbox: %d pending, %d dead\n",
		s.Retried, s.DeadLettered, s.Replayed, s.PendingLeft, s.DeadLeft)
	fmt.Fprintf(w, "commit-to-publish latency, all sinks: p50 %s, p99 %s (the p99 includes the outage and the replay)\n",
		s.Latency.P50, s.Latency.P99)
	fmt.Fprintf(w, "NATS stream holds %d messages\n", s.NATSStored)
}

// progress prints the live progress line until the returned function is
// called.
func (d *run) progress(ctx context.Context) func() {
	every := 2 * time.Second
	if d.opts.Live {
		every = 200 * time.Millisecond
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				d.printProgress(ctx)
				if d.opts.Live {
					fmt.Fprintln(d.out)
				}
				return
			case <-tick.C:
				d.printProgress(ctx)
			}
		}
	}()
	return func() { close(stop); <-done }
}

func (d *run) printProgress(ctx context.Context) {
	routed := d.routed()
	line := fmt.Sprintf("orders %d/%d paid", d.paid.Load(), d.opts.Orders)
	for _, name := range d.sinkNames() {
		n, _ := d.peers()[name].count()
		line += fmt.Sprintf(" | %s %d/%d", name, n, routed[name])
	}
	line += fmt.Sprintf(" | webhook 503×%d 400×%d", d.hook.unavailable.Load(), d.hook.refused.Load())
	if t, err := d.dead.Totals(ctx); err == nil {
		line += fmt.Sprintf(" | pending %d dead %d", t.Undelivered(), t.Dead)
	}
	phase, _ := d.phase.Load().(string)
	line += " | " + phase
	if d.opts.Live {
		fmt.Fprintf(d.out, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(d.out, line)
	}
}
