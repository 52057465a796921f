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
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/heraldhq/herald/internal/awssink"
	"github.com/heraldhq/herald/sinks"
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

// Sink publishes events to SNS topics. Create it with New. It implements
// sinks.ConcurrentPublisher and sinks.DestinationChecker: Check lists one
// page of topics, which needs the endpoint to answer and the credentials
// to be accepted; CheckDestinations checks that each destination is the
// ARN of a topic whose attributes are readable.
type Sink struct {
	*awssink.Sink
}

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily (Check or the first Publish). A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	s, err := awssink.New("sns", name, cfg.Connection, logger, func(c aws.Config) awssink.Service {
		return &topics{client: awssns.NewFromConfig(c)}
	})
	if err != nil {
		return nil, err
	}
	return &Sink{s}, nil
}

// topics is the sink's awssink.Service.
type topics struct {
	client *awssns.Client
}

func (t *topics) Describe(arn string) string { return "topic " + strconv.Quote(arn) }

func (t *topics) Ping(ctx context.Context) error {
	if _, err := t.client.ListTopics(ctx, &awssns.ListTopicsInput{}); err != nil {
		return fmt.Errorf("listing topics: %w", err)
	}
	return nil
}

func (t *topics) CheckDestination(ctx context.Context, arn string) error {
	if err := checkARN(arn); err != nil {
		return err
	}
	_, err := t.client.GetTopicAttributes(ctx, &awssns.GetTopicAttributesInput{TopicArn: aws.String(arn)})
	return err
}

// checkARN refuses a destination that is not an SNS topic ARN.
func checkARN(destination string) error {
	if !strings.HasPrefix(destination, "arn:") || strings.Count(destination, ":") != 5 {
		return sinks.Permanent(fmt.Errorf("destination %q is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:TOPIC): "+
			"give the route a destination", destination))
	}
	return nil
}

// Send sends one PublishBatch request.
func (t *topics) Send(ctx context.Context, arn string, entries []awssink.Entry) ([]error, error) {
	if err := checkARN(arn); err != nil {
		return nil, err
	}
	fifo := strings.HasSuffix(arn, ".fifo")
	in := &awssns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(entries))}
	for j, en := range entries {
		entry := types.PublishBatchRequestEntry{Id: aws.String(awssink.EntryID(j)), Message: aws.String(en.Message.Body),
			MessageAttributes: awssink.Attributes(en.Message, attribute)}
		if fifo {
			entry.MessageGroupId = aws.String(awssink.GroupID(en.Event))
			entry.MessageDeduplicationId = aws.String(en.Event.ID)
		}
		in.PublishBatchRequestEntries[j] = entry
	}
	out, err := t.client.PublishBatch(ctx, in)
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

// attribute is a message attribute's value as SNS takes it.
func attribute(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}
