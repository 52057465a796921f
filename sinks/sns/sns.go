// Package sns is Herald's Amazon SNS sink: it publishes each event to the
// topic whose ARN is its Destination with PublishBatch.
//
// # Destination
//
// A destination is a topic ARN (arn:aws:sns:us-east-1:123456789012:orders).
// SNS has no lookup of a topic by name short of listing every topic, so the
// sink does not default to the event's topic: a route gives the ARN, fixed
// or as a template (arn:aws:sns:us-east-1:123456789012:{{.Topic}} with
// topics named like SNS topics). An event whose destination is not an ARN
// fails permanently, and routes with a fixed ARN are checked at start
// (sinks.DestinationChecker), so /readyz names a wrong one.
//
// # Messages
//
// As the sqs sink's: the body is the payload when it is text, else its
// base64 (attribute herald.encoding = base64); attributes herald.id,
// herald.topic, herald.content_type, herald.key and herald.headers (one
// JSON object). FIFO topics (ARN ending in .fifo) get MessageGroupId = the
// event key (the event id for a keyless event, which then has no order)
// and MessageDeduplicationId = the event id.
//
// # Delivery and order
//
// Publish sends requests of at most ten messages and 256 KiB, up to
// max_in_flight at once; a request waits for the earlier ones holding
// events of its keys, so each key's events are sent in order. Results are
// per event, from the per-entry results of each request. A failed event
// makes the later events of its key in later requests not sent
// (sinks.ErrSkipped); those in the same request were sent and are
// reported as SNS answered (the relay holds them back behind the failed
// one and sends them again: consumers drop the copies by herald.id).
//
// # Errors
//
//   - connection refused, DNS, TLS, credentials refused (InvalidClientTokenId,
//     SignatureDoesNotMatch, AuthorizationError…), no such topic
//     (NotFound): sinks.Unavailable, naming the topic.
//   - an entry refused as the sender's fault (invalid parameter, too
//     large), a message over 256 KiB (not sent), a destination that is not
//     an ARN: permanent.
//   - throttling, the service's faults, a lost connection, no answer in
//     time: retryable (the message may have been published; consumers
//     dedupe by herald.id).
package sns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/awssink"
)

// Connection is the AWS connection part of Config: region, endpoint,
// credentials, TLS and timeout. It is the same type for the sqs and sns
// sinks.
type Connection = awssink.Config

// Config is an SNS sink's entry in the YAML `sinks:` list (without `name`
// and `type`): the AWS connection settings.
type Config struct {
	Connection `yaml:",inline"`
}

// Sink publishes events to SNS topics. Create it with New.
type Sink struct {
	name   string
	cfg    Config
	client *awssns.Client
	logger *slog.Logger

	mu     sync.Mutex // guards closed
	closed bool
}

var (
	_ sinks.DestinationChecker  = (*Sink)(nil)
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily (Check or the first Publish). A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Connection = cfg.WithDefaults()
	if logger == nil {
		logger = slog.Default()
	}
	awsCfg, err := cfg.Load(context.Background())
	if err != nil {
		return nil, fmt.Errorf("sink %s: %w", name, err)
	}
	return &Sink{name: name, cfg: cfg, client: awssns.NewFromConfig(awsCfg), logger: logger}, nil
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: the client
// runs each request on a connection of its own.
func (s *Sink) PublishesConcurrently() bool { return true }

func (s *Sink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Check implements sinks.Checker: it lists one page of topics, which needs
// the endpoint to answer and the credentials to be accepted.
func (s *Sink) Check(ctx context.Context) error {
	if s.isClosed() {
		return sinks.Unavailable(awssink.ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.client.ListTopics(ctx, &awssns.ListTopicsInput{}); err != nil {
		return awssink.CheckError(fmt.Errorf("sink %s: listing topics at %s: %w", s.name, s.cfg.Shown(), err))
	}
	return nil
}

// CheckDestinations implements sinks.DestinationChecker: each destination
// must be the ARN of a topic whose attributes are readable.
func (s *Sink) CheckDestinations(ctx context.Context, topics ...string) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, arn := range topics {
		if err := checkARN(arn); err != nil {
			errs = append(errs, fmt.Errorf("sink %s: %w", s.name, err))
			continue
		}
		if _, err := s.client.GetTopicAttributes(ctx, &awssns.GetTopicAttributesInput{TopicArn: aws.String(arn)}); err != nil {
			errs = append(errs, awssink.CheckError(fmt.Errorf("sink %s: topic %q: %w", s.name, arn, err)))
		}
	}
	return errors.Join(errs...)
}

// checkARN refuses a destination that is not an SNS topic ARN.
func checkARN(destination string) error {
	if !strings.HasPrefix(destination, "arn:") || strings.Count(destination, ":") != 5 {
		return sinks.Permanent(fmt.Errorf("destination %q is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:TOPIC): "+
			"give the route a destination", destination))
	}
	return nil
}

// Publish sends events in batches of ten and returns one result per event;
// see the package documentation for messages, order and error classes.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	if s.isClosed() {
		return sinks.Fill(len(events), sinks.Unavailable(awssink.ErrClosed))
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	errs := awssink.Publish(ctx, events, s.send, s.cfg.MaxInFlight)
	for _, err := range errs {
		if sinks.IsUnavailable(err) {
			s.logger.WarnContext(ctx, "sns sink: unavailable", "sink", s.name, "endpoint", s.cfg.Shown(), "error", err)
			break
		}
	}
	return errs
}

// send is awssink.SendFunc for one PublishBatch request.
func (s *Sink) send(ctx context.Context, arn string, entries []awssink.Entry) ([]error, error) {
	if err := checkARN(arn); err != nil {
		return nil, err
	}
	fifo := strings.HasSuffix(arn, ".fifo")
	in := &awssns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(entries))}
	for j, en := range entries {
		attrs := make(map[string]types.MessageAttributeValue, len(en.Message.Attributes))
		for k, v := range en.Message.Attributes {
			attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		entry := types.PublishBatchRequestEntry{Id: aws.String(awssink.EntryID(j)), Message: aws.String(en.Message.Body), MessageAttributes: attrs}
		if fifo {
			entry.MessageGroupId = aws.String(awssink.GroupID(en.Event))
			entry.MessageDeduplicationId = aws.String(en.Event.ID)
		}
		in.PublishBatchRequestEntries[j] = entry
	}
	out, err := s.client.PublishBatch(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("topic %q: %w", arn, err)
	}
	accepted := make([]string, len(out.Successful))
	for i, ok := range out.Successful {
		accepted[i] = aws.ToString(ok.Id)
	}
	failed := make([]awssink.Failure, len(out.Failed))
	for i, f := range out.Failed {
		failed[i] = awssink.Failure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	results := awssink.Results(len(entries), accepted, failed)
	for j, err := range results {
		if err != nil {
			results[j] = fmt.Errorf("topic %q: %w", arn, err)
		}
	}
	return results, nil
}

// Close marks the sink closed; nothing is buffered between calls. Publish
// fails with Unavailable afterwards. Close is idempotent.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
