package relaybench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode selects what a run measures.
type Mode string

const (
	// ModeDrain times the delivery of a committed backlog.
	ModeDrain Mode = "drain"
	// ModeLive measures commit-to-publish latency under a steady load.
	ModeLive Mode = "live"
)

// Sink types a run can publish to.
const (
	SinkDiscard = "discard"
	SinkNATS    = "nats"
	SinkKafka   = "kafka"
	SinkWebhook = "webhook"
)

// Config configures a run. Zero fields take the default their comment
// states; flag names are those of `relay bench`.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// Table names the outbox table inside the run's own schema. Defaults
	// to outbox.
	Table string
	// Keep leaves the run's schema in place instead of dropping it.
	Keep bool
	// Mode is ModeDrain or ModeLive. Defaults to ModeDrain.
	Mode Mode

	// Events is the backlog drained in ModeDrain. Defaults to 200,000.
	Events int
	// Keys is the number of distinct keys; 0 gives every event its own key.
	// Defaults to 1,000 (set KeysSet to use 0).
	Keys int
	// KeysSet means Keys was given, so that 0 is taken as "every event its
	// own key" rather than "use the default".
	KeysSet bool
	// PayloadBytes is each event's JSON payload size. Defaults to 200;
	// at least 10.
	PayloadBytes int

	// Relays is the number of in-process relays. Defaults to 1.
	Relays int
	// BatchSize, PollOnly, PollInterval and Lease are passed to every
	// relay.Config; zero values take the relay's defaults.
	BatchSize int
	// Workers is relay.Config.Workers for every relay (0: the default).
	Workers      int
	PollOnly     bool
	PollInterval time.Duration
	Lease        time.Duration

	// Rate is the producers' total commit rate in ModeLive, in events per
	// second; negative means as fast as they can. Defaults to 1,000.
	Rate int
	// Producers is the number of producer goroutines. Defaults to 4.
	Producers int
	// TxEvents is the number of events each producer transaction commits.
	// Defaults to 1.
	TxEvents int
	// Duration is how long producers run in ModeLive. Defaults to 30s.
	Duration time.Duration
	// Baseline, when positive, first runs the producers for this long with
	// no relay and reports their commit rate next to the rate with relays.
	Baseline time.Duration
	// ReportEvery, when positive, writes a line to Progress at this
	// interval: events/s, latency, backlog, table size, dead tuples, commit
	// rate.
	ReportEvery time.Duration
	// Progress receives interval reports and phase messages. Nil discards
	// them.
	Progress io.Writer

	// Sink is SinkDiscard, SinkNATS, SinkKafka or SinkWebhook. Defaults to
	// SinkDiscard.
	Sink string
	// NATSURL is the JetStream server for SinkNATS. Defaults to
	// nats://127.0.0.1:4222.
	NATSURL string
	// NATSEmbedded starts an in-process NATS server instead of using NATSURL.
	NATSEmbedded bool
	// NATSFileStorage stores the throwaway stream on disk instead of in
	// memory.
	NATSFileStorage bool
	// NATSMaxMsgs caps the throwaway stream at this many messages, the
	// oldest discarded, as a production stream's limits would: an
	// unbounded memory stream grows nats-server's heap, and its garbage
	// collector's work, with every event of a long run. The bench verifies
	// deliveries by the sink's acknowledgements, never by reading the
	// stream. Defaults to DefaultNATSMaxMsgs; negative: no cap.
	NATSMaxMsgs int
	// KafkaPartitions is the partition count of the in-process Kafka topic.
	// Defaults to 8.
	KafkaPartitions int

	// Timeout bounds the wait for deliveries after the load is in (the
	// whole drain, or the tail after live producers stop). Defaults to 5m.
	Timeout time.Duration
	// Logger receives the relays' and sinks' logs. Defaults to a logger
	// that keeps warnings and errors on slog.Default's handler.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultEvents          = 200_000
	DefaultKeys            = 1_000
	DefaultPayloadBytes    = 200
	DefaultRate            = 1_000
	DefaultProducers       = 4
	DefaultDuration        = 30 * time.Second
	DefaultNATSURL         = "nats://127.0.0.1:4222"
	DefaultNATSMaxMsgs     = 200_000
	DefaultKafkaPartitions = 8
	DefaultTimeout         = 5 * time.Minute

	minPayloadBytes = len(`{"pad":""}`)
	maxPayloadBytes = 1 << 20
	// maxLiveEvents bounds the preallocated per-event arrays of a live run.
	maxLiveEvents = 50_000_000
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.Mode == "" {
		c.Mode = ModeDrain
	}
	if c.Events == 0 {
		c.Events = DefaultEvents
	}
	if c.Keys == 0 && !c.KeysSet {
		c.Keys = DefaultKeys
	}
	if c.PayloadBytes == 0 {
		c.PayloadBytes = DefaultPayloadBytes
	}
	if c.Relays == 0 {
		c.Relays = 1
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Producers == 0 {
		c.Producers = DefaultProducers
	}
	if c.TxEvents == 0 {
		c.TxEvents = 1
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Sink == "" {
		c.Sink = SinkDiscard
	}
	if c.NATSURL == "" {
		c.NATSURL = DefaultNATSURL
	}
	if c.NATSMaxMsgs == 0 {
		c.NATSMaxMsgs = DefaultNATSMaxMsgs
	}
	if c.KafkaPartitions == 0 {
		c.KafkaPartitions = DefaultKafkaPartitions
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(warnHandler{slog.Default().Handler()})
	}
	return c
}

// Validate returns an error naming the first invalid setting by its flag.
func (c Config) Validate() error {
	if c.DatabaseURL == "" {
		return errors.New("--database-url: required")
	}
	if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		return errors.New("--database-url: not a valid PostgreSQL connection string")
	}
	switch {
	case c.Mode != ModeDrain && c.Mode != ModeLive:
		return fmt.Errorf("--mode: %q must be drain or live", c.Mode)
	case c.Events < 1:
		return fmt.Errorf("--events: must be at least 1, got %d", c.Events)
	case c.Keys < 0:
		return fmt.Errorf("--keys: must not be negative, got %d", c.Keys)
	case c.PayloadBytes < minPayloadBytes || c.PayloadBytes > maxPayloadBytes:
		return fmt.Errorf("--payload-bytes: must be between %d and %d, got %d", minPayloadBytes, maxPayloadBytes, c.PayloadBytes)
	case c.Relays < 1 || c.Relays > 64:
		return fmt.Errorf("--relays: must be between 1 and 64, got %d", c.Relays)
	case c.BatchSize < 0:
		return fmt.Errorf("--batch-size: must not be negative, got %d", c.BatchSize)
	case c.PollInterval < 0:
		return fmt.Errorf("--poll-interval: must not be negative, got %s", c.PollInterval)
	case c.Lease < 0:
		return fmt.Errorf("--lease: must not be negative, got %s", c.Lease)
	case c.Producers < 1 || c.Producers > 1000:
		return fmt.Errorf("--producers: must be between 1 and 1000, got %d", c.Producers)
	case c.TxEvents < 1 || c.TxEvents > 1000:
		return fmt.Errorf("--tx-events: must be between 1 and 1000, got %d", c.TxEvents)
	case c.Duration < 0:
		return fmt.Errorf("--duration: must be positive, got %s", c.Duration)
	case c.Baseline < 0:
		return fmt.Errorf("--baseline: must not be negative, got %s", c.Baseline)
	case c.ReportEvery < 0:
		return fmt.Errorf("--report-every: must not be negative, got %s", c.ReportEvery)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout: must be positive, got %s", c.Timeout)
	case c.KafkaPartitions < 1:
		return fmt.Errorf("--kafka-partitions: must be at least 1, got %d", c.KafkaPartitions)
	}
	switch c.Sink {
	case SinkDiscard, SinkNATS, SinkKafka, SinkWebhook:
	default:
		return fmt.Errorf("--sink: %q must be discard, nats, kafka or webhook", c.Sink)
	}
	if c.Mode == ModeLive {
		if n := c.liveCapacity(); n > maxLiveEvents {
			return fmt.Errorf("--rate, --duration: %d events to track, at most %d", n, maxLiveEvents)
		}
		if c.Rate < 0 && c.Producers*int(c.Duration.Seconds()+1) > maxLiveEvents {
			return errors.New("--duration: too long for an unlimited --rate")
		}
	}
	return nil
}

// liveCapacity is the number of events a live run may commit (with room for
// producers running slightly ahead of schedule).
func (c Config) liveCapacity() int {
	if c.Rate < 0 {
		// As fast as they can: a generous bound for one loopback database.
		return int(c.Duration.Seconds()+1) * 50_000
	}
	return int(float64(c.Rate)*c.Duration.Seconds()*1.05) + 100*c.Producers*max(c.TxEvents, 1)
}
