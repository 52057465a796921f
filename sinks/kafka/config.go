package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	franzsasl "github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultClientID        = "herald"
	DefaultBatchSize       = 500
	DefaultBatchTimeout    = time.Microsecond
	DefaultWriteTimeout    = 10 * time.Second
	DefaultMaxAttempts     = 3
	DefaultMaxMessageBytes = 1 << 20
)

// Format is how an event becomes a record.
type Format string

const (
	// FormatHerald is the record described in the package documentation:
	// the payload as the value, herald-id, herald-topic, content-type and
	// the event's headers. The default.
	FormatHerald Format = "herald"
	// FormatCloudEvents is a CloudEvent per the CloudEvents Kafka protocol
	// binding, in the content mode cloudevents.mode selects.
	FormatCloudEvents Format = "cloudevents"
)

// Config is the configuration of a Kafka sink: everything under the sink's
// entry in the YAML sinks list except name and type.
type Config struct {
	// Brokers are the bootstrap brokers, as host:port. Required.
	Brokers []string `yaml:"brokers"`
	// ClientID is sent to the brokers with every request. Defaults to "herald".
	ClientID string `yaml:"client_id"`
	// TLS configures TLS to the brokers. Off unless one of its fields asks for it.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// SASL configures authentication. Off when sasl.mechanism is empty.
	SASL SASLConfig `yaml:"sasl"`
	// Compression is the codec of produced batches: none, gzip, snappy, lz4
	// or zstd. Defaults to none.
	Compression string `yaml:"compression"`
	// RequiredAcks is how many replicas must acknowledge a write before an
	// event counts as delivered: all (the in-sync replicas), one (the leader)
	// or none (fire and forget: an event counts as delivered once sent).
	// Defaults to all.
	RequiredAcks string `yaml:"required_acks"`
	// Balancer maps a key to a partition: murmur2 (the Java client's
	// default partitioner), crc32 (librdkafka's default, consistent_random)
	// or fnv1a (Sarama's default). Events without a key go to a random
	// partition. Defaults to murmur2.
	Balancer string `yaml:"balancer"`
	// BatchSize is the most events sent in one round of produce requests
	// (one request per partition). Defaults to 500, the relay's batch size.
	BatchSize int `yaml:"batch_size"`
	// BatchTimeout is how long the underlying kafka-go writer waits for more
	// messages before sending a partition's batch. Publish hands a whole round
	// to the writer at once (under the writer's partition lock, so the timer
	// cannot split it; checked against kafka-go v0.4.51): any wait only adds
	// latency to every call, which is why the default is far below kafka-go's
	// 1s. Defaults to 1µs, in effect "send at once".
	BatchTimeout time.Duration `yaml:"batch_timeout"`
	// WriteTimeout bounds each produce request. Defaults to 10s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// MaxAttempts is how often a partition's batch is sent before its events
	// are reported failed, when the broker answers with a transient error
	// (leader moved, network error). Defaults to 3.
	MaxAttempts int `yaml:"max_attempts"`
	// MaxMessageBytes is the largest message accepted, counting key, value,
	// headers and framing; it also caps the bytes of one produce request per
	// round. Keep it at or below the broker's message.max.bytes and the
	// topics' max.message.bytes. Larger events fail permanently without
	// being sent. Defaults to 1048576 (1 MiB, the broker default).
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// AllowAutoTopicCreation lets the broker create a topic on first use (if
	// the broker allows it too). Defaults to false: publishing to a topic
	// that does not exist fails, and is retried.
	AllowAutoTopicCreation bool `yaml:"allow_auto_topic_creation"`
	// AllowTopicPrefixes lets events be produced to internal topics (names
	// starting with "__", such as __consumer_offsets), each prefix named
	// explicitly ("__audit"); every entry must start with "__". Without it
	// such a destination fails permanently: an event's destination comes
	// from event data, and Kafka's own topics are not a place for events.
	// Defaults to none.
	AllowTopicPrefixes []string `yaml:"allow_topic_prefixes"`
	// Format is herald or cloudevents. Defaults to herald.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// Kafka's rules for topic names (kafka.common.internals.Topic).
const (
	// maxTopicLength is the longest legal topic name.
	maxTopicLength = 249
	// internalTopicPrefix starts the topics Kafka and its clients keep for
	// themselves (__consumer_offsets, __transaction_state).
	internalTopicPrefix = "__"
)

// checkTopicName reports why name is not a legal Kafka topic name: empty,
// "." or "..", longer than 249 bytes, or holding a byte other than
// a-z A-Z 0-9 . _ -.
func checkTopicName(name string) error {
	switch {
	case name == "":
		return errors.New("the topic name is empty")
	case name == "." || name == "..":
		return fmt.Errorf("%q is not a legal Kafka topic name", name)
	case len(name) > maxTopicLength:
		return fmt.Errorf("the topic name is %d bytes long; Kafka allows at most %d", len(name), maxTopicLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			continue
		}
		return fmt.Errorf("the topic name holds %q at byte %d; Kafka topic names hold only a-z A-Z 0-9 . _ -", name[i:i+1], i)
	}
	return nil
}

// checkTopic refuses, as a permanent error, a destination Kafka would
// refuse or that names an internal topic no prefix in allowed covers.
func checkTopic(topic string, allowed []string) error {
	if err := checkTopicName(topic); err != nil {
		return sinks.Permanent(err)
	}
	if !strings.HasPrefix(topic, internalTopicPrefix) {
		return nil
	}
	for _, p := range allowed {
		if strings.HasPrefix(topic, p) {
			return nil
		}
	}
	return sinks.Permanent(fmt.Errorf("topics starting with %s are Kafka's internal topics: not produced to "+
		"(name a prefix of it in allow_topic_prefixes to produce there)", internalTopicPrefix))
}

// SASLConfig is the sasl section of Config.
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Empty turns SASL off.
	Mechanism string `yaml:"mechanism"`
	// Username is the SASL user. Required with a mechanism.
	Username string `yaml:"username"`
	// Password is the SASL password. Required with a mechanism.
	Password sinkconfig.Secret `yaml:"password"`
}

