package mqtt_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   mqtt.Config
		field string
	}{
		{mqtt.Config{}, "url:"},
		{mqtt.Config{URL: "http://h:1883"}, "url:"},
		{mqtt.Config{URL: "mqtt://u:topsecret@h:1883/path"}, "url:"},
		{mqtt.Config{URL: "mqtt://u:topsecret@h", Username: "x"}, "username, password:"},
		{mqtt.Config{URL: "mqtt://h", Password: "topsecret"}, "password:"},
		{mqtt.Config{URL: "mqtt://h", AckTimeout: -time.Second}, "ack_timeout:"},
		{mqtt.Config{URL: "mqtt://h", ConnectTimeout: -time.Second}, "connect_timeout:"},
		{mqtt.Config{URL: "mqtt://h", KeepAlive: 70000 * time.Second}, "keep_alive:"},
		{mqtt.Config{URL: "mqtts://h", TLS: sinksTLS("/nonexistent/ca.pem")}, "tls.ca_file:"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want an error starting %q", tc.cfg, err, tc.field)
			continue
		}
		if strings.Contains(err.Error(), "topsecret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
	for _, url := range []string{"mqtt://127.0.0.1:1883", "tcp://h", "mqtts://u:p@h:8883", "ssl://h/"} {
		if err := (mqtt.Config{URL: url}).Validate(); err != nil {
			t.Errorf("%s: %v", url, err)
		}
	}
}

func sinksTLS(ca string) sinkconfig.TLSConfig { return sinkconfig.TLSConfig{CAFile: ca} }

func TestConfigPrintsNoPassword(t *testing.T) {
	t.Parallel()
	cfg := mqtt.Config{URL: "mqtt://herald:topsecret@127.0.0.1:1883", AckTimeout: time.Second}
	var logs strings.Builder
	slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "sink", cfg)
	for _, s := range []string{fmt.Sprintf("%v %+v %s", cfg, struct{ C mqtt.Config }{cfg}, cfg), logs.String()} {
		if strings.Contains(s, "topsecret") || !strings.Contains(s, "127.0.0.1:1883") || !strings.Contains(s, "1s") {
			t.Fatalf("printed config %q: want the broker and settings without the password", s)
		}
	}
}
