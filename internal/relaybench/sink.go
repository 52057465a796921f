package relaybench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"text/template"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	kafkago "github.com/segmentio/kafka-go"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/kafka"
	"github.com/heraldhq/herald/sinks/mqtt"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sns"
	"github.com/heraldhq/herald/sinks/sqs"
	"github.com/heraldhq/herald/sinks/webhook"
)

// destinationEnv is the destination a run publishes to: a way to make one
// sink per relay, the route's destination, and what to tear down.
type destinationEnv struct {
	newSink     func(name string) (sinks.Sink, error)
	destination *template.Template // nil: the event's topic
	closers     []func(context.Context) error
}

func (d *destinationEnv) close(ctx context.Context) error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i](ctx))
	}
	return errors.Join(errs...)
}

// startDestination prepares cfg.Sink. name is unique to the run and safe in
// stream, subject and topic names.
func startDestination(ctx context.Context, cfg Config, name string, logger *slog.Logger) (*destinationEnv, error) {
	d := &destinationEnv{}
	var err error
	switch cfg.Sink {
	case SinkDiscard:
		d.newSink = func(name string) (sinks.Sink, error) { return sinks.NewDiscard(name), nil }
	case SinkNATS:
		err = d.startNATS(ctx, cfg, name, logger)
	case SinkKafka:
		err = d.startKafka(ctx, cfg, name, logger)
	case SinkWebhook:
		err = d.startWebhook(cfg, logger)
	case SinkRedis:
		err = d.startRedis(ctx, cfg, name, logger)
	case SinkRabbitMQ:
		err = d.startRabbitMQ(cfg, name, logger)
	case SinkMQTT:
		err = d.startMQTT(ctx, cfg, name, logger)
	case SinkPubSub:
		err = d.startPubSub(ctx, cfg, name, logger)
	case SinkSQS:
		err = d.startSQS(ctx, cfg, name, logger)
	case SinkSNS:
		err = d.startSNS(ctx, cfg, name, logger)
	}
	if err != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return nil, errors.Join(err, d.close(closeCtx))
	}
	return d, nil
}

func literal(dest string) *template.Template {
	return template.Must(template.New("destination").Parse(dest))
}

func (d *destinationEnv) startNATS(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	url := cfg.NATSURL
	nc, err := natsgo.Connect(url, natsgo.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("--nats-url: connecting to %s: %w", url, err)
	}
	d.closers = append(d.closers, func(context.Context) error { nc.Close(); return nil })
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("--nats-url: JetStream on %s: %w", url, err)
	}
	storage := jetstream.MemoryStorage
	if cfg.NATSFileStorage {
		storage = jetstream.FileStorage
	}
	stream := jetstream.StreamConfig{
		Name:       "HERALD_BENCH_" + name,
		Subjects:   []string{"herald_bench." + name + ".>"},
		Storage:    storage,
		Duplicates: 2 * time.Minute,
		Discard:    jetstream.DiscardOld,
	}
	if cfg.NATSMaxMsgs > 0 {
		stream.MaxMsgs = int64(cfg.NATSMaxMsgs)
	}
	if _, err := js.CreateStream(ctx, stream); err != nil {
		return fmt.Errorf("creating JetStream stream %s on %s: %w", stream.Name, url, err)
	}
	d.closers = append(d.closers, func(ctx context.Context) error {
		if err := js.DeleteStream(ctx, stream.Name); err != nil {
			return fmt.Errorf("deleting JetStream stream %s: %w", stream.Name, err)
		}
		return nil
	})
	d.destination = literal("herald_bench." + name + ".events")
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return natssink.New(sinkName, natssink.Config{URL: url}, logger)
	}
	return nil
}

// startKafka creates a throwaway topic on cfg.KafkaBrokers (deleted at the
// end) for the run's sinks to write to.
func (d *destinationEnv) startKafka(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	// A transport of its own: kafka-go's default one caches metadata and
	// keeps connections for the life of the process.
	transport := &kafkago.Transport{}
	d.closers = append(d.closers, func(context.Context) error { transport.CloseIdleConnections(); return nil })
	client := &kafkago.Client{Addr: kafkago.TCP(cfg.KafkaBrokers...), Timeout: 30 * time.Second, Transport: transport}
	topic := "herald_bench_" + name
	created, err := client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: topic, NumPartitions: cfg.KafkaPartitions, ReplicationFactor: 1},
	}})
	if err == nil {
		err = created.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("--kafka-brokers: creating topic %s on %v: %w", topic, cfg.KafkaBrokers, err)
	}
	d.closers = append(d.closers, func(ctx context.Context) error {
		deleted, err := client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = deleted.Errors[topic]
		}
		if err != nil {
			return fmt.Errorf("deleting Kafka topic %s: %w", topic, err)
		}
		return nil
	})
	d.destination = literal(topic)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return kafka.New(sinkName, kafka.Config{Brokers: cfg.KafkaBrokers}, logger)
	}
	return nil
}

