package mqtt_test

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// readCloudEvent decodes a message per the MQTT 5 protocol binding with
// code independent of package cloudevents: structured when "the value of
// the `Content Type` property is prefixed with the CloudEvents media type
// `application/cloudevents`" (mqtt-protocol-binding.md 3), else binary with
// datacontenttype from Content Type (3.1.1) and every other attribute a user
// property of its own name (3.1.3.1).
func readCloudEvent(t *testing.T, m mqtttest.Message) (attrs map[string]string, data []byte) {
	t.Helper()
	attrs = map[string]string{}
	if strings.HasPrefix(m.ContentType, "application/cloudevents") {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m.Payload, &obj); err != nil {
			t.Fatalf("structured payload: %v: %s", err, m.Payload)
		}
		for k, v := range obj {
			var s string
			switch {
			case k == "data":
				data = v
			case json.Unmarshal(v, &s) != nil:
				t.Fatalf("attribute %s is not a string: %s", k, v)
			case k == "data_base64":
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					t.Fatalf("data_base64: %v", err)
				}
				data = b
			default:
				attrs[k] = s
			}
		}
		return attrs, data
	}
	maps.Copy(attrs, m.User)
	if m.ContentType != "" {
		attrs["datacontenttype"] = m.ContentType
	}
	return attrs, m.Payload
}

