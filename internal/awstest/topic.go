package awstest

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// SNS returns an SNS client of endpoint.
func SNS(endpoint string) *awssns.Client { return awssns.NewFromConfig(Config(endpoint)) }

// CreateTopic creates topic name with attrs and deletes it in cleanup; it
// returns the topic's ARN.
func CreateTopic(t testing.TB, c *awssns.Client, name string, attrs map[string]string) string {
	t.Helper()
	out, err := c.CreateTopic(Context(t), &awssns.CreateTopicInput{Name: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("awstest: creating topic %s: %v", name, err)
	}
	arn := aws.ToString(out.TopicArn)
	t.Cleanup(func() {
		if _, err := c.DeleteTopic(Context(t), &awssns.DeleteTopicInput{TopicArn: aws.String(arn)}); err != nil {
			t.Errorf("awstest: deleting topic %s: %v", name, err)
		}
	})
	return arn
}

// SubscribeQueue subscribes the queue at queueURL to topic with raw
// message delivery (the body is the message, the attributes arrive as
// message attributes), as a consumer of the topic would.
func SubscribeQueue(t testing.TB, sns *awssns.Client, sqs *awssqs.Client, topic, queueURL string) {
	t.Helper()
	attrs, err := sqs.GetQueueAttributes(Context(t), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queueURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatalf("awstest: reading the ARN of %s: %v", queueURL, err)
	}
	_, err = sns.Subscribe(Context(t), &awssns.SubscribeInput{TopicArn: aws.String(topic), Protocol: aws.String("sqs"),
		Endpoint:   aws.String(attrs.Attributes[string(types.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}})
	if err != nil {
		t.Fatalf("awstest: subscribing %s to %s: %v", queueURL, topic, err)
	}
}
