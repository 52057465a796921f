package relayconfig_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// mqttConfig is a configuration with one MQTT sink; cases edit it.
const mqttConfig = `database:
  url: postgres://postgres@127.0.0.1:5432/test?sslmode=disable
sinks:
  - name: devices
    type: mqtt
    url: mqtt://herald:${MQTT_PASSWORD}@127.0.0.1:1883
    ack_timeout: 5s
routes:
  - topics: ["devices.*"]
    sinks: [{name: devices, destination: "devices/{{.Key}}"}]
`

const mqttPassword = "mqtt-Pa55-KLM"

func TestMQTTSinkType(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{"MQTT_PASSWORD": mqttPassword})
	f, err := relayconfig.Parse("relay.yaml", []byte(mqttConfig), env)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	b, err := f.Build(context.Background(), slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Sinks) != 1 || fmt.Sprintf("%T", b.Sinks[0]) != "*mqtt.Sink" || b.Sinks[0].Name() != "devices" {
		t.Fatalf("sinks = %v, want one *mqtt.Sink named devices", b.Sinks)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprintf("%+v %v", *f, logs.String()); strings.Contains(s, mqttPassword) {
		t.Fatalf("the file or the logs reveal the MQTT password: %s", s)
	}
}

func TestMQTTSinkErrorsNameTheField(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{"MQTT_PASSWORD": mqttPassword})
	for _, tc := range []struct{ old, new, want string }{
		{"ack_timeout: 5s", "ack_timeout: -5s", "sinks[0] (devices).ack_timeout: -5s must not be negative"},
		{"ack_timeout: 5s", "ack_timout: 5s", "sinks[0] (devices).ack_timout: unknown key"},
		{"url: mqtt://", "url: http://", "sinks[0] (devices).url:"},
		{"    ack_timeout: 5s\n", "    username: x\n", "sinks[0] (devices).username, password:"},
	} {
		y := strings.Replace(mqttConfig, tc.old, tc.new, 1)
		_, err := relayconfig.Parse("relay.yaml", []byte(y), env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: %v, want %q", tc.old, tc.new, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), mqttPassword) {
			t.Errorf("error reveals the password: %v", err)
		}
	}
}