// startWebhook signs with a key of its own: the receiver at cfg.WebhookURL
// need not check signatures, only answer 2xx. Without a URL it starts an
// endpoint of its own on loopback that answers every request 204 at once.
func (d *destinationEnv) startWebhook(cfg Config, logger *slog.Logger) error {
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("making a webhook secret: %w", err)
	}
	secret := sinkconfig.Secret("whsec_" + base64.StdEncoding.EncodeToString(key))
	target := cfg.WebhookURL
	if target == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("starting a webhook endpoint: %w", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			_, _ = io.Copy(io.Discard, req.Body)
			w.WriteHeader(http.StatusNoContent)
		})}
		go func() { _ = srv.Serve(ln) }()
		d.closers = append(d.closers, srv.Shutdown)
		target = "http://" + ln.Addr().String() + "/hook"
	}
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return webhook.New(sinkName, webhook.Config{URL: target, Secret: secret}, logger)
	}
	return nil
}

// rabbitMQMaxLength caps the throwaway queue, the oldest messages dropped,
// for the reason DefaultNATSMaxMsgs caps the stream: nothing consumes it,
// and the bench verifies deliveries by the sink's confirms.
const rabbitMQMaxLength = 200_000

// startRabbitMQ declares a throwaway durable queue on cfg.RabbitMQURL
// (deleted at the end); the sinks publish persistent messages to it through
// the default exchange, so every confirm follows a write to disk.
func (d *destinationEnv) startRabbitMQ(cfg Config, name string, logger *slog.Logger) error {
	conn, err := amqp.DialConfig(cfg.RabbitMQURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		// amqp091's errors name the host, never the URL's password.
		return fmt.Errorf("--rabbitmq-url: connecting: %w", err)
	}
	d.closers = append(d.closers, func(context.Context) error { return conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("--rabbitmq-url: opening a channel: %w", err)
	}
	queue := "herald_bench_" + name
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-max-length": int32(rabbitMQMaxLength)}); err != nil {
		return fmt.Errorf("declaring RabbitMQ queue %s: %w", queue, err)
	}
	d.closers = append(d.closers, func(context.Context) error {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			return fmt.Errorf("deleting RabbitMQ queue %s: %w", queue, err)
		}
		return nil
	})
	d.destination = literal(queue)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return rabbitmq.New(sinkName, rabbitmq.Config{URL: sinkconfig.Secret(cfg.RabbitMQURL)}, logger)
	}
	return nil
}

// startRedis checks the server at cfg.RedisURL answers and names a
// throwaway stream for the run's sinks, deleted at the end.
func (d *destinationEnv) startRedis(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	opts, err := goredis.ParseURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	client := goredis.NewClient(opts)
	d.closers = append(d.closers, func(context.Context) error { return client.Close() })
	sinkCfg := redis.Config{URL: cfg.RedisURL, MaxLen: DefaultRedisMaxLen}
	probe, err := redis.New("bench-probe", sinkCfg, logger)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	defer probe.Close(ctx)
	if err := probe.Check(ctx); err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	stream := "herald_bench:" + name
	d.closers = append(d.closers, func(ctx context.Context) error {
		if err := client.Del(ctx, stream).Err(); err != nil {
			return fmt.Errorf("deleting Redis stream %s: %w", stream, err)
		}
		return nil
	})
	d.destination = literal(stream)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return redis.New(sinkName, sinkCfg, logger)
	}
	return nil
}

// startMQTT checks the broker at cfg.MQTTURL answers; the run's sinks
// publish under a topic of its own, which needs no creating. No one
// subscribes: the broker acknowledges each message (PUBACK) and drops it,
// and the bench counts the acknowledgements.
func (d *destinationEnv) startMQTT(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	probe, err := mqtt.New("bench-probe", mqtt.Config{URL: cfg.MQTTURL}, logger)
	if err != nil {
		return fmt.Errorf("--mqtt-%w", err)
	}
	err = probe.Check(ctx)
	if cerr := probe.Close(ctx); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--mqtt-url: %w", err)
	}
	d.destination = literal("herald_bench/" + name + "/events")
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return mqtt.New(sinkName, mqtt.Config{URL: cfg.MQTTURL}, logger)
	}
	return nil
}

