package relaybench

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sqs"
	"github.com/heraldhq/herald/sinks/webhook"
)

// Mode selects what a run measures.
type Mode string

const (
	// ModeDrain times the delivery of a committed backlog.
	ModeDrain Mode = "drain"
	// ModeLive measures commit-to-publish latency under a steady load.
	ModeLive Mode = "live"
	// ModeOutage measures what an outage of one sink costs the database:
	// the row writes per event of a backlog that waits for a sink that is
	// down, and the time that sink takes to catch up once it is back.
	ModeOutage Mode = "outage"
	// ModeIsolation measures live traffic to two sinks while one of them is
	// down for a while: the healthy sink's latency, minute by minute,
	// before, during and after the outage.
	ModeIsolation Mode = "isolation"
	// ModeHotKey times the drain of a backlog while one key's events wait
	// behind a head that keeps failing.
	ModeHotKey Mode = "hotkey"
	// ModeSlow runs live producers to two webhook sinks on one route, each
	// posting to a receiver in the bench's process: "fast" answers at once,
	// "slow" AnswerAfter late. It reports the fast sink's commit-to-arrival
	// latency and the slow sink's throughput against what its concurrency
	// allows.
	ModeSlow Mode = "slow"
	// ModeRecovery times the same backlog twice to a webhook receiver
	// answering AnswerAfter late: once committed while the sink is up
	// (flowing), once queued while it is down and drained when it comes
	// back.
	ModeRecovery Mode = "recovery"
	// ModeSkew runs the relays with their clock ClockOffset off and a sink
	// that fails each event's first FailAttempts attempts, and reports the
	// spacing of the retries against the configured backoff.
	ModeSkew Mode = "skew"
	// ModeBinary times the relay binary from outside: a backlog is
	// committed, `relay run` is started as a process of its own with a
	// discard sink, and the run lasts from its start until the relay's own
	// herald_events_published_total, scraped from its admin server, counts
	// every event.
	ModeBinary Mode = "binary"
	// ModeIdle runs relays on empty tables and counts, for Duration, the
	// statements their connections send and the CPU they and the database
	// use: the price of a relay at rest.
	ModeIdle Mode = "idle"
)

// Sink names of the modes with two sinks (ModeOutage, ModeIsolation): "up"
// is the run's sink type (Config.Sink), "down" an in-process sink that
// refuses every event with sinks.Unavailable while the outage lasts and
// acknowledges them afterwards.
const (
	SinkUp   = "up"
	SinkDown = "down"
)

// Sink names of ModeSlow and ModeRecovery, webhook sinks posting to
// receivers in the bench's process.
const (
	SinkFast = "fast"
	SinkSlow = "slow"
	SinkHook = "hook"
)

// Sink types a run can publish to.
const (
	SinkDiscard = "discard"
	SinkNATS    = "nats"
	SinkKafka   = "kafka"
	SinkWebhook = "webhook"
	// SinkRabbitMQ publishes to a throwaway queue on RabbitMQURL.
	SinkRabbitMQ = "rabbitmq"
	// SinkRedis publishes to a throwaway stream on RedisURL.
	SinkRedis = "redis"
	// SinkMQTT publishes to a topic of the run's own on MQTTURL.
	SinkMQTT = "mqtt"
	// SinkPubSub publishes to a throwaway topic of PubSubProject, at
	// PubSubEndpoint.
	SinkPubSub = "pubsub"
	// SinkSQS sends to a throwaway FIFO queue at AWSEndpoint.
	SinkSQS = "sqs"
	// SinkSNS publishes to a throwaway FIFO topic at AWSEndpoint.
	SinkSNS = "sns"
)

