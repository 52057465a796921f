// Package sqs is Herald's Amazon SQS sink: it sends each event to the queue
// named by its Destination (the event's topic unless a route's destination
// template says otherwise) with SendMessageBatch.
//
// # Destination
//
// A destination is a queue URL (https://sqs.us-east-1.amazonaws.com/
// 123456789012/orders) or a queue name (orders), which the sink resolves
// once with GetQueueUrl and caches for its lifetime. A queue name allows
// letters, digits, - and _ (and a .fifo suffix): route topics with dots to
// a queue with a destination template.
//
// # Messages
//
// The body is the payload when it is text SQS accepts, else its base64
// (attribute herald.encoding = base64). The attributes are herald.id (the
// event id, the consumers' dedupe key), herald.topic, herald.content_type,
// herald.key when the event has a key and herald.headers, the headers as
// one JSON object, when it has any: at most six of SQS's ten attributes
// whatever the number of headers.
//
// FIFO queues (name ending in .fifo) get MessageGroupId = the event key, so
// SQS keeps each key's order, and MessageDeduplicationId = the event id, so
// SQS drops a resent copy within its five-minute window. An event without
// a key gets its own id as group: keyless events have no order in Herald,
// and SQS may then deliver them in any order and in parallel. Standard
// queues get neither (SQS refuses them there) and do not keep order.
//
// # Delivery and order
//
// Publish sends requests of at most ten messages and 256 KiB, up to
// max_in_flight at once; a request waits for the earlier ones holding
// events of its keys, so each key's events are sent in order. Results are
// per event, from the per-entry results of each request. A failed event
// makes the later events of its key in later requests not sent
// (sinks.ErrSkipped); those in the same request were sent and are
// reported as SQS answered (the relay holds them back behind the failed
// one and sends them again: consumers drop the copies by herald.id).
//
// # Errors
//
//   - connection refused, DNS, TLS, credentials refused (InvalidClientTokenId,
//     SignatureDoesNotMatch, AccessDenied…), no such queue
//     (QueueDoesNotExist): sinks.Unavailable, naming the queue.
//   - an entry refused as the sender's fault (invalid contents, too large),
//     a message over 256 KiB (not sent), an empty destination: permanent.
//   - throttling, the service's faults, a lost connection, no answer in
//     time: retryable (the message may have been sent; consumers dedupe by
//     herald.id, FIFO queues by MessageDeduplicationId).
package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/awssink"
)

// Connection is the AWS connection part of Config: region, endpoint,
// credentials, TLS and timeout. It is the same type for the sqs and sns
// sinks.
type Connection = awssink.Config

// Config is an SQS sink's entry in the YAML `sinks:` list (without `name`
// and `type`): the AWS connection settings.
type Config struct {
	Connection `yaml:",inline"`
}

// Sink sends events to SQS queues. Create it with New.
type Sink struct {
	name   string
	cfg    Config
	client *awssqs.Client
	logger *slog.Logger
	urls   sync.Map // queue name → URL

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
	return &Sink{name: name, cfg: cfg, client: awssqs.NewFromConfig(awsCfg), logger: logger}, nil
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

// Check implements sinks.Checker: it lists at most one queue, which needs
// the endpoint to answer and the credentials to be accepted.
func (s *Sink) Check(ctx context.Context) error {
	if s.isClosed() {
		return sinks.Unavailable(awssink.ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.client.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		return awssink.CheckError(fmt.Errorf("sink %s: listing queues at %s: %w", s.name, s.cfg.Shown(), err))
	}
	return nil
}

// CheckDestinations implements sinks.DestinationChecker: each queue must
// exist and its attributes be readable.
func (s *Sink) CheckDestinations(ctx context.Context, queues ...string) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, q := range queues {
		url, err := s.queueURL(ctx, q)
		if err == nil {
			_, err = s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
				QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
		}
		if err != nil {
			errs = append(errs, awssink.CheckError(fmt.Errorf("sink %s: queue %q: %w", s.name, q, err)))
		}
	}
	return errors.Join(errs...)
}

// queueURL returns the URL of queue, a URL already or a name resolved once.
func (s *Sink) queueURL(ctx context.Context, queue string) (string, error) {
	if strings.HasPrefix(queue, "https://") || strings.HasPrefix(queue, "http://") {
		return queue, nil
	}
	if url, ok := s.urls.Load(queue); ok {
		return url.(string), nil
	}
	out, err := s.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		return "", fmt.Errorf("resolving the queue's URL: %w", err)
	}
	url := aws.ToString(out.QueueUrl)
	s.urls.Store(queue, url)
	return url, nil
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
			s.logger.WarnContext(ctx, "sqs sink: unavailable", "sink", s.name, "endpoint", s.cfg.Shown(), "error", err)
			break
		}
	}
	return errs
}

// send is awssink.SendFunc for one SendMessageBatch request.
func (s *Sink) send(ctx context.Context, queue string, entries []awssink.Entry) ([]error, error) {
	url, err := s.queueURL(ctx, queue)
	if err != nil {
		return nil, fmt.Errorf("queue %q: %w", queue, err)
	}
	fifo := strings.HasSuffix(queue, ".fifo")
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: make([]types.SendMessageBatchRequestEntry, len(entries))}
	for j, en := range entries {
		attrs := make(map[string]types.MessageAttributeValue, len(en.Message.Attributes))
		for k, v := range en.Message.Attributes {
			attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
		entry := types.SendMessageBatchRequestEntry{Id: aws.String(awssink.EntryID(j)), MessageBody: aws.String(en.Message.Body), MessageAttributes: attrs}
		if fifo {
			entry.MessageGroupId = aws.String(awssink.GroupID(en.Event))
			entry.MessageDeduplicationId = aws.String(en.Event.ID)
		}
		in.Entries[j] = entry
	}
	out, err := s.client.SendMessageBatch(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("queue %q: %w", queue, err)
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
			results[j] = fmt.Errorf("queue %q: %w", queue, err)
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
