package relaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/heraldhq/herald/internal/awstest"
	"github.com/heraldhq/herald/internal/pgtest"
)

// TestREADMEAWSExample runs relay config check on docs/sinks.md's SQS/SNS
// example against a moto server, with the endpoint and credentials in the
// AWS environment as a deployment would have them: both sinks answer and
// the routes' fixed queue and topic exist. Without them, the check fails
// naming the queue; a bad key exits 2 naming it.
func TestREADMEAWSExample(t *testing.T) {
	t.Parallel()
	text := doc(t, "sinks.md")
	at := strings.Index(text, "\n## Amazon SQS and SNS (`type: sqs`")
	if at < 0 {
		t.Fatal("docs/sinks.md: no Amazon SQS and SNS section")
	}
	block := fencedBlock.FindStringSubmatch(text[at:])
	if block == nil || block[1] != "yaml" || !strings.Contains(block[2], "type: sqs") {
		t.Fatal("docs/sinks.md: the SQS section does not start with a YAML example")
	}
	endpoint := awstest.Server(t)
	env := []string{"AWS_ENDPOINT_URL=" + endpoint, "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	url, _ := dbURL(t)
	tables := pgtest.Schema(t, pgtest.Pool(t))
	config := writeConfig(t, fmt.Sprintf("database: {url: %q, schema: %s}\n", url, tables.Schema)+block[2])

	r := runRelay(t, env, "config", "check", "--config", config)
	if r.code != 1 || !strings.Contains(r.stdout+r.stderr, `queue "orders.fifo"`) {
		t.Fatalf("relay config check before the queue exists: want exit 1 naming the queue:\n%s", r)
	}

	cfg := awstest.Config(endpoint)
	cfg.Region = "eu-west-1"
	ctx := context.Background()
	if _, err := awssqs.NewFromConfig(cfg).CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String("orders.fifo"),
		Attributes: map[string]string{"FifoQueue": "true"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := awssns.NewFromConfig(cfg).CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String("orders.fifo"),
		Attributes: map[string]string{"FifoTopic": "true"}}); err != nil {
		t.Fatal(err)
	}
	r = runRelay(t, env, "config", "check", "--config", config)
	if r.code != 0 || !strings.Contains(r.stdout, "sink queues (sqs): ok") || !strings.Contains(r.stdout, "sink topics (sns): ok") {
		t.Fatalf("relay config check on docs/sinks.md's SQS/SNS example:\n%s", r)
	}

	bad := strings.Replace(readFile(t, config), "    type: sqs\n", "    type: sqs\n    max_in_flight: -1\n", 1)
	r = runRelay(t, env, "config", "check", "--config", writeConfig(t, bad))
	if r.code != 2 || !strings.Contains(r.stderr, "sinks[0] (queues).max_in_flight: -1 must not be negative") {
		t.Fatalf("want exit 2 naming max_in_flight:\n%s", r)
	}
}

// TestBenchSQSAndSNS runs the binary's bench against a moto server, as
// docs/benchmarks.md does, and against --aws-instant (an SQS endpoint in the
// bench's process), and checks every event was acknowledged.
func TestBenchSQSAndSNS(t *testing.T) {
	t.Parallel()
	endpoint := awstest.Server(t)
	env := []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	url, _ := dbURL(t)
	for _, c := range []struct{ name, sink, endpointFlag string }{
		{"sqs", "sqs", "--aws-endpoint=" + endpoint},
		{"sns", "sns", "--aws-endpoint=" + endpoint},
		// The relay's own ceiling: an endpoint in the bench's process.
		{"sqs-instant", "sqs", "--aws-instant"},
	} {
		sink := c.sink
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runRelay(t, env, "bench", "--sink", sink, c.endpointFlag, "--events", "200", "--keys", "10",
				"--database-url", url, "--json")
			if r.code != 0 {
				t.Fatalf("relay bench --sink %s:\n%s", sink, r)
			}
			var res struct {
				Sink         string `json:"sink"`
				Verification struct {
					Delivered int `json:"delivered"`
					Lost      int `json:"lost"`
				} `json:"verification"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("stdout is not the JSON result (%v):\n%s", err, r)
			}
			if res.Sink != sink || res.Verification.Delivered != 200 || res.Verification.Lost != 0 {
				t.Fatalf("result %+v\n%s", res, r)
			}
		})
	}
}
