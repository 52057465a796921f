package relayconfig_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// pubsubConfig is a configuration with one pubsub sink; cases edit it.
const pubsubConfig = `database: {url: postgres://postgres@127.0.0.1:5432/test}
sinks:
  - name: gcp
    type: pubsub
    project: acme-prod
    endpoint: 127.0.0.1:8085
    timeout: 5s
    max_topics: 20
routes:
  - topics: ["orders.*"]
    sinks: [{name: gcp, destination: "herald-{{.Topic}}"}]
`

func TestPubSubSink(t *testing.T) {
	t.Parallel()
	env := envOf(nil)
	f, err := relayconfig.Parse("relay.yaml", []byte(pubsubConfig), env)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(b.Sinks) != 1 || fmt.Sprintf("%T", b.Sinks[0]) != "*pubsub.Sink" || b.Sinks[0].Name() != "gcp" {
		t.Fatalf("built sinks %v, want one *pubsub.Sink named gcp", b.Sinks)
	}
	for _, c := range []struct{ name, from, to, want string }{
		{"no project", "    project: acme-prod\n", "", "sinks[0] (gcp).project: required"},
		{"project path", "project: acme-prod", "project: projects/acme-prod", `sinks[0] (gcp).project: "projects/acme-prod" is not a project id`},
		{"endpoint without port", "endpoint: 127.0.0.1:8085", "endpoint: localhost", `sinks[0] (gcp).endpoint: "localhost" is not host:port`},
		{"credentials with endpoint", "timeout: 5s", "timeout: 5s\n    credentials_file: /etc/herald/sa.json", "sinks[0] (gcp).credentials_file: not used with endpoint"},
		{"negative max_topics", "max_topics: 20", "max_topics: -1", "sinks[0] (gcp).max_topics: -1 must not be negative"},
		{"bad timeout", "timeout: 5s", "timeout: soon", `sinks[0] (gcp).timeout: invalid duration "soon"`},
		{"misspelt key", "max_topics: 20", "maxtopics: 20", "sinks[0] (gcp).maxtopics: unknown key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(pubsubConfig, c.from) {
				t.Fatalf("%q is not in the configuration", c.from)
			}
			_, err := relayconfig.Parse("relay.yaml", []byte(strings.Replace(pubsubConfig, c.from, c.to, 1)), env)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, c.want)
			}
		})
	}
}