// Config configures a run. Zero fields take the default their comment
// states; flag names are those of `relay bench`.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string, or a mysql:// URL
	// for MySQL or MariaDB (ModeDrain and ModeLive only). Required.
	DatabaseURL string
	// Table names the outbox table inside the run's own schema. Defaults
	// to outbox.
	Table string
	// Keep leaves the run's schema in place instead of dropping it.
	Keep bool
	// Mode is ModeDrain, ModeLive, ModeOutage, ModeIsolation, ModeHotKey,
	// ModeSlow, ModeRecovery, ModeSkew or ModeBinary. Defaults to ModeDrain.
	Mode Mode

	// Events is the backlog committed in ModeDrain, ModeOutage,
	// ModeHotKey (the events of the other keys), ModeRecovery (each of its
	// two phases), ModeSkew and ModeBinary. Defaults to 200,000; to 100,000
	// in ModeHotKey, 6,000 in ModeRecovery and 200 in ModeSkew.
	Events int
	// Keys is the number of distinct keys; 0 gives every event its own key.
	// Defaults to 1,000; to 20 in ModeRecovery and to one key per event in
	// ModeSkew (set KeysSet to use 0).
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
	// HandOffAfter is relay.Config.HandOffAfter for every relay: how long
	// a batch waits for its sinks before it hands off what they have not
	// answered (0: the relay's default).
	HandOffAfter time.Duration
	// Capture is relay.Config.Capture: with relay.CaptureWAL (ModeDrain,
	// ModeLive or ModeBinary, PostgreSQL, one relay), the backlog or the
	// producers' events are emitted into the write-ahead log
	// (outbox_emit_event) instead of inserted into the table, and the relay
	// reads them from a replication slot (ModeBinary creates the slot
	// before the backlog, as a relay's first start would).
	Capture relay.Capture

	// Rate is the producers' total commit rate in ModeLive, ModeIsolation
	// and ModeSlow, in events per second; negative means as fast as they
	// can. Defaults to 1,000, and to 200 in ModeSlow.
	Rate int
	// Producers is the number of producer goroutines. Defaults to 4.
	Producers int
	// TxEvents is the number of events each producer transaction commits.
	// Defaults to 1.
	TxEvents int
	// Duration is how long producers run in ModeLive, ModeIsolation and
	// ModeSlow. Defaults to 30s; 20s in ModeSlow, and in ModeIsolation
	// OutageAfter + Outage + 2m.
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

	// Sink is SinkDiscard, SinkNATS, SinkKafka, SinkWebhook, SinkRedis,
	// SinkRabbitMQ, SinkMQTT, SinkPubSub, SinkSQS or SinkSNS. Defaults to
	// SinkDiscard.
	Sink string
	// NATSURL is the JetStream server for SinkNATS. Defaults to
	// nats://127.0.0.1:4222.
	NATSURL string
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
	// KafkaBrokers are the bootstrap brokers for SinkKafka, host:port. The
	// run creates a throwaway topic there and deletes it at the end.
	// Required for SinkKafka: the relay binary starts no broker of its own
	// (`go run ./internal/cmd/benchpeer` starts an in-process one for
	// development).
	KafkaBrokers []string
	// KafkaPartitions is the partition count of the throwaway Kafka topic.
	// Defaults to 8.
	KafkaPartitions int
	// RabbitMQURL is the broker for SinkRabbitMQ, an AMQP URI. The run
	// declares a throwaway durable queue there (bound through the default
	// exchange) and deletes it at the end. Defaults to
	// amqp://guest:guest@127.0.0.1:5672/.
	RabbitMQURL string
	// WebhookURL is the receiver SinkWebhook posts to; it must answer 2xx.
	// Empty: an endpoint in the bench's process that answers 204 at once
	// (the relay's own latency to a webhook, over loopback HTTP).
	WebhookURL string
	// RedisURL is the server for SinkRedis. The run appends to a
	// throwaway stream there, capped at about DefaultRedisMaxLen entries
	// (MAXLEN ~) as a production stream would be, and deletes it at the
	// end. Defaults to redis://127.0.0.1:6379/0.
	RedisURL string
	// MQTTURL is the broker SinkMQTT publishes to, QoS 1, under a topic
	// unique to the run. Defaults to mqtt://127.0.0.1:1883.
	MQTTURL string
	// PubSubEndpoint is host:port of the Pub/Sub emulator (or pstest) for
	// SinkPubSub; empty means Google's endpoint with the environment's
	// credentials. The run creates a throwaway topic and deletes it at the
	// end. Defaults to "".
	PubSubEndpoint string
	// PubSubProject is the project of the throwaway topic. Defaults to
	// herald-bench.
	PubSubProject string
	// AWSEndpoint is the SQS/SNS endpoint for SinkSQS and SinkSNS (an
	// emulator such as moto or LocalStack); empty means AWS itself. The run
	// creates a throwaway FIFO queue or topic there and deletes it at the
	// end. Credentials come from the AWS environment (AWS_ACCESS_KEY_ID…).
	AWSEndpoint string
	// AWSRegion is the region for SinkSQS and SinkSNS. Defaults to
	// $AWS_REGION, else us-east-1.
	AWSRegion string
	// AWSInstant, with SinkSQS, replaces AWSEndpoint with an endpoint in
	// the bench's process that accepts every message at once and stores
	// nothing, so the run measures the relay's side alone.
	AWSInstant bool
	// AWSMaxInFlight is the sinks' max_in_flight (batch requests of one
	// publish call in flight at once). Defaults to the sinks' default.
	AWSMaxInFlight int

	// Outage is how long the sink "down" refuses events: from the backlog's
	// commit in ModeOutage, from OutageAfter in ModeIsolation. Defaults to
	// 60s in ModeOutage and 5m in ModeIsolation.
	Outage time.Duration
	// OutageAfter is when the outage of ModeIsolation begins, counted from
	// the producers' start. Defaults to 1m.
	OutageAfter time.Duration
	// PauseMax caps relay.Config.SinkPause, the spacing of the probes of a
	// sink that is down (its first pause is the smaller of the relay's
	// default and PauseMax). Defaults to 1s in ModeOutage, ModeIsolation
	// and ModeRecovery, and to the relay's default otherwise.
	PauseMax time.Duration
	// BackoffMax caps relay.Config.Backoff, the spacing of retries of a
	// failed event (its first retry waits the smaller of 1s and BackoffMax).
	// Defaults to 1s in ModeHotKey, and to the relay's default otherwise.
	BackoffMax time.Duration
	// HotEvents is the number of events of one key queued, before the
	// measured phase of ModeHotKey, behind a head its sink keeps failing
	// with a retryable error; 0 gives the run to compare with. Defaults to
	// 10,000 (set HotEventsSet to use 0).
	HotEvents int
	// HotEventsSet means HotEvents was given, so that 0 is taken as "no hot
	// key" rather than "use the default".
	HotEventsSet bool
	// History, in ModeDrain on PostgreSQL, gives the tables a past before
	// the measured backlog: History events committed and drained by the
	// same relays, the outbox analysed when half of them are delivered
	// and not after; the backlog is then committed without an ANALYZE, as
	// a batch job's burst meets a relay idle on a table with history.
	History int

	// AnswerAfter is how late the receiver of the slow sink (ModeSlow) or
	// of the sink "hook" (ModeRecovery) answers each request. Defaults to
	// 200ms in ModeSlow and 20ms in ModeRecovery. In ModeIsolation, when
	// set, the sink "down" is a webhook posting to a receiver in the
	// bench's process that answers this late, rather than an in-process
	// sink answering at once: its catch-up is then bound by its
	// concurrency and its keys, as a real endpoint's is.
	AnswerAfter time.Duration
	// WebhookConcurrency is the requests in flight each webhook sink of
	// ModeSlow, ModeRecovery and ModeIsolation allows
	// (webhook.Config.Concurrency). Defaults to the sink's default, 16.
	WebhookConcurrency int
	// ClockOffset is added to the relays' clock (relay.Config.Clock) in
	// ModeSkew. Defaults to 1h (set ClockOffsetSet to use 0).
	ClockOffset time.Duration
	// ClockOffsetSet means ClockOffset was given, so that 0 is taken as
	// "no offset" rather than "use the default".
	ClockOffsetSet bool
	// FailAttempts is how many attempts of each event the sink of ModeSkew
	// fails (retryable) before it acknowledges it. Defaults to 3; at most
	// 9, below the relay's 10 attempts.
	FailAttempts int
	// RelayBinary is the relay binary ModeBinary starts. Defaults to the
	// running executable (relay bench is the relay binary).
	RelayBinary string

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
	DefaultRedisURL        = "redis://127.0.0.1:6379/0"
	DefaultRedisMaxLen     = 200_000
	DefaultNATSMaxMsgs     = 200_000
	DefaultRabbitMQURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPubSubProject   = "herald-bench"
	DefaultAWSRegion       = "us-east-1"
	DefaultKafkaPartitions = 8
	DefaultMQTTURL         = "mqtt://127.0.0.1:1883"
	DefaultTimeout         = 5 * time.Minute

	minPayloadBytes = len(`{"pad":""}`)
	maxPayloadBytes = 1 << 20
	// maxLiveEvents bounds the preallocated per-event arrays of a live run.
	maxLiveEvents = 50_000_000
)