var (
	compressions = map[string]kafkago.Compression{
		"": 0, "none": 0,
		"gzip":   kafkago.Gzip,
		"snappy": kafkago.Snappy,
		"lz4":    kafkago.Lz4,
		"zstd":   kafkago.Zstd,
	}
	acks = map[string]kafkago.RequiredAcks{
		"": kafkago.RequireAll, "all": kafkago.RequireAll,
		"one":  kafkago.RequireOne,
		"none": kafkago.RequireNone,
	}
	balancers = map[string]func() kafkago.Balancer{
		"":        func() kafkago.Balancer { return kafkago.Murmur2Balancer{} },
		"murmur2": func() kafkago.Balancer { return kafkago.Murmur2Balancer{} },
		"crc32":   func() kafkago.Balancer { return kafkago.CRC32Balancer{} },
		"fnv1a":   func() kafkago.Balancer { return &kafkago.Hash{} },
	}
)

// Validate checks the configuration; errors name the offending key.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: must list at least one broker"))
	}
	for i, b := range c.Brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			errs = append(errs, fmt.Errorf("brokers[%d]: %q is not host:port", i, b))
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			errs = append(errs, fmt.Errorf("brokers[%d]: %q has no valid port", i, b))
		}
	}
	if _, ok := compressions[c.Compression]; !ok {
		errs = append(errs, fmt.Errorf("compression: %q is not one of none, gzip, snappy, lz4, zstd", c.Compression))
	}
	if _, ok := acks[c.RequiredAcks]; !ok {
		errs = append(errs, fmt.Errorf("required_acks: %q is not one of all, one, none", c.RequiredAcks))
	}
	if _, ok := balancers[c.Balancer]; !ok {
		errs = append(errs, fmt.Errorf("balancer: %q is not one of murmur2, crc32, fnv1a", c.Balancer))
	}
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("batch_size: %d is negative", c.BatchSize))
	}
	if c.BatchTimeout < 0 {
		errs = append(errs, fmt.Errorf("batch_timeout: %s is negative", c.BatchTimeout))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("write_timeout: %s is negative", c.WriteTimeout))
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max_attempts: %d is negative", c.MaxAttempts))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max_message_bytes: %d is negative", c.MaxMessageBytes))
	}
	for i, p := range c.AllowTopicPrefixes {
		if !strings.HasPrefix(p, internalTopicPrefix) {
			errs = append(errs, fmt.Errorf("allow_topic_prefixes[%d]: %q does not start with %s; only internal topics need allowing", i, p, internalTopicPrefix))
		} else if err := checkTopicName(p); err != nil {
			errs = append(errs, fmt.Errorf("allow_topic_prefixes[%d]: %w", i, err))
		}
	}
	if err := c.CloudEvents.ValidateFormat(string(c.Format)); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.TLS.Build("tls"); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.SASL.mechanism(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.ClientID = cmp.Or(c.ClientID, DefaultClientID)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultBatchTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	return c
}

// mechanism returns the kafka-go SASL mechanism, nil when SASL is off.
// Errors name the key and never include the password.
func (c SASLConfig) mechanism() (sasl.Mechanism, error) {
	if c.Mechanism == "" {
		if c.Username != "" || c.Password != "" {
			return nil, errors.New("sasl.mechanism: required when sasl.username or sasl.password is set")
		}
		return nil, nil
	}
	var errs []error
	if c.Username == "" {
		errs = append(errs, errors.New("sasl.username: required with sasl.mechanism "+c.Mechanism))
	}
	if c.Password == "" {
		errs = append(errs, errors.New("sasl.password: required with sasl.mechanism "+c.Mechanism))
	}
	auth := scram.Auth{User: c.Username, Pass: c.Password.Reveal()}
	var m sasl.Mechanism
	switch c.Mechanism {
	case "PLAIN":
		m = plain.Mechanism{Username: c.Username, Password: c.Password.Reveal()}
	case "SCRAM-SHA-256":
		m = scramMechanism{auth.AsSha256Mechanism()}
	case "SCRAM-SHA-512":
		m = scramMechanism{auth.AsSha512Mechanism()}
	default:
		errs = append(errs, fmt.Errorf("sasl.mechanism: %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", c.Mechanism))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// scramMechanism adapts franz-go's SCRAM implementation (RFC 5802, standard
// library only) to kafka-go's sasl.Mechanism, so SCRAM needs no module
// beyond those Herald already requires.
type scramMechanism struct{ m franzsasl.Mechanism }

func (s scramMechanism) Name() string { return s.m.Name() }

func (s scramMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sess, first, err := s.m.Authenticate(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	return scramSession{sess}, first, nil
}

type scramSession struct{ s franzsasl.Session }

func (s scramSession) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	return s.s.Challenge(challenge)
}
