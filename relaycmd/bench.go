package relaycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/heraldhq/herald/internal/relaybench"
)

// benchLong is the help text of relay bench.
const benchLong = `Measure the relay against this database, in a schema of its own (created,
migrated, and dropped at the end unless --keep).

--mode drain (the default) commits --events events over --keys keys in one
transaction once the relays are ready, and times their delivery: events/s,
per-batch claim/publish/record timings, CPU and peak RSS.

--mode live commits events (--tx-events per transaction, default 1) through
the outbox library from --producers goroutines at --rate events/s (0: as
fast as they can) for --duration while the relays run, and reports the
commit-to-publish latency of each event (sink acknowledgement minus the
time tx.Commit returned). --baseline D first runs the producers for D with
no relay and compares their commit rates. --report-every prints events/s,
latency, backlog, table size and dead tuples periodically.

Three modes measure the failure path. Their route has two sinks, "up" (the
--sink type) and "down" (in-process: it refuses every event as unavailable
during the outage, then acknowledges them), except hotkey's, which has one.

--mode outage commits --events events while "down" is down, keeps it down
for --outage (default 60s) with the relay's sink pause capped at
--pause-max (default 1s), brings it back and waits until the outbox and
deliveries tables are empty: it reports the row writes of both tables
(pg_stat_user_tables, the events' own INSERT excluded) per event, and how
long "down" took to catch up.

--mode isolation runs live producers (as --mode live) to both sinks; "down"
goes down --outage-after (default 1m) after they start, for --outage
(default 5m); --duration defaults to both plus 2m. It reports the healthy
sink's latency before, during and after the outage, and per minute (and per
--report-every) its p50 and p99 next to "down"'s queue depth, and in how
many reports after the outage that queue was longer than at the one
before. With --answer-after, "down" is a webhook whose receiver in this
process answers that late (--webhook-concurrency requests in flight): its
catch-up is then bound by its concurrency and its keys, as an endpoint's.

--mode hotkey queues --hot-events (default 10,000) events of one key behind
a head the sink keeps failing (retryable; retries at most --backoff-max
apart, default 1s), then times the drain of --events (default 100,000)
events of the other keys and reports the claims' durations. --hot-events 0
is the run to compare with.

Three modes measure isolation (issue 23), against webhook receivers in
this process:

--mode slow runs live producers (--rate defaults to 200 events/s,
--duration to 20s) to two webhook sinks on one route: "fast", whose
receiver answers at once, and "slow", whose receiver answers --answer-after
(default 200ms) late; each sink keeps --webhook-concurrency (default 16)
requests in flight. It reports the fast sink's commit-to-arrival latency
and the slow sink's events/s against what its concurrency allows.

--mode recovery commits --events (default 6,000) events over --keys
(default 20) to the sink "hook" (a webhook whose receiver answers
--answer-after, default 20ms, late) beside "up" (the --sink type) and times
their delivery; then it takes hook down, commits as many again, waits until
they are all queued, brings it back and times the queue's drain.

--mode skew runs the relays with their clock --clock-offset (default 1h;
negative for behind) off and a sink that fails each event's first
--fail-attempts (default 3) attempts, backoff 200ms doubling up to
--backoff-max (default 1s) without jitter, and reports the spacing of the
retries next to the configured delays.

--mode binary times the relay as a user meets it: it commits --events
events into a fresh schema, starts "relay run" (--relay-binary, default
this executable) as a process of its own with a discard sink and its
admin server on a free loopback port, and times from the process's start
until its own herald_events_published_total (scraped from /metrics every
50ms) counts every event. CPU is that process's.

--mode idle runs the relays on empty tables (with relay run's defaults
unless --poll-interval, --workers and the like say otherwise) and counts,
for --duration (default 1m), the statements and round trips their
connections send, their CPU, and the local PostgreSQL server's (with
--capture wal, not the slot's status updates on the replication
connection, about one a second).

Every run then verifies that each committed event was acknowledged at least
once by every sink and that each key's events arrived at each sink in seq
order, and exits 1 when not (--mode binary checks the relay's counter and
that the outbox is empty instead).

--sink names where events go: discard (in-process, the default), nats (a
throwaway stream on --nats-url), kafka (a throwaway topic on
--kafka-brokers), webhook (POSTs to --webhook-url, which must answer
2xx, or without it to an endpoint in the bench's process that answers 204
at once), rabbitmq (a throwaway durable queue on --rabbitmq-url), mqtt
(QoS 1 to --mqtt-url, under a topic of the run's own) or pubsub (a
throwaway topic at --pubsub-endpoint). Beside that endpoint the bench
starts no broker or receiver of its own; for development, "go run ./internal/cmd/benchpeer" starts a Kafka broker,
a webhook receiver and a Pub/Sub server (pstest) in one process.

The database comes from --database-url, DATABASE_URL or database.url in
--config. Relays run in this process; CPU and RSS are this process's.

On MySQL or MariaDB (a mysql:// URL), drain, live and binary run, in a
database of their own instead of a schema. A drain wakes the relays in process after
the backlog's commit (there is no NOTIFY) and times an application's INSERT
into the outbox every 10ms throughout: a claim must never make it wait.
Live producers write plain INSERTs, and the relays find them by polling.`

