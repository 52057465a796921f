package relaybench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/relaybench"
	"github.com/heraldhq/herald/sinks/mqtt"
)

// TestDrainMQTT: a drain through the MQTT sink counts every event
// acknowledged, and the broker delivered each one on the run's
// topic.
func TestDrainMQTT(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	sub := mqtttest.Subscribe(t, url, "herald_bench/#")
	res := run(t, relaybench.Config{Sink: relaybench.SinkMQTT, MQTTURL: url, Events: 1000, Keys: 50, Relays: 2})
	if res.Sink != relaybench.SinkMQTT || res.Events != 1000 || res.Failures != 0 {
		t.Fatalf("result %+v", res)
	}
	byTopic := map[string]map[string]int{} // topic → event id → copies
	for _, m := range sub.WaitFor(t, 1000, 30*time.Second) {
		if byTopic[m.Topic] == nil {
			byTopic[m.Topic] = map[string]int{}
		}
		byTopic[m.Topic][m.User[mqtt.PropertyID]]++
	}
	for topic, ids := range byTopic {
		if strings.HasSuffix(topic, "/events") && len(ids) == 1000 {
			return
		}
	}
	t.Fatalf("no topic received the run's 1000 distinct events: %d topics", len(byTopic))
}

func TestUnreachableMQTT(t *testing.T) {
	t.Parallel()
	_, err := relaybench.Run(context.Background(), relaybench.Config{DatabaseURL: pgtest.URL(t), Sink: relaybench.SinkMQTT,
		MQTTURL: "mqtt://127.0.0.1:1", Events: 10})
	if err == nil || !strings.Contains(err.Error(), "--mqtt-url: connecting to mqtt://127.0.0.1:1") {
		t.Fatalf("want an MQTT connection error, got %v", err)
	}
}
