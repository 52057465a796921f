package awstest

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/awssink"
)

// Message is one message as a queue received it.
type Message struct {
	Body            string
	Attributes      map[string]string // the message attributes
	GroupID         string            // MessageGroupId (FIFO queues)
	DeduplicationID string            // MessageDeduplicationId (FIFO queues)
}

// Payload decodes the message's payload (base64 bodies).
func (m Message) Payload(t testing.TB) []byte {
	t.Helper()
	b, err := awssink.Decode(m.Body, m.Attributes)
	if err != nil {
		t.Fatalf("awstest: %v", err)
	}
	return b
}

// SQS returns an SQS client of endpoint.
func SQS(endpoint string) *awssqs.Client { return awssqs.NewFromConfig(Config(endpoint)) }

// QueueName returns a queue name unique to the calling test (with suffix,
// "" or ".fifo").
func QueueName(suffix string) string {
	return "herald-test-" + uuid.NewString()[:8] + suffix
}

// CreateQueue creates queue name with attrs and deletes it in cleanup; it
// returns the queue's URL.
func CreateQueue(t testing.TB, c *awssqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	out, err := c.CreateQueue(Context(t), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("awstest: creating queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		if _, err := c.DeleteQueue(Context(t), &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Errorf("awstest: deleting queue %s: %v", name, err)
		}
	})
	return url
}

// Receive reads and deletes the messages available at url now, in the
// order the queue hands them out.
func Receive(t testing.TB, c *awssqs.Client, url string) []Message {
	t.Helper()
	var msgs []Message
	for {
		out, err := c.ReceiveMessage(Context(t), &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 0,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			VisibilityTimeout:           300,
		})
		if err != nil {
			t.Fatalf("awstest: receiving from %s: %v", url, err)
		}
		if len(out.Messages) == 0 {
			return msgs
		}
		del := make([]types.DeleteMessageBatchRequestEntry, 0, len(out.Messages))
		for i, m := range out.Messages {
			attrs := map[string]string{}
			for k, v := range m.MessageAttributes {
				attrs[k] = aws.ToString(v.StringValue)
			}
			msgs = append(msgs, Message{Body: aws.ToString(m.Body), Attributes: attrs,
				GroupID:         m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
				DeduplicationID: m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]})
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		// One request for the batch: the server (moto: one Python process)
		// is shared with the sinks under test. A FIFO queue hands out a
		// group's next message only once the earlier ones are deleted.
		res, err := c.DeleteMessageBatch(Context(t), &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del})
		if err == nil && len(res.Failed) > 0 {
			err = fmt.Errorf("%d entries failed, the first: %s", len(res.Failed), aws.ToString(res.Failed[0].Message))
		}
		if err != nil {
			t.Fatalf("awstest: deleting messages from %s: %v", url, err)
		}
	}
}

// WaitFor polls url until want messages arrived, failing after bound.
func WaitFor(t testing.TB, client *awssqs.Client, url string, want int, bound time.Duration) []Message {
	t.Helper()
	var got []Message
	deadline := time.Now().Add(bound)
	for {
		got = append(got, Receive(t, client, url)...)
		if len(got) >= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("awstest: %s received %d messages, want %d", url, len(got), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