func cloudEventsConformance(t *testing.T, mode cloudevents.Mode) {
	url := mqtttest.URL(t)
	var subs sync.Map // destination → *mqtttest.Subscriber
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			subs.Store(destination, mqtttest.Subscribe(t, url, destination))
			s, err := mqtt.New("conformance", mqtt.Config{URL: url, Format: mqtt.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := mqtt.New("conformance", mqtt.Config{URL: "mqtt://" + sinktest.ClosedAddr(t), Format: mqtt.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			v, ok := subs.Load(destination)
			if !ok {
				t.Fatalf("no subscriber for %s", destination)
			}
			var out []sinktest.Received
			for _, m := range v.(*mqtttest.Subscriber).Messages() {
				attrs, data := readCloudEvent(t, m)
				out = append(out, sinktest.Received{ID: attrs["id"], Key: attrs["subject"], Destination: m.Topic, Payload: data})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event(destination+"/+", key, []byte(`{}`)) // a wildcard: not a topic name
		},
		// x-tenant, the suite's event header, is no valid extension name.
		Features: sinktest.Features{Binary: true, Keys: true, ReportsEarly: true},
		Timeout:  30 * time.Second,
	})
}

func TestConformanceCloudEventsBinary(t *testing.T) {
	t.Parallel()
	cloudEventsConformance(t, cloudevents.ModeBinary)
}

func TestConformanceCloudEventsStructured(t *testing.T) {
	t.Parallel()
	cloudEventsConformance(t, cloudevents.ModeStructured)
}

func ceEvent(topic string) sinks.Event {
	e := sinktest.Event(topic, "order 7 €", []byte(`{"total":12}`))
	e.Topic = "orders.created"
	e.CreatedAt = time.Date(2026, 12, 1, 19, 4, 5, 0, time.UTC)
	e.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tenant":      "acme",
		"x-tenant":    "left out: not an extension name",
	}
	return e
}

// TestCloudEventsBinaryMessage: the delivered PUBLISH carries exactly the
// MQTT binding's user properties, the attribute names "used unchanged"
// (mqtt-protocol-binding.md 3.1.3.1) with canonical string values (3.1.3.2),
// datacontenttype as the Content Type property and not as a user property
// (3.1.1, 3.1.3), and the payload as it is (3.1.2); no Herald- properties.
func TestCloudEventsBinaryMessage(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	p := mqtttest.Prefix()
	sub := mqtttest.Subscribe(t, url, p+"/#")
	s := open(t, mqtt.Config{URL: url, Format: mqtt.FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent(p + "/orders")
	unkeyed := ceEvent(p + "/orders")
	unkeyed.Key = ""
	bin := ceEvent(p + "/bin")
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff}
	for i, err := range publish(t, s, e, unkeyed, bin) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	got := sub.WaitFor(t, 3, 30*time.Second)
	want := map[string]string{
		"specversion": "1.0",
		"id":          e.ID,
		"source":      "/shop/orders",
		"type":        "orders.created",
		"subject":     "order 7 €",
		"time":        "2026-12-01T19:04:05Z",
		"traceparent": e.Headers["traceparent"],
		"tenant":      "acme",
	}
	m := got[0]
	if !maps.Equal(m.User, want) {
		t.Fatalf("user properties\n got %v\nwant %v", m.User, want)
	}
	if m.Topic != e.Destination || m.ContentType != "application/json" || string(m.Payload) != `{"total":12}` ||
		m.PayloadFormat == nil || *m.PayloadFormat != 1 {
		t.Fatalf("topic %s content type %q payload %s payload format %v, want %s, application/json, the payload, 1",
			m.Topic, m.ContentType, m.Payload, m.PayloadFormat, e.Destination)
	}
	if _, ok := got[1].User["subject"]; ok {
		t.Fatalf("event without a key has a subject property: %v", got[1].User)
	}
	if got[2].ContentType != "application/octet-stream" || string(got[2].Payload) != string(bin.Payload) || got[2].PayloadFormat != nil {
		t.Fatalf("binary payload: content type %q payload %q payload format %v", got[2].ContentType, got[2].Payload, got[2].PayloadFormat)
	}

	// A key with NUL cannot be an MQTT user property: refused unsent.
	nul := ceEvent(p + "/orders")
	nul.Key = "a\x00b"
	if errs := publish(t, s, nul); !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "CloudEvents attribute subject") {
		t.Fatalf("key with NUL: %v, want a permanent error naming the subject attribute", errs[0])
	}
}

// TestCloudEventsStructuredMessage: the payload is the JSON event format
// and Content Type its media type (mqtt-protocol-binding.md 3.2.1, 3.2.2),
// without user properties (3.2.3 makes them optional); a binary payload is
// data_base64.
func TestCloudEventsStructuredMessage(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	p := mqtttest.Prefix()
	sub := mqtttest.Subscribe(t, url, p+"/#")
	s := open(t, mqtt.Config{URL: url, Format: mqtt.FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}})
	e := ceEvent(p + "/orders")
	bin := ceEvent(p + "/orders")
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff, 'a'}
	for i, err := range publish(t, s, e, bin) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	got := sub.WaitFor(t, 2, 30*time.Second)
	m := got[0]
	if m.ContentType != "application/cloudevents+json" || len(m.User) != 0 || m.PayloadFormat == nil || *m.PayloadFormat != 1 {
		t.Fatalf("content type %q user properties %v payload format %v", m.ContentType, m.User, m.PayloadFormat)
	}
	var body map[string]any
	if err := json.Unmarshal(m.Payload, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": e.ID, "source": "/shop/orders", "type": "orders.created",
		"subject": "order 7 €", "time": "2026-12-01T19:04:05Z", "datacontenttype": "application/json",
		"traceparent": e.Headers["traceparent"], "tenant": "acme", "data": map[string]any{"total": 12.0},
	}
	x, _ := json.Marshal(body)
	y, _ := json.Marshal(want)
	if string(x) != string(y) {
		t.Fatalf("payload %s\nwant    %s", x, y)
	}
	attrs, data := readCloudEvent(t, got[1])
	if string(data) != string(bin.Payload) || attrs["datacontenttype"] != "application/octet-stream" ||
		!strings.Contains(string(got[1].Payload), `"data_base64"`) {
		t.Fatalf("binary payload: %s", got[1].Payload)
	}
	bad := ceEvent(p + "/orders")
	bad.Payload = []byte(`{"total":`)
	if errs := publish(t, s, bad); !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "not valid JSON") {
		t.Fatalf("JSON content type with a payload that is not JSON: %v, want permanent", errs[0])
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  mqtt.Config
		want string
	}{
		{mqtt.Config{URL: "mqtt://h", Format: mqtt.FormatCloudEvents}, "cloudevents.source: required"},
		{mqtt.Config{URL: "mqtt://h", Format: mqtt.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: "text", Source: "/s"}},
			`cloudevents.mode: "text" must be binary or structured`},
		{mqtt.Config{URL: "mqtt://h", CloudEvents: cloudevents.Config{Source: "/s"}}, "cloudevents: set, but format is not cloudevents"},
		{mqtt.Config{URL: "mqtt://h", Format: "json"}, `format: "json" must be herald or cloudevents`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
		if _, err := mqtt.New("x", tc.cfg, quiet); err == nil {
			t.Errorf("New accepted %+v", tc.cfg)
		}
	}
	ok := mqtt.Config{URL: "mqtt://h", Format: mqtt.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/s"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid cloudevents config: %v", err)
	}
}
