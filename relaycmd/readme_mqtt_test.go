package relaycmd

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestREADMEMQTTExample: the MQTT section's configuration loads as written
// (with a database section and its password set), and the sink it builds
// delivers an event, routed by the example's destination template, to a
// subscriber on the machine's broker.
func TestREADMEMQTTExample(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	text := doc(t, "sinks.md")
	_, section, ok := strings.Cut(text, "\n## MQTT (")
	if !ok {
		t.Fatal("docs/sinks.md: no ## MQTT section")
	}
	var example string
	if m := fencedBlock.FindStringSubmatch(section); m != nil && m[1] == "yaml" {
		example = m[2]
	} else {
		t.Fatal("docs/sinks.md: the MQTT section does not open with a YAML example")
	}
	if !strings.Contains(example, "mqtt://localhost:1883") {
		t.Fatalf("docs/sinks.md's MQTT example does not use mqtt://localhost:1883:\n%s", example)
	}
	// The broker the tests use, which is localhost:1883 unless MQTT_URL says otherwise.
	example = strings.Replace(example, "mqtt://localhost:1883", url, 1)
	cfgText := "database:\n  url: \"" + pgtest.URL(t) + "\"\n" + example
	env := map[string]string{"MQTT_PASSWORD": "any-password"} // the machine's Mosquitto is anonymous and accepts any
	f, err := relayconfig.Parse("README MQTT example", []byte(cfgText), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("docs/sinks.md's MQTT example does not load: %v", err)
	}
	b, err := f.Build(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if len(b.Config.Routes) != 1 || len(b.Config.Routes[0].Targets) != 1 {
		t.Fatalf("routes = %+v, want one route with one target", b.Config.Routes)
	}
	target := b.Config.Routes[0].Targets[0]
	s, ok := target.Sink.(*mqtt.Sink)
	if !ok {
		t.Fatalf("the example's sink is %T, want *mqtt.Sink", target.Sink)
	}
	key := strings.ReplaceAll(mqtttest.Prefix(), "/", "-")
	var dest bytes.Buffer
	if err := target.Destination.Execute(&dest, relay.DestinationData{Topic: "devices.updated", Key: key}); err != nil {
		t.Fatal(err)
	}
	sub := mqtttest.Subscribe(t, url, dest.String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	e := sinktest.Event(dest.String(), key, []byte(`{"device":1}`))
	if errs := s.Publish(ctx, []sinks.Event{e}); errs[0] != nil {
		t.Fatalf("Publish: %v", errs[0])
	}
	if got := sub.WaitFor(t, 1, 30*time.Second)[0]; got.User[mqtt.PropertyID] != e.ID {
		t.Fatalf("received %+v, want event %s", got, e.ID)
	}
}
