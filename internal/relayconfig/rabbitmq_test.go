package relayconfig_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// rabbitConfig is a configuration with one rabbitmq sink; sink holds its
// keys (indented under the entry).
func rabbitConfig(sink string) string {
	return `database: {url: postgres://postgres@127.0.0.1:5432/test}
sinks:
  - name: rabbit
    type: rabbitmq
` + sink + `routes:
  - topics: ["orders.*"]
    sinks: [{name: rabbit, destination: "herald.{{.Topic}}"}]
`
}

func TestRabbitMQSinkType(t *testing.T) {
	t.Parallel()
	const password = "Rabbit-Pa55-LMN"
	env := envOf(map[string]string{"RABBITMQ_PASSWORD": password})
	good := "    url: amqp://herald:${RABBITMQ_PASSWORD}@127.0.0.1:5672/\n    exchange: events\n    mandatory: false\n    confirm_timeout: 2s\n    max_pending: 64\n"
	f, err := relayconfig.Parse("relay.yaml", []byte(rabbitConfig(good)), env)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	defer b.Close(context.Background())
	if len(b.Sinks) != 1 || fmt.Sprintf("%T", b.Sinks[0]) != "*rabbitmq.Sink" || b.Sinks[0].Name() != "rabbit" {
		t.Fatalf("built sinks %v, want one *rabbitmq.Sink named rabbit", b.Sinks)
	}

	cases := []struct{ name, from, to, want string }{
		{"unknown key", "exchange: events", "exchnage: events", "sinks[0] (rabbit).exchnage: unknown key"},
		{"bad scheme", "url: amqp://", "url: http://", "sinks[0] (rabbit).url:"},
		{"no url", "    url: amqp://herald:${RABBITMQ_PASSWORD}@127.0.0.1:5672/\n", "", "sinks[0] (rabbit).url: required"},
		{"bad duration", "confirm_timeout: 2s", "confirm_timeout: soon", `sinks[0] (rabbit).confirm_timeout: invalid duration "soon"`},
		{"negative max_pending", "max_pending: 64", "max_pending: -1", "sinks[0] (rabbit).max_pending: -1 must not be negative"},
		{"mandatory not a bool", "mandatory: false", "mandatory: sometimes", "sinks[0] (rabbit).mandatory: expected true or false"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			y := strings.Replace(good, c.from, c.to, 1)
			if y == good {
				t.Fatalf("test setup: %q not found", c.from)
			}
			_, err := relayconfig.Parse("relay.yaml", []byte(rabbitConfig(y)), env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), password) {
				t.Fatalf("error %q reveals the password", err)
			}
		})
	}
}