// Defaults of the failure modes.
const (
	DefaultHotKeyEvents    = 100_000
	DefaultHotEvents       = 10_000
	DefaultOutage          = 60 * time.Second
	DefaultIsolationOutage = 5 * time.Minute
	DefaultOutageAfter     = time.Minute
	// DefaultFailurePause is PauseMax in ModeOutage, ModeIsolation and
	// ModeRecovery, and BackoffMax in ModeHotKey and ModeSkew: outages end
	// promptly and heads are retried often, the harder case for the healthy
	// traffic.
	DefaultFailurePause = time.Second
)

// Defaults of the isolation modes: the cases docs/benchmarks.md reports.
const (
	DefaultSlowRate           = 200
	DefaultSlowDuration       = 20 * time.Second
	DefaultSlowAnswerAfter    = 200 * time.Millisecond
	DefaultRecoveryEvents     = 6_000
	DefaultRecoveryKeys       = 20
	DefaultRecoveryAnswer     = 20 * time.Millisecond
	DefaultSkewEvents         = 200
	DefaultClockOffset        = time.Hour
	DefaultFailAttempts       = 3
	DefaultSkewPollInterval   = 50 * time.Millisecond
	DefaultSkewBackoffInitial = 200 * time.Millisecond
	// DefaultIdleDuration is ModeIdle's window: a minute holds several
	// rounds of every periodic statement (lane renewals, maintenance,
	// gauges).
	DefaultIdleDuration = time.Minute

	// isolationTail is how long the producers of ModeIsolation run after
	// the outage by default.
	isolationTail = 2 * time.Minute
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
		switch c.Mode {
		case ModeHotKey:
			c.Events = DefaultHotKeyEvents
		case ModeRecovery:
			c.Events = DefaultRecoveryEvents
		case ModeSkew:
			c.Events = DefaultSkewEvents
		default:
			c.Events = DefaultEvents
		}
	}
	if c.AnswerAfter == 0 {
		switch c.Mode {
		case ModeSlow:
			c.AnswerAfter = DefaultSlowAnswerAfter
		case ModeRecovery:
			c.AnswerAfter = DefaultRecoveryAnswer
		}
	}
	if c.WebhookConcurrency == 0 {
		c.WebhookConcurrency = webhook.DefaultConcurrency
	}
	if c.ClockOffset == 0 && !c.ClockOffsetSet {
		c.ClockOffset = DefaultClockOffset
	}
	if c.FailAttempts == 0 {
		c.FailAttempts = DefaultFailAttempts
	}
	if c.PollInterval == 0 && c.Mode == ModeSkew {
		// The relay looks for retries coming due every poll interval: a
		// short one keeps that wait out of the spacing measured.
		c.PollInterval = DefaultSkewPollInterval
	}
	if c.HotEvents == 0 && !c.HotEventsSet {
		c.HotEvents = DefaultHotEvents
	}
	if c.Outage == 0 {
		c.Outage = DefaultOutage
		if c.Mode == ModeIsolation {
			c.Outage = DefaultIsolationOutage
		}
	}
	if c.OutageAfter == 0 {
		c.OutageAfter = DefaultOutageAfter
	}
	if c.PauseMax == 0 && (c.Mode == ModeOutage || c.Mode == ModeIsolation || c.Mode == ModeRecovery) {
		c.PauseMax = DefaultFailurePause
	}
	if c.BackoffMax == 0 && (c.Mode == ModeHotKey || c.Mode == ModeSkew) {
		c.BackoffMax = DefaultFailurePause
	}
	if c.Keys == 0 && !c.KeysSet {
		switch c.Mode {
		case ModeRecovery:
			c.Keys = DefaultRecoveryKeys
		case ModeSkew: // every event its own key
		default:
			c.Keys = DefaultKeys
		}
	}
	if c.PayloadBytes == 0 {
		c.PayloadBytes = DefaultPayloadBytes
	}
	if c.Relays == 0 {
		c.Relays = 1
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
		if c.Mode == ModeSlow {
			c.Rate = DefaultSlowRate
		}
	}
	if c.Producers == 0 {
		c.Producers = DefaultProducers
	}
	if c.TxEvents == 0 {
		c.TxEvents = 1
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
		if c.Mode == ModeSlow {
			c.Duration = DefaultSlowDuration
		}
		if c.Mode == ModeIdle {
			c.Duration = DefaultIdleDuration
		}
		if c.Mode == ModeIsolation && c.Outage > 0 && c.OutageAfter > 0 {
			c.Duration = c.OutageAfter + c.Outage + isolationTail
		}
	}
	if c.Sink == "" {
		c.Sink = SinkDiscard
	}
	if c.NATSURL == "" {
		c.NATSURL = DefaultNATSURL
	}
	if c.RedisURL == "" {
		c.RedisURL = DefaultRedisURL
	}
	if c.PubSubProject == "" {
		c.PubSubProject = DefaultPubSubProject
	}
	if c.RabbitMQURL == "" {
		c.RabbitMQURL = DefaultRabbitMQURL
	}
	if c.AWSRegion == "" {
		c.AWSRegion = cmp.Or(os.Getenv("AWS_REGION"), DefaultAWSRegion)
	}
	if c.NATSMaxMsgs == 0 {
		c.NATSMaxMsgs = DefaultNATSMaxMsgs
	}
	if c.KafkaPartitions == 0 {
		c.KafkaPartitions = DefaultKafkaPartitions
	}
	if c.MQTTURL == "" {
		c.MQTTURL = DefaultMQTTURL
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
	if c.isMySQL() {
		if err := c.validateMySQL(); err != nil {
			return err
		}
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		return errors.New("--database-url: not a valid PostgreSQL connection string")
	}
	switch {
	case !c.Mode.valid():
		return fmt.Errorf("--mode: %q must be drain, live, outage, isolation, hotkey, slow, recovery, skew, binary or idle", c.Mode)
	case c.Events < 1:
		return fmt.Errorf("--events: must be at least 1, got %d", c.Events)
	case c.Keys < 0:
		return fmt.Errorf("--keys: must not be negative, got %d", c.Keys)
	case c.PayloadBytes < minPayloadBytes || c.PayloadBytes > maxPayloadBytes:
		return fmt.Errorf("--payload-bytes: must be between %d and %d, got %d", minPayloadBytes, maxPayloadBytes, c.PayloadBytes)
	case c.History < 0 || c.History > maxLiveEvents:
		return fmt.Errorf("--history: must be between 0 and %d, got %d", maxLiveEvents, c.History)
	case c.History > 0 && (c.Mode != ModeDrain || c.isMySQL() || c.Capture == relay.CaptureWAL):
		return errors.New("--history: gives a table a past in --mode drain on PostgreSQL's table capture only")
	case c.Relays < 1 || c.Relays > 64:
		return fmt.Errorf("--relays: must be between 1 and 64, got %d", c.Relays)
	case c.BatchSize < 0:
		return fmt.Errorf("--batch-size: must not be negative, got %d", c.BatchSize)
	case c.PollInterval < 0:
		return fmt.Errorf("--poll-interval: must not be negative, got %s", c.PollInterval)
	case c.Lease < 0:
		return fmt.Errorf("--lease: must not be negative, got %s", c.Lease)
	case c.HandOffAfter < 0:
		return fmt.Errorf("--hand-off-after: must not be negative, got %s", c.HandOffAfter)
	case c.Capture != "" && c.Capture != relay.CaptureTable && c.Capture != relay.CaptureWAL:
		return fmt.Errorf("--capture: must be %q or %q, got %q", relay.CaptureTable, relay.CaptureWAL, c.Capture)
	case c.Capture == relay.CaptureWAL && (!slices.Contains([]Mode{ModeDrain, ModeLive, ModeBinary, ModeIdle}, c.Mode) || c.Relays != 1 || c.isMySQL()):
		return fmt.Errorf("--capture wal: measures --mode drain, live, binary or idle with one relay on PostgreSQL (got mode %s, %d relays)", c.Mode, c.Relays)
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
	case c.Outage < 0:
		return fmt.Errorf("--outage: must be positive, got %s", c.Outage)
	case c.OutageAfter < 0:
		return fmt.Errorf("--outage-after: must be positive, got %s", c.OutageAfter)
	case c.PauseMax < 0:
		return fmt.Errorf("--pause-max: must not be negative, got %s", c.PauseMax)
	case c.BackoffMax < 0:
		return fmt.Errorf("--backoff-max: must not be negative, got %s", c.BackoffMax)
	case c.HotEvents < 0:
		return fmt.Errorf("--hot-events: must not be negative, got %d", c.HotEvents)
	case c.Mode == ModeIsolation && c.Duration <= c.OutageAfter+c.Outage:
		return fmt.Errorf("--duration: %s must be longer than --outage-after (%s) plus --outage (%s)", c.Duration, c.OutageAfter, c.Outage)
	case c.KafkaPartitions < 1:
		return fmt.Errorf("--kafka-partitions: must be at least 1, got %d", c.KafkaPartitions)
	case c.AnswerAfter < 0:
		return fmt.Errorf("--answer-after: must not be negative, got %s", c.AnswerAfter)
	case c.Mode == ModeSlow && c.AnswerAfter == 0:
		return errors.New("--answer-after: must be positive with --mode slow (the slow sink's delay)")
	case c.WebhookConcurrency < 1 || c.WebhookConcurrency > 1000:
		return fmt.Errorf("--webhook-concurrency: must be between 1 and 1000, got %d", c.WebhookConcurrency)
	case c.FailAttempts < 1 || c.FailAttempts > 9:
		return fmt.Errorf("--fail-attempts: must be between 1 and 9 (the relay makes 10 attempts), got %d", c.FailAttempts)
	case c.ClockOffset < -24*time.Hour || c.ClockOffset > 24*time.Hour:
		return fmt.Errorf("--clock-offset: must be within ±24h, got %s", c.ClockOffset)
	}
	if err := c.validateMode(); err != nil {
		return err
	}
	switch c.Sink {
	case SinkDiscard, SinkNATS:
	case SinkKafka:
		if len(c.KafkaBrokers) == 0 {
			return errors.New("--kafka-brokers: required with --sink kafka (host:port, comma-separated)")
		}
		for i, b := range c.KafkaBrokers {
			if _, _, err := net.SplitHostPort(b); err != nil {
				return fmt.Errorf("--kafka-brokers: broker %d %q: %w", i+1, b, err)
			}
		}
	case SinkRabbitMQ:
		if u, err := url.Parse(c.RabbitMQURL); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			return errors.New("--rabbitmq-url: not an AMQP URI such as amqp://user:password@host:5672/")
		}
	case SinkWebhook:
		if c.WebhookURL == "" {
			break // an endpoint in the bench's process
		}
		if u, err := url.Parse(c.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--webhook-url: %q is not an http(s) URL", c.WebhookURL)
		}
	case SinkRedis:
		if err := (redis.Config{URL: c.RedisURL}).Validate(); err != nil {
			return fmt.Errorf("--redis-url: %w", err)
		}
	case SinkMQTT:
		if err := (mqtt.Config{URL: c.MQTTURL}).Validate(); err != nil {
			return fmt.Errorf("--mqtt-%w", err) // "url: ...", the only key set
		}
	case SinkPubSub:
		if err := (pubsub.Config{Project: c.PubSubProject, Endpoint: c.PubSubEndpoint}).Validate(); err != nil {
			return fmt.Errorf("--pubsub-%w", err)
		}
	case SinkSQS, SinkSNS:
		if c.AWSInstant && (c.Sink != SinkSQS || c.AWSEndpoint != "") {
			return errors.New("--aws-instant: only with --sink sqs, and without --aws-endpoint")
		}
		if err := c.awsConfig().Validate(); err != nil {
			return fmt.Errorf("--aws-endpoint, --aws-region: %w", err)
		}
	default:
		return fmt.Errorf("--sink: %q must be discard, nats, kafka, webhook, redis, rabbitmq, mqtt, pubsub, sqs or sns", c.Sink)
	}
	if c.Mode == ModeHotKey && c.Events+c.HotEvents > maxLiveEvents {
		return fmt.Errorf("--events, --hot-events: %d events in all, at most %d", c.Events+c.HotEvents, maxLiveEvents)
	}
	if c.Mode.live() {
		if n := c.liveCapacity(); n > maxLiveEvents {
			return fmt.Errorf("--rate, --duration: %d events to track, at most %d", n, maxLiveEvents)
		}
		if c.Rate < 0 && c.Producers*int(c.Duration.Seconds()+1) > maxLiveEvents {
			return errors.New("--duration: too long for an unlimited --rate")
		}
		if c.Keys > 0 && c.Keys < c.Producers {
			// Each key's commits come from one producer, one after
			// another, so that its seq order is its commit order.
			return fmt.Errorf("--keys: at least --producers (%d) when producers commit, each writing keys of its own; got %d", c.Producers, c.Keys)
		}
	}
	return nil
}

