package relaycmd

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestREADMEPubSubExample: docs/sinks.md's Pub/Sub example loads as written
// (Google's endpoint, credentials found when first used) and, with its
// endpoint line uncommented to point at a pstest server, its sink delivers
// through its route's destination to the topic it names.
func TestREADMEPubSubExample(t *testing.T) {
	t.Parallel()
	text := doc(t, "sinks.md")
	at := strings.Index(text, "\n## Google Cloud Pub/Sub (`type: pubsub`")
	if at < 0 {
		t.Fatal("docs/sinks.md: no Pub/Sub section")
	}
	section := text[at:]
	start := strings.Index(section, "```yaml\n")
	end := strings.Index(section[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("docs/sinks.md: no YAML example in the Pub/Sub section")
	}
	example := "database: {url: postgres://postgres@127.0.0.1:5432/postgres}\n" + section[start+8:start+8+end]
	noEnv := func(string) (string, bool) { return "", false }
	if _, err := relayconfig.Parse("README Pub/Sub example", []byte(example), noEnv); err != nil {
		t.Fatalf("docs/sinks.md's Pub/Sub example does not load as written: %v", err)
	}

	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const endpointLine = "# endpoint: 127.0.0.1:8085"
	if !strings.Contains(example, endpointLine) {
		t.Fatalf("docs/sinks.md: the Pub/Sub example has no %q line", endpointLine)
	}
	example = strings.Replace(example, endpointLine, "endpoint: "+srv.Addr, 1)
	f, err := relayconfig.Parse("README Pub/Sub example", []byte(example), noEnv)
	if err != nil {
		t.Fatalf("docs/sinks.md's Pub/Sub example with an endpoint does not load: %v", err)
	}
	b, err := f.Build(t.Context(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.WithoutCancel(t.Context()))
	target := b.Config.Routes[0].Targets[0]
	var dest strings.Builder
	if err := target.Destination.Execute(&dest, relay.DestinationData{Topic: "orders.created"}); err != nil {
		t.Fatal(err)
	}
	topic := "projects/acme-prod/topics/" + dest.String()
	if _, err := srv.GServer.CreateTopic(t.Context(), &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	e := sinktest.Event(dest.String(), "o-1", []byte(`{"total":42}`))
	if errs := target.Sink.Publish(t.Context(), []sinks.Event{e}); errs[0] != nil {
		t.Fatalf("publishing through docs/sinks.md's sink: %v", errs[0])
	}
	msgs := srv.Messages()
	if len(msgs) != 1 || msgs[0].Topic != topic || msgs[0].Attributes["herald-id"] != e.ID || msgs[0].OrderingKey != "o-1" {
		t.Fatalf("server stored %+v, want the event on %s", msgs, topic)
	}
}
