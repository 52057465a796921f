package relayconfig_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// awsConfig is a configuration with an sqs and an sns sink; cases edit it.
const awsConfig = `database: {url: postgres://postgres@127.0.0.1:5432/test}
sinks:
  - name: queues
    type: sqs
    region: eu-west-1
    endpoint: http://127.0.0.1:4566
    access_key_id: AKIAHERALDTEST
    secret_access_key: ${AWS_SECRET}
    timeout: 5s
  - name: topics
    type: sns
    region: eu-west-1
routes:
  - topics: ["orders.*"]
    sinks:
      - {name: queues, destination: "orders-{{.Key}}.fifo"}
      - {name: topics, destination: "arn:aws:sns:eu-west-1:123456789012:orders"}
`

func TestAWSSinks(t *testing.T) {
	t.Parallel()
	const secret = "aws-s3cr3t-XYZ"
	env := envOf(map[string]string{"AWS_SECRET": secret})
	f, err := relayconfig.Parse("relay.yaml", []byte(awsConfig), env)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(b.Sinks) != 2 || fmt.Sprintf("%T %T", b.Sinks[0], b.Sinks[1]) != "*sqs.Sink *sns.Sink" {
		t.Fatalf("built sinks %v, want an *sqs.Sink and an *sns.Sink", b.Sinks)
	}
	for _, c := range []struct{ name, from, to, want string }{
		{"endpoint", "http://127.0.0.1:4566", "127.0.0.1:4566", `sinks[0] (queues).endpoint: "127.0.0.1:4566" is not an http:// or https:// URL`},
		{"half the credentials", "    access_key_id: AKIAHERALDTEST\n", "", "sinks[0] (queues).access_key_id and secret_access_key: give both or neither"},
		{"bad timeout", "timeout: 5s", "timeout: soon", `sinks[0] (queues).timeout: invalid duration "soon"`},
		{"misspelt key", "    region: eu-west-1\nroutes", "    regoin: eu-west-1\nroutes", "sinks[1] (topics).regoin: unknown key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(awsConfig, c.from) {
				t.Fatalf("%q is not in the configuration", c.from)
			}
			_, err := relayconfig.Parse("relay.yaml", []byte(strings.Replace(awsConfig, c.from, c.to, 1)), env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
}

// TestAWSRegionRequired: without region and AWS_REGION the entry is refused.
func TestAWSRegionRequired(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	cfg := strings.Replace(awsConfig, "    region: eu-west-1\nroutes", "routes", 1)
	_, err := relayconfig.Parse("relay.yaml", []byte(cfg), envOf(map[string]string{"AWS_SECRET": "s"}))
	if err == nil || !strings.Contains(err.Error(), "sinks[1] (topics).region: required") {
		t.Fatalf("Parse = %v, want sinks[1] (topics).region: required", err)
	}
}