// validateMode checks what the isolation, binary and idle modes require:
// they run on PostgreSQL (binary on MySQL too), and the slow and recovery
// modes' webhook sinks post to receivers of their own.
func (c Config) validateMode() error {
	switch c.Mode {
	case ModeSlow, ModeRecovery, ModeSkew, ModeBinary, ModeIdle:
	default:
		return nil
	}
	if c.isMySQL() && c.Mode != ModeBinary {
		return fmt.Errorf("--mode: %s runs on PostgreSQL only", c.Mode)
	}
	if c.Sink != SinkDiscard && c.Mode != ModeRecovery {
		return fmt.Errorf("--sink: --mode %s chooses its own sinks (leave --sink at discard)", c.Mode)
	}
	if c.Relays != 1 && c.Mode == ModeBinary {
		return errors.New("--relays: --mode binary starts one relay process")
	}
	return nil
}

func (m Mode) valid() bool {
	switch m {
	case ModeDrain, ModeLive, ModeOutage, ModeIsolation, ModeHotKey, ModeSlow, ModeRecovery, ModeSkew, ModeBinary, ModeIdle:
		return true
	}
	return false
}

// live reports whether producers commit while the relays run.
func (m Mode) live() bool { return m == ModeLive || m == ModeIsolation || m == ModeSlow }

// liveCapacity is the number of events a live run may commit (with room for
// producers running slightly ahead of schedule).
func (c Config) liveCapacity() int {
	if c.Rate < 0 {
		// As fast as they can: a generous bound for one loopback database.
		return int(c.Duration.Seconds()+1) * 50_000
	}
	return int(float64(c.Rate)*c.Duration.Seconds()*1.05) + 100*c.Producers*max(c.TxEvents, 1)
}

// awsConfig is the AWS connection of SinkSQS and SinkSNS: the region and
// endpoint of the flags, the credentials of the AWS environment.
func (c Config) awsConfig() sqs.Connection {
	return sqs.Connection{Region: c.AWSRegion, Endpoint: c.AWSEndpoint, MaxInFlight: c.AWSMaxInFlight}
}