// benchOptions are relay bench's flags.
type benchOptions struct {
	cfg        relaybench.Config
	mode, sink string
	asJSON     bool
	cpuProfile string
}

func newBenchCommand(g *globalFlags) *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the relay against this database: drain a backlog, serve live traffic or ride out failures, then verify delivery",
		Long:  benchLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, g)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// run validates the flags, runs the bench and prints its result.
func (o *benchOptions) run(cmd *cobra.Command, g *globalFlags) error {
	if g.schema != "" {
		return usageError(errors.New("--schema: relay bench creates and drops a schema of its own"))
	}
	// Not g.load: bench serves MySQL as well as PostgreSQL.
	s, err := g.loadRead(false)
	if err != nil {
		return err
	}
	cfg := o.cfg
	cfg.DatabaseURL = s.dbURL
	cfg.Table = s.tables.Table
	cfg.Mode = relaybench.Mode(o.mode)
	cfg.Sink = o.sink
	flags := cmd.Flags()
	cfg.KeysSet = flags.Changed("keys")
	cfg.HotEventsSet = flags.Changed("hot-events")
	cfg.ClockOffsetSet = flags.Changed("clock-offset")
	// Defaults that depend on the mode come from relaybench.
	for name, zero := range map[string]func(){
		"events":   func() { cfg.Events = 0 },
		"keys":     func() { cfg.Keys = 0 },
		"duration": func() { cfg.Duration = 0 },
		"rate":     func() { cfg.Rate = 0 },
	} {
		if !flags.Changed(name) {
			zero()
		}
	}
	if flags.Changed("rate") && cfg.Rate == 0 {
		cfg.Rate = -1 // as fast as they can
	}
	// Relays log warnings and errors only (to stderr).
	cfg.Logger = slog.New(warnOnly{s.logger.Handler()})
	cfg.Progress = cmd.ErrOrStderr()
	if err := cfg.WithDefaults().Validate(); err != nil {
		return usageError(errors.New(s.scrub(err).Error()))
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return usageError(fmt.Errorf("--cpuprofile: %w", err))
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return runtimeError(fmt.Errorf("--cpuprofile: %w", err))
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := relaybench.Run(ctx, cfg)
	if res == nil {
		return runtimeError(s.scrub(err))
	}
	if o.asJSON {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		if werr := enc.Encode(res); werr != nil {
			return runtimeError(werr)
		}
	} else if werr := res.WriteText(cmd.OutOrStdout()); werr != nil {
		return runtimeError(werr)
	}
	if err != nil {
		return runtimeError(err)
	}
	return nil
}

// addFlags defines relay bench's flags on f.
func (o *benchOptions) addFlags(f *pflag.FlagSet) {
	cfg := &o.cfg
	f.StringVar(&o.mode, "mode", string(relaybench.ModeDrain),
		"drain (time a committed backlog), live (latency under a steady rate), outage (writes while a sink is down), isolation (latency while a sink is down), hotkey (drain beside a failing key), slow (a fast sink beside a slow one), recovery (a queued backlog's drain vs the same flowing), skew (retry spacing with the relay's clock off), binary (relay run timed from outside) or idle (the database load of relays at rest)")
	f.IntVar(&cfg.Events, "events", relaybench.DefaultEvents, "drain, outage, hotkey, recovery, skew, binary: events in the backlog (hotkey: 100000 by default, recovery: 6000 per phase, skew: 200)")
	f.IntVar(&cfg.Keys, "keys", relaybench.DefaultKeys, "distinct keys (0: every event its own key; default 1000, recovery 20, skew one per event)")
	f.IntVar(&cfg.PayloadBytes, "payload-bytes", relaybench.DefaultPayloadBytes, "size of each event's JSON payload")
	f.IntVar(&cfg.Relays, "relays", 1, "in-process relays, each with its own connection pool")
	f.IntVar(&cfg.BatchSize, "batch-size", 0, "relay.batch_size (0: the relay's default)")
	f.IntVar(&cfg.Workers, "workers", 0, "relay.workers per relay (0: the relay's default)")
	f.BoolVar(&cfg.PollOnly, "poll-only", false, "relay.poll_only: no LISTEN/NOTIFY")
	f.DurationVar(&cfg.PollInterval, "poll-interval", 0, "relay.poll_interval (0: the relay's default; skew 50ms)")
	f.DurationVar(&cfg.Lease, "lease", 0, "relay.lease (0: the relay's default)")
	f.DurationVar(&cfg.HandOffAfter, "hand-off-after", 0, "relay.hand_off_after: how long a batch waits for its sinks before handing off what they have not answered (0: the relay's default)")
	f.StringVar((*string)(&cfg.Capture), "capture", "", "database.capture: table, or wal to emit the backlog into the write-ahead log and read it from a replication slot (--mode drain, live or binary, one relay, PostgreSQL)")
	f.IntVar(&cfg.Rate, "rate", relaybench.DefaultRate, "live, isolation, slow: producers' total events/s (0: as fast as they can; default 1000, slow 200)")
	f.IntVar(&cfg.Producers, "producers", relaybench.DefaultProducers, "live, isolation, slow: producer goroutines")
	f.IntVar(&cfg.TxEvents, "tx-events", 1, "live, isolation, slow: events each producer transaction commits")
	f.DurationVar(&cfg.Duration, "duration", relaybench.DefaultDuration, "live, isolation, slow: how long producers run (default 30s, slow 20s, isolation --outage-after + --outage + 2m); idle: how long to count (default 1m)")
	f.DurationVar(&cfg.Baseline, "baseline", 0, "live: first run the producers this long with no relay and compare commit rates")
	f.DurationVar(&cfg.ReportEvery, "report-every", 0, "print events/s, latency, backlog, table size and dead tuples at this interval")
	f.DurationVar(&cfg.Outage, "outage", 0, `outage, isolation: how long sink "down" refuses events (0: 60s for outage, 5m for isolation)`)
	f.DurationVar(&cfg.OutageAfter, "outage-after", relaybench.DefaultOutageAfter, "isolation: when the outage begins, after the producers' start")
	f.DurationVar(&cfg.PauseMax, "pause-max", 0, "relay.sink_pause.max: the longest wait between probes of a sink that is down (0: 1s for outage, isolation and recovery, else the relay's default)")
	f.DurationVar(&cfg.BackoffMax, "backoff-max", 0, "relay.backoff.max: the longest wait between retries of a failed event (0: 1s for hotkey and skew, else the relay's default)")
	f.DurationVar(&cfg.AnswerAfter, "answer-after", 0, "slow, recovery, isolation: how late the in-process webhook receiver answers each request (0: 200ms for slow, 20ms for recovery; isolation: \"down\" is in process, answering at once)")
	f.IntVar(&cfg.WebhookConcurrency, "webhook-concurrency", 0, "slow, recovery, isolation: requests in flight per webhook sink (0: the sink's default, 16)")
	f.DurationVar(&cfg.ClockOffset, "clock-offset", relaybench.DefaultClockOffset, "skew: added to the relays' clock (negative: behind)")
	f.IntVar(&cfg.FailAttempts, "fail-attempts", relaybench.DefaultFailAttempts, "skew: attempts of each event the sink fails before it acknowledges it (1 to 9)")
	f.StringVar(&cfg.RelayBinary, "relay-binary", "", "binary: the relay binary to start (default this executable)")
	f.IntVar(&cfg.History, "history", 0, "drain: events drained through the relays before the backlog, the tables analysed mid-drain and the backlog not analysed (a burst into an idle relay on a table with a past)")
	f.IntVar(&cfg.HotEvents, "hot-events", relaybench.DefaultHotEvents, "hotkey: events of the hot key queued behind its failing head (0: no hot key, the run to compare with)")
	f.StringVar(&o.sink, "sink", relaybench.SinkDiscard, "discard, nats (JetStream at --nats-url), kafka (at --kafka-brokers), webhook (at --webhook-url), redis (at --redis-url), rabbitmq (at --rabbitmq-url), mqtt (at --mqtt-url), pubsub (at --pubsub-endpoint), sqs or sns (at --aws-endpoint, credentials from the AWS environment)")
	f.StringVar(&cfg.NATSURL, "nats-url", relaybench.DefaultNATSURL, "nats: JetStream server (a throwaway stream is created and deleted)")
	f.BoolVar(&cfg.NATSFileStorage, "nats-file-storage", false, "nats: file storage for the stream (default memory)")
	f.IntVar(&cfg.NATSMaxMsgs, "nats-max-msgs", relaybench.DefaultNATSMaxMsgs, "nats: the stream keeps the newest this many messages (-1: all)")
	f.StringSliceVar(&cfg.KafkaBrokers, "kafka-brokers", nil, "kafka: bootstrap brokers, host:port, comma-separated (a throwaway topic is created and deleted)")
	f.IntVar(&cfg.KafkaPartitions, "kafka-partitions", relaybench.DefaultKafkaPartitions, "kafka: partitions of the topic")
	f.StringVar(&cfg.RabbitMQURL, "rabbitmq-url", relaybench.DefaultRabbitMQURL, "rabbitmq: AMQP broker (a throwaway durable queue is declared and deleted)")
	f.StringVar(&cfg.WebhookURL, "webhook-url", "", "webhook: the receiver to POST events to (it must answer 2xx; default an endpoint in the bench's process answering 204 at once)")
	f.StringVar(&cfg.RedisURL, "redis-url", relaybench.DefaultRedisURL, "redis: the server (a throwaway stream, capped with MAXLEN ~, is appended to and deleted)")
	f.StringVar(&cfg.MQTTURL, "mqtt-url", relaybench.DefaultMQTTURL, "mqtt: the broker to publish to, QoS 1")
	f.StringVar(&cfg.PubSubEndpoint, "pubsub-endpoint", "", "pubsub: host:port of a Pub/Sub emulator (empty: Google, with the environment's credentials; a throwaway topic is created and deleted)")
	f.StringVar(&cfg.PubSubProject, "pubsub-project", relaybench.DefaultPubSubProject, "pubsub: the project of the throwaway topic")
	f.StringVar(&cfg.AWSEndpoint, "aws-endpoint", "", "sqs, sns: the endpoint (moto, LocalStack; empty: AWS) where a throwaway FIFO queue or topic is created and deleted")
	f.StringVar(&cfg.AWSRegion, "aws-region", "", "sqs, sns: the region (default $AWS_REGION, else us-east-1)")
	f.IntVar(&cfg.AWSMaxInFlight, "aws-max-in-flight", 0, "sqs, sns: the sinks' max_in_flight (default the sinks' default, 8)")
	f.BoolVar(&cfg.AWSInstant, "aws-instant", false, "sqs: instead of --aws-endpoint, an endpoint in this process that accepts every message at once (the relay's own ceiling)")
	f.DurationVar(&cfg.Timeout, "timeout", relaybench.DefaultTimeout, "give up waiting for deliveries after this long")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the bench schema instead of dropping it")
	f.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
}

// warnOnly passes on warnings and errors only: a bench's relays are quiet.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnOnly{h.Handler.WithAttrs(attrs)}
}

func (h warnOnly) WithGroup(name string) slog.Handler { return warnOnly{h.Handler.WithGroup(name)} }
