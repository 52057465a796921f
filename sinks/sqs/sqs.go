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
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/heraldhq/herald/internal/awssink"
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

// Sink sends events to SQS queues. Create it with New. It implements
// sinks.ConcurrentPublisher and sinks.DestinationChecker: Check lists one
// queue, which needs the endpoint to answer and the credentials to be
// accepted; CheckDestinations checks that each queue exists and that its
// attributes are readable.
type Sink struct {
	*awssink.Sink
}

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily (Check or the first Publish). A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	s, err := awssink.New("sqs", name, cfg.Connection, logger, func(c aws.Config) awssink.Service {
		return &queues{client: awssqs.NewFromConfig(c)}
	})
	if err != nil {
		return nil, err
	}
	return &Sink{s}, nil
}

// queues is the sink's awssink.Service.
type queues struct {
	client *awssqs.Client
	urls   sync.Map // queue name → URL
}

func (q *queues) Describe(queue string) string { return "queue " + strconv.Quote(queue) }

func (q *queues) Ping(ctx context.Context) error {
	if _, err := q.client.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		return fmt.Errorf("listing queues: %w", err)
	}
	return nil
}

func (q *queues) CheckDestination(ctx context.Context, queue string) error {
	url, err := q.url(ctx, queue)
	if err != nil {
		return err
	}
	_, err = q.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	return err
}

// url returns the URL of queue, a URL already or a name resolved once.
func (q *queues) url(ctx context.Context, queue string) (string, error) {
	if strings.HasPrefix(queue, "https://") || strings.HasPrefix(queue, "http://") {
		return queue, nil
	}
	if url, ok := q.urls.Load(queue); ok {
		return url.(string), nil
	}
	out, err := q.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		return "", fmt.Errorf("resolving the queue's URL: %w", err)
	}
	url := aws.ToString(out.QueueUrl)
	q.urls.Store(queue, url)
	return url, nil
}

// Send sends one SendMessageBatch request.
func (q *queues) Send(ctx context.Context, queue string, entries []awssink.Entry) ([]error, error) {
	url, err := q.url(ctx, queue)
	if err != nil {
		return nil, err
	}
	fifo := strings.HasSuffix(queue, ".fifo")
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: make([]types.SendMessageBatchRequestEntry, len(entries))}
	for j, en := range entries {
		entry := types.SendMessageBatchRequestEntry{Id: aws.String(awssink.EntryID(j)), MessageBody: aws.String(en.Message.Body),
			MessageAttributes: awssink.Attributes(en.Message, attribute)}
		if fifo {
			entry.MessageGroupId = aws.String(awssink.GroupID(en.Event))
			entry.MessageDeduplicationId = aws.String(en.Event.ID)
		}
		in.Entries[j] = entry
	}
	out, err := q.client.SendMessageBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	answer := awssink.Answer{Accepted: make([]string, len(out.Successful)), Failed: make([]awssink.Failure, len(out.Failed))}
	for i, ok := range out.Successful {
		answer.Accepted[i] = aws.ToString(ok.Id)
	}
	for i, f := range out.Failed {
		answer.Failed[i] = awssink.Failure{ID: aws.ToString(f.Id), Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	return answer.Results(len(entries)), nil
}

// attribute is a message attribute's value as SQS takes it.
func attribute(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}