// startPubSub creates a throwaway topic in cfg.PubSubProject (deleted at
// the end) at cfg.PubSubEndpoint, or at Google with the environment's
// credentials when it is empty.
func (d *destinationEnv) startPubSub(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	var opts []option.ClientOption
	if cfg.PubSubEndpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.PubSubEndpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	client, err := gpubsub.NewClient(ctx, cfg.PubSubProject, opts...)
	if err != nil {
		return fmt.Errorf("--pubsub-endpoint: %w", err)
	}
	d.closers = append(d.closers, func(context.Context) error { return client.Close() })
	topic := "herald_bench_" + name
	fullName := "projects/" + cfg.PubSubProject + "/topics/" + topic
	createCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := client.TopicAdminClient.CreateTopic(createCtx, &pubsubpb.Topic{Name: fullName}); err != nil {
		return fmt.Errorf("--pubsub-endpoint: creating topic %s: %w", fullName, err)
	}
	d.closers = append(d.closers, func(ctx context.Context) error {
		if err := client.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: fullName}); err != nil {
			return fmt.Errorf("deleting Pub/Sub topic %s: %w", fullName, err)
		}
		return nil
	})
	d.destination = literal(topic)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return pubsub.New(sinkName, pubsub.Config{Project: cfg.PubSubProject, Endpoint: cfg.PubSubEndpoint}, logger)
	}
	return nil
}

// startSQS creates a throwaway FIFO queue at cfg.AWSEndpoint (deleted at
// the end): FIFO, because it is what keeps each key's order. With
// cfg.AWSInstant the endpoint is an instantSQS of the run's own.
func (d *destinationEnv) startSQS(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	conn := cfg.awsConfig()
	if cfg.AWSInstant {
		instant, err := startInstantSQS()
		if err != nil {
			return err
		}
		d.closers = append(d.closers, instant.close)
		// It checks no signature; the SDK wants credentials to sign with.
		conn.Endpoint, conn.AccessKeyID, conn.SecretAccessKey = instant.url, "instant", "instant"
	}
	awsCfg, err := conn.Load(ctx)
	if err != nil {
		return fmt.Errorf("--aws-endpoint: %w", err)
	}
	client := awssqs.NewFromConfig(awsCfg)
	queue := "herald-bench-" + name + ".fifo"
	out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(queue),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		return fmt.Errorf("--aws-endpoint: creating SQS queue %s at %s: %w", queue, conn.Shown(), err)
	}
	url := aws.ToString(out.QueueUrl)
	d.closers = append(d.closers, func(ctx context.Context) error {
		if _, err := client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			return fmt.Errorf("deleting SQS queue %s: %w", queue, err)
		}
		return nil
	})
	d.destination = literal(url)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return sqs.New(sinkName, sqs.Config{Connection: conn}, logger)
	}
	return nil
}

// startSNS creates a throwaway FIFO topic at cfg.AWSEndpoint (deleted at
// the end), with no subscription: the run measures publishing.
func (d *destinationEnv) startSNS(ctx context.Context, cfg Config, name string, logger *slog.Logger) error {
	conn := sns.Connection(cfg.awsConfig())
	awsCfg, err := conn.Load(ctx)
	if err != nil {
		return fmt.Errorf("--aws-endpoint: %w", err)
	}
	client := awssns.NewFromConfig(awsCfg)
	topic := "herald-bench-" + name + ".fifo"
	out, err := client.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(topic),
		Attributes: map[string]string{"FifoTopic": "true"}})
	if err != nil {
		return fmt.Errorf("--aws-endpoint: creating SNS topic %s at %s: %w", topic, conn.Shown(), err)
	}
	arn := aws.ToString(out.TopicArn)
	d.closers = append(d.closers, func(ctx context.Context) error {
		if _, err := client.DeleteTopic(ctx, &awssns.DeleteTopicInput{TopicArn: aws.String(arn)}); err != nil {
			return fmt.Errorf("deleting SNS topic %s: %w", topic, err)
		}
		return nil
	})
	d.destination = literal(arn)
	d.newSink = func(sinkName string) (sinks.Sink, error) {
		return sns.New(sinkName, sns.Config{Connection: conn}, logger)
	}
	return nil
}
