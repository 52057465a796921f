package relay

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/heraldhq/herald/internal/routefilter"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/sinks"
)

// Config configures a Relay. Zero fields take the default their comment
// states; WithDefaults fills them and Validate names the first bad field.
type Config struct {
	// Tables names the outbox table. Defaults to public.outbox.
	Tables migrations.Tables
	// Owner identifies this relay in the lanes table. Defaults to
	// host-pid-random.
	Owner string
	// BatchSize is the most events claimed per round trip. Defaults to 1000.
	BatchSize int
	// MaxBatchBytes bounds the payload bytes one claim loads, new events
	// and queued deliveries together; an event larger than that is claimed
	// alone. Defaults to 64 MiB.
	MaxBatchBytes int64
	// MaxEventBytes is the largest payload the relay loads: a larger event
	// is dead-lettered, saying so, without being read. Defaults to 16 MiB.
	MaxEventBytes int64
	// Workers is the number of claim loops in this relay. Each leases its
	// own block of lanes, so their database round trips overlap; they share
	// the sinks. Defaults to 2.
	Workers int
	// Lease is how long this relay's lanes (and so their events) stay
	// reserved to it without renewal; a crashed relay's lanes are taken over
	// after it. Defaults to 30 seconds.
	Lease time.Duration
	// PollInterval is the longest an idle relay waits before looking for
	// events when no notification arrives. Defaults to 1 second.
	PollInterval time.Duration
	// PollOnly disables LISTEN/NOTIFY: the relay only polls.
	PollOnly bool
	// MaxAttempts is the attempts per sink for events whose row sets none.
	// Defaults to 10.
	MaxAttempts int
	// Backoff spaces retries of a failed event. Defaults to 1s doubling to 10m
	// with 20% jitter.
	Backoff Backoff
	// SinkPause spaces probes of a sink that is down: a probe is one call
	// with one key's queue, one per pause, and a sink that is back drains
	// its queue from the next probe's first delivery. Defaults to 100ms
	// doubling to 5s with 20% jitter.
	SinkPause Backoff
	// HandOffAfter is how long a batch waits for its sinks' answers, at
	// least: the relay waits four times what its fastest sink usually
	// takes to answer an event when that is longer (a loaded host slows
	// every sink). Events a sink has not answered by then stay in flight:
	// the record makes each the head of its key's queue on that sink, due
	// only once its call must have ended, and the relay claims its next
	// batch; their results are recorded when they arrive. So a slow sink,
	// or a slow event, delays only its own key on its own sink, never the
	// other sinks or keys. Defaults to 50 milliseconds.
	HandOffAfter time.Duration
	// MaxInFlight bounds the events each sink has in flight: handed to
	// Publish calls that have not answered them (and, at most
	// MaxBatchBytes of their payloads). A sink at its bound is handed no
	// more events until it answers some; they wait in its queue, without
	// an attempt counted. Defaults to twice BatchSize.
	MaxInFlight int
	// PublishTimeout bounds one Publish call; at most Lease/2, so that a
	// relay that stops renewing its lanes has finished publishing before
	// another relay may claim their events. A publish also ends when the
	// lanes' lease would run out. Defaults to Lease/2.
	PublishTimeout time.Duration
	// Retention keeps delivered rows (status done) for this long, removed by
	// a cleaner in bounded batches; 0 deletes them as soon as they are
	// delivered. Defaults to 0.
	Retention time.Duration
	// StopKeyOnDeadLetter holds back the rest of a key once one of its events
	// is dead-lettered, until an operator replays or purges it. By default
	// the key moves on.
	StopKeyOnDeadLetter bool
	// ShutdownTimeout bounds the finishing of in-flight work after the run
	// context ends. Defaults to 30 seconds.
	ShutdownTimeout time.Duration
	// Routes map topics to sinks; the first route matching an event (its
	// topic, then its Where filter) applies.
	Routes []Route
	// MetricsTopics are the topic patterns (as in routes) measured one by
	// one: the Observer and the published counts `relay status` shows see,
	// for each event, the first pattern its topic matches, or OtherTopics.
	// Topics come from event data and may be countless; this keeps the
	// series and the counts bounded. Defaults to the routes' patterns.
	MetricsTopics []string
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer receives measurements (metrics). Defaults to none.
	Observer Observer
	// TracerProvider, when set, makes a span per event and sink
	// ("publish <destination>"), child of the producer's trace context found
	// in the event's traceparent/tracestate headers, and hands the sink
	// headers carrying the new span's context. Nil disables tracing and
	// leaves headers untouched.
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the trace context headers when
	// TracerProvider is set. Defaults to W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// Capture is where the relay finds new events: CaptureTable (the
	// default) or CaptureWAL, PostgreSQL only, which also reads the events
	// outbox_emit writes into the write-ahead log, from the replication
	// slot Slot. A relay reading the WAL runs one claim loop (Workers 1).
	Capture Capture
	// Slot is the logical replication slot CaptureWAL reads, created at
	// its first start. Defaults to Tables.SlotName().
	Slot string
	// MaxSlotRetainedBytes bounds the WAL the slot may keep on the
	// server's disk (CaptureWAL): past half of it the relay warns, past it
	// the relay refuses to read the slot (an operator raises the bound, or
	// drops the slot and accepts losing its events). Defaults to 8 GiB.
	MaxSlotRetainedBytes int64
	// Clock is this host's clock. Defaults to time.Now. Tests and
	// benchmarks set it hours off: nothing the database compares comes
	// from it (retries, leases and pauses are timed on the database's
	// clock), so a host whose clock is wrong neither spends an event's
	// attempts at once nor holds its key. The relay times its own view of
	// its lanes' lease with it (when to renew them, how long to trust
	// them, how long lanes taken over from a dead relay wait): it must
	// never go backwards, as time.Now's monotonic reading does not; tests
	// move it forward instead of waiting for a lease.
	Clock func() time.Time
}

