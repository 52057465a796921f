package relaycmd

import (
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// TestREADMECloudEventsExample: docs/sinks.md's CloudEvents sink entry loads
// when put in a configuration, on each sink type that takes it, and one
// without its source is refused naming the sink and the key.
func TestREADMECloudEventsExample(t *testing.T) {
	t.Parallel()
	var entry string
	for _, m := range fencedBlock.FindAllStringSubmatch(doc(t, "sinks.md"), -1) {
		if m[1] == "yaml" && strings.Contains(m[2], "format: cloudevents") {
			entry = m[2]
			break
		}
	}
	if entry == "" {
		t.Fatal("docs/sinks.md: no YAML example with format: cloudevents")
	}
	const rest = "database: {url: postgres://localhost/postgres}\nroutes:\n  - topics: [\"*\"]\n    sinks: [bus]\n"
	noEnv := func(string) (string, bool) { return "", false }
	for _, sink := range []string{"type: nats\n    url: nats://localhost:4222",
		"type: kafka\n    brokers: [localhost:9092]", "type: webhook\n    url: https://example.com/hooks",
		"type: rabbitmq\n    url: amqp://guest:guest@localhost:5672/",
		"type: mqtt\n    url: mqtt://localhost:1883",
		"type: pubsub\n    project: acme-prod",
	} {
		cfg := strings.Replace(entry, "type: nats\n    url: nats://localhost:4222", sink, 1)
		if _, err := relayconfig.Parse("README", []byte(cfg+rest), noEnv); err != nil {
			t.Errorf("docs/sinks.md's CloudEvents entry as %s does not load: %v", strings.Fields(sink)[1], err)
		}
		noSource := strings.Replace(cfg, ", source: /orders-service", "", 1)
		_, err := relayconfig.Parse("README", []byte(noSource+rest), noEnv)
		if err == nil || !strings.Contains(err.Error(), "(bus)") || !strings.Contains(err.Error(), "cloudevents.source: required") {
			t.Errorf("%s without cloudevents.source: %v, want an error naming the sink and cloudevents.source", strings.Fields(sink)[1], err)
		}
	}
}
