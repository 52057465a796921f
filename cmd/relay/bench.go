package main

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

	"github.com/heraldhq/herald/internal/relaybench"
)

func newBenchCommand(g *globalFlags) *cobra.Command {
	var (
		cfg        relaybench.Config
		mode, sink string
		asJSON     bool
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the relay against this database: drain a backlog, serve live traffic or ride out failures, then verify delivery",
		Long: `Measure the relay against this database, in a schema of its own (created,
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
--report-every) its p50 and p99 next to "down"'s queue depth.

--mode hotkey queues --hot-events (default 10,000) events of one key behind
a head the sink keeps failing (retryable; retries at most --backoff-max
apart, default 1s), then times the drain of --events (default 100,000)
events of the other keys and reports the claims' durations. --hot-events 0
is the run to compare with.

Every run then verifies that each committed event was acknowledged at least
once by every sink and that each key's events arrived at each sink in seq
order, and exits 1 when not.

--sink names where events go: discard (in-process, the default), nats (a
throwaway stream on --nats-url), kafka (a throwaway topic on
--kafka-brokers), webhook (POSTs to --webhook-url, which must answer
2xx), rabbitmq (a throwaway durable queue on --rabbitmq-url), mqtt (QoS 1
to --mqtt-url, under a topic of the run's own) or pubsub (a throwaway topic
at --pubsub-endpoint). The bench starts no broker or receiver of its own;
for development, "go run ./internal/cmd/benchpeer" starts a Kafka broker,
a webhook receiver and a Pub/Sub server (pstest) in one process.

The database comes from --database-url, DATABASE_URL or database.url in
--config. Relays run in this process; CPU and RSS are this process's.

On MySQL or MariaDB (a mysql:// URL), drain and live run, in a database of
their own instead of a schema. A drain wakes the relays in process after
the backlog's commit (there is no NOTIFY) and times an application's INSERT
into the outbox every 10ms throughout: a claim must never make it wait.
Live producers write plain INSERTs, and the relays find them by polling.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.schema != "" {
				return usageError(errors.New("--schema: relay bench creates and drops a schema of its own"))
			}
			// Not g.load: bench serves MySQL as well as PostgreSQL.
			s, err := g.loadRead(false)
			if err != nil {
				return err
			}
			cfg.DatabaseURL = s.dbURL
			cfg.Table = s.tables.Table
			cfg.Mode = relaybench.Mode(mode)
			cfg.Sink = sink
			cfg.KeysSet = cmd.Flags().Changed("keys")
			cfg.HotEventsSet = cmd.Flags().Changed("hot-events")
			// Defaults that depend on the mode come from relaybench.
			if !cmd.Flags().Changed("events") {
				cfg.Events = 0
			}
			if !cmd.Flags().Changed("duration") {
				cfg.Duration = 0
			}
			if cfg.Rate == 0 {
				cfg.Rate = -1 // as fast as they can
			}
			// Relays log warnings and errors only (to stderr).
			cfg.Logger = slog.New(warnOnly{s.logger.Handler()})
			cfg.Progress = cmd.ErrOrStderr()
			if err := cfg.WithDefaults().Validate(); err != nil {
				return usageError(errors.New(s.scrub(err).Error()))
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
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
			if asJSON {
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
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", string(relaybench.ModeDrain),
		"drain (time a committed backlog), live (latency under a steady rate), outage (writes while a sink is down), isolation (latency while a sink is down) or hotkey (drain beside a failing key)")
	f.IntVar(&cfg.Events, "events", relaybench.DefaultEvents, "drain, outage, hotkey: events in the backlog (hotkey: 100000 by default)")
	f.IntVar(&cfg.Keys, "keys", relaybench.DefaultKeys, "distinct keys (0: every event its own key)")
	f.IntVar(&cfg.PayloadBytes, "payload-bytes", relaybench.DefaultPayloadBytes, "size of each event's JSON payload")
	f.IntVar(&cfg.Relays, "relays", 1, "in-process relays, each with its own connection pool")
	f.IntVar(&cfg.BatchSize, "batch-size", 0, "relay.batch_size (0: the relay's default)")
	f.IntVar(&cfg.Workers, "workers", 0, "relay.workers per relay (0: the relay's default)")
	f.BoolVar(&cfg.PollOnly, "poll-only", false, "relay.poll_only: no LISTEN/NOTIFY")
	f.DurationVar(&cfg.PollInterval, "poll-interval", 0, "relay.poll_interval (0: the relay's default)")
	f.DurationVar(&cfg.Lease, "lease", 0, "relay.lease (0: the relay's default)")
	f.IntVar(&cfg.Rate, "rate", relaybench.DefaultRate, "live, isolation: producers' total events/s (0: as fast as they can)")
	f.IntVar(&cfg.Producers, "producers", relaybench.DefaultProducers, "live, isolation: producer goroutines")
	f.IntVar(&cfg.TxEvents, "tx-events", 1, "live, isolation: events each producer transaction commits")
	f.DurationVar(&cfg.Duration, "duration", relaybench.DefaultDuration, "live, isolation: how long producers run (isolation: --outage-after + --outage + 2m by default)")
	f.DurationVar(&cfg.Baseline, "baseline", 0, "live: first run the producers this long with no relay and compare commit rates")
	f.DurationVar(&cfg.ReportEvery, "report-every", 0, "print events/s, latency, backlog, table size and dead tuples at this interval")
	f.DurationVar(&cfg.Outage, "outage", 0, `outage, isolation: how long sink "down" refuses events (0: 60s for outage, 5m for isolation)`)
	f.DurationVar(&cfg.OutageAfter, "outage-after", relaybench.DefaultOutageAfter, "isolation: when the outage begins, after the producers' start")
	f.DurationVar(&cfg.PauseMax, "pause-max", 0, "relay.sink_pause.max: the longest wait between probes of a sink that is down (0: 1s for outage and isolation, else the relay's default)")
	f.DurationVar(&cfg.BackoffMax, "backoff-max", 0, "relay.backoff.max: the longest wait between retries of a failed event (0: 1s for hotkey, else the relay's default)")
	f.IntVar(&cfg.HotEvents, "hot-events", relaybench.DefaultHotEvents, "hotkey: events of the hot key queued behind its failing head (0: no hot key, the run to compare with)")
	f.StringVar(&sink, "sink", relaybench.SinkDiscard, "discard, nats (JetStream at --nats-url), kafka (at --kafka-brokers), webhook (at --webhook-url), redis (at --redis-url), rabbitmq (at --rabbitmq-url), mqtt (at --mqtt-url), pubsub (at --pubsub-endpoint), sqs or sns (at --aws-endpoint, credentials from the AWS environment)")
	f.StringVar(&cfg.NATSURL, "nats-url", relaybench.DefaultNATSURL, "nats: JetStream server (a throwaway stream is created and deleted)")
	f.BoolVar(&cfg.NATSFileStorage, "nats-file-storage", false, "nats: file storage for the stream (default memory)")
	f.IntVar(&cfg.NATSMaxMsgs, "nats-max-msgs", relaybench.DefaultNATSMaxMsgs, "nats: the stream keeps the newest this many messages (-1: all)")
	f.StringSliceVar(&cfg.KafkaBrokers, "kafka-brokers", nil, "kafka: bootstrap brokers, host:port, comma-separated (a throwaway topic is created and deleted)")
	f.IntVar(&cfg.KafkaPartitions, "kafka-partitions", relaybench.DefaultKafkaPartitions, "kafka: partitions of the topic")
	f.StringVar(&cfg.RabbitMQURL, "rabbitmq-url", relaybench.DefaultRabbitMQURL, "rabbitmq: AMQP broker (a throwaway durable queue is declared and deleted)")
	f.StringVar(&cfg.WebhookURL, "webhook-url", "", "webhook: the receiver to POST events to (it must answer 2xx)")
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
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	return cmd
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