// OtherTopics is the topic label of events whose topic matches none of
// Config.MetricsTopics.
const OtherTopics = "(other)"

// maxPayloadBytes is the most bytes PostgreSQL stores in one value.
const maxPayloadBytes = 1 << 30

// maxMetricsTopics bounds Config.MetricsTopics: each is a label value of
// every per-topic series.
const maxMetricsTopics = 1000

// Backoff is an exponential backoff with jitter.
type Backoff struct {
	// Initial is the first delay.
	Initial time.Duration
	// Max caps the delay.
	Max time.Duration
	// Multiplier grows the delay each attempt. Defaults to 2.
	Multiplier float64
	// Jitter randomises each delay by ± this fraction. Defaults to 0.2;
	// set a negative value for none.
	Jitter float64
}

// Delay returns the delay after the given failed attempt (1 for the first).
func (b Backoff) Delay(attempt int) time.Duration {
	eb := &backoff.ExponentialBackOff{
		InitialInterval:     b.Initial,
		RandomizationFactor: max(b.Jitter, 0),
		Multiplier:          b.Multiplier,
		MaxInterval:         b.Max,
		MaxElapsedTime:      0,
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	eb.Reset()
	var d time.Duration
	for range max(attempt, 1) {
		d = eb.NextBackOff()
	}
	return d
}

func (b Backoff) withDefaults(initial, maxDelay time.Duration) Backoff {
	if b.Initial == 0 {
		b.Initial = initial
	}
	if b.Max == 0 {
		b.Max = maxDelay
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.Jitter == 0 {
		b.Jitter = 0.2
	}
	return b
}

func (b Backoff) validate(field string) error {
	switch {
	case b.Initial <= 0:
		return fmt.Errorf("%s.initial: must be positive, got %s", field, b.Initial)
	case b.Max < b.Initial:
		return fmt.Errorf("%s.max: %s is less than initial %s", field, b.Max, b.Initial)
	case b.Multiplier < 1:
		return fmt.Errorf("%s.multiplier: must be at least 1, got %g", field, b.Multiplier)
	case b.Jitter >= 1:
		return fmt.Errorf("%s.jitter: must be below 1, got %g", field, b.Jitter)
	}
	return nil
}

// Filter is a route's compiled where expression: CEL over an event's topic,
// key, headers and payload (see CompileWhere).
type Filter = routefilter.Filter

// CompileWhere parses and type-checks a route's where expression, as the
// relay's configuration file does for `where:` (docs/configuration.md has the
// language): the variables topic, key and headers (a map of strings), and
// payload, the event's JSON payload parsed once for all filters.
func CompileWhere(expr string) (*Filter, error) { return routefilter.Compile(expr) }

// Route sends events whose topic matches one of Topics, and that pass
// Where when it is set, to every target.
type Route struct {
	// Topics are patterns: an exact topic, "*" for all, or a pattern where *
	// matches any run of characters ("orders.*").
	Topics []string
	// Where, when set, narrows the route to the events it matches; an event
	// on which it fails (an evaluation error) does not match. The next
	// route whose topics match is then tried. Nil matches every event.
	// CompileWhere makes one.
	Where *Filter
	// Targets are the sinks, each with an optional destination template.
	Targets []Target
}

// Target is one sink of a route.
type Target struct {
	Sink sinks.Sink
	// Destination renders the Kafka topic, NATS subject… from the event
	// (fields .Topic, .Key, .ID, .Headers). Nil means the event's topic.
	Destination *template.Template
}

// DestinationData is what a destination template sees.
type DestinationData struct {
	ID, Topic, Key string
	Headers        map[string]string
}

func (t Target) destination(e *sinks.Event) (string, error) {
	if t.Destination == nil {
		return e.Topic, nil
	}
	var b bytes.Buffer
	if err := t.Destination.Execute(&b, DestinationData{ID: e.ID, Topic: e.Topic, Key: e.Key, Headers: e.Headers}); err != nil {
		return "", fmt.Errorf("rendering destination for sink %s: %w", t.Sink.Name(), err)
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("destination for sink %s rendered empty", t.Sink.Name())
	}
	return b.String(), nil
}

// MatchTopic reports whether topic matches pattern, where * matches any run
// of characters and everything else matches itself.
func MatchTopic(pattern, topic string) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == topic
	}
	if !strings.HasPrefix(topic, pattern[:star]) {
		return false
	}
	rest, tail := topic[star:], pattern[star+1:]
	for i := 0; i <= len(rest); i++ {
		if MatchTopic(tail, rest[i:]) {
			return true
		}
	}
	return false
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Tables = c.Tables.WithDefaults()
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = 64 << 20
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = 16 << 20
	}
	if c.Capture == "" {
		c.Capture = CaptureTable
	}
	if c.Workers == 0 {
		c.Workers = 2
		if c.Capture == CaptureWAL {
			c.Workers = 1
		}
	}
	if c.Capture == CaptureWAL {
		if c.Slot == "" {
			c.Slot = c.Tables.WithDefaults().SlotName()
		}
		if c.MaxSlotRetainedBytes == 0 {
			c.MaxSlotRetainedBytes = 8 << 30
		}
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	c.Backoff = c.Backoff.withDefaults(time.Second, 10*time.Minute)
	c.SinkPause = c.SinkPause.withDefaults(100*time.Millisecond, 5*time.Second)
	if c.PublishTimeout == 0 {
		c.PublishTimeout = c.Lease / 2
	}
	if c.HandOffAfter == 0 {
		c.HandOffAfter = 50 * time.Millisecond
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 2 * c.BatchSize
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.TracerProvider != nil && c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.MetricsTopics == nil {
		for _, r := range c.Routes {
			for _, p := range r.Topics {
				if p != OtherTopics && !slices.Contains(c.MetricsTopics, p) {
					c.MetricsTopics = append(c.MetricsTopics, p)
				}
			}
		}
	}
	return c
}

// Validate returns an error naming the first invalid field (by its config
// file key).
func (c Config) Validate() error {
	if err := c.Tables.Validate(); err != nil {
		return err
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("relay.batch_size: must be between 1 and 10000, got %d", c.BatchSize)
	case c.MaxBatchBytes < 1:
		return fmt.Errorf("relay.max_batch_bytes: must be positive, got %d", c.MaxBatchBytes)
	case c.MaxEventBytes < 1 || c.MaxEventBytes > maxPayloadBytes:
		return fmt.Errorf("relay.max_event_bytes: must be between 1 and %d (1 GiB, the most PostgreSQL stores in a value), got %d", maxPayloadBytes, c.MaxEventBytes)
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("relay.workers: must be between 1 and 64, got %d", c.Workers)
	case c.Capture != CaptureTable && c.Capture != CaptureWAL:
		return fmt.Errorf("database.capture: must be %q or %q, got %q", CaptureTable, CaptureWAL, c.Capture)
	case c.Capture == CaptureWAL && c.Workers != 1:
		return fmt.Errorf("relay.workers: must be 1 with database.capture: wal (one claim loop reads the slot, holding every lane), got %d", c.Workers)
	case c.Capture == CaptureWAL && !validSlotName(c.Slot):
		return fmt.Errorf("database.slot: must be 1 to 63 lower-case letters, digits and underscores, got %q", c.Slot)
	case c.MaxSlotRetainedBytes < 0:
		return fmt.Errorf("database.max_slot_retained_bytes: must not be negative, got %d", c.MaxSlotRetainedBytes)
	case c.Lease < time.Second:
		return fmt.Errorf("relay.lease: must be at least 1s, got %s", c.Lease)
	case c.PollInterval <= 0:
		return fmt.Errorf("relay.poll_interval: must be positive, got %s", c.PollInterval)
	case c.MaxAttempts < 1:
		return fmt.Errorf("relay.max_attempts: must be at least 1, got %d", c.MaxAttempts)
	case c.PublishTimeout <= 0 || c.PublishTimeout > c.Lease/2:
		return fmt.Errorf("relay.publish_timeout: must be positive and at most half of relay.lease (%s), got %s", c.Lease/2, c.PublishTimeout)
	case c.HandOffAfter <= 0 || c.HandOffAfter > c.PublishTimeout:
		return fmt.Errorf("relay.hand_off_after: must be positive and at most relay.publish_timeout (%s), got %s", c.PublishTimeout, c.HandOffAfter)
	case c.MaxInFlight < 1:
		return fmt.Errorf("relay.max_in_flight: must be at least 1, got %d", c.MaxInFlight)
	case c.Retention < 0:
		return fmt.Errorf("relay.retention: must not be negative, got %s", c.Retention)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("relay.shutdown_timeout: must be positive, got %s", c.ShutdownTimeout)
	case len(c.Owner) > 200:
		return errors.New("relay.owner: longer than 200 bytes")
	}
	if err := c.Backoff.validate("relay.backoff"); err != nil {
		return err
	}
	if err := c.SinkPause.validate("relay.sink_pause"); err != nil {
		return err
	}
	if len(c.Routes) == 0 {
		return errors.New("routes: at least one route is required")
	}
	if len(c.MetricsTopics) > maxMetricsTopics {
		return fmt.Errorf("relay.metrics_topics: at most %d patterns, got %d", maxMetricsTopics, len(c.MetricsTopics))
	}
	for i, p := range c.MetricsTopics {
		if p == "" || p == OtherTopics {
			return fmt.Errorf("relay.metrics_topics[%d]: %q is not a topic pattern", i, p)
		}
	}
	names := map[string]sinks.Sink{}
	for i, r := range c.Routes {
		if len(r.Topics) == 0 {
			return fmt.Errorf("routes[%d].topics: must list at least one topic pattern", i)
		}
		for j, p := range r.Topics {
			if p == "" {
				return fmt.Errorf("routes[%d].topics[%d]: must not be empty", i, j)
			}
		}
		if len(r.Targets) == 0 {
			return fmt.Errorf("routes[%d].sinks: must list at least one sink", i)
		}
		seen := map[string]bool{}
		for j, t := range r.Targets {
			if t.Sink == nil {
				return fmt.Errorf("routes[%d].sinks[%d]: sink is nil", i, j)
			}
			name := t.Sink.Name()
			if name == "" {
				return fmt.Errorf("routes[%d].sinks[%d]: sink has an empty name", i, j)
			}
			if seen[name] {
				return fmt.Errorf("routes[%d].sinks[%d]: sink %q listed twice", i, j, name)
			}
			seen[name] = true
			if prev, ok := names[name]; ok && prev != t.Sink {
				return fmt.Errorf("routes[%d].sinks[%d]: two different sinks are named %q", i, j, name)
			}
			names[name] = t.Sink
		}
	}
	return nil
}

// validSlotName reports whether name is a replication slot's name as
// PostgreSQL accepts it.
func validSlotName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}
