package pubsub_test

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// readCloudEvent decodes a message per the Google Cloud Pub/Sub binding
// with code independent of package cloudevents: structured when the
// content-type attribute "is prefixed with the CloudEvents media type
// application/cloudevents" (pubsub.md 3), else binary, with
// datacontenttype from content-type (3.1.1) and every other attribute from
// a ce- attribute (3.1.3.1).
func readCloudEvent(t *testing.T, m *pstest.Message) (attrs map[string]string, data []byte) {
	t.Helper()
	attrs = map[string]string{}
	if strings.HasPrefix(m.Attributes["content-type"], "application/cloudevents") {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m.Data, &obj); err != nil {
			t.Fatalf("structured data: %v: %s", err, m.Data)
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
	for k, v := range m.Attributes {
		switch {
		case k == "content-type":
			attrs["datacontenttype"] = v
		case strings.HasPrefix(k, "ce-"):
			attrs[strings.TrimPrefix(k, "ce-")] = v
		default:
			t.Fatalf("binary mode: attribute %s is neither ce- nor content-type", k)
		}
	}
	return attrs, m.Data
}

func cloudEventsConformance(t *testing.T, mode cloudevents.Mode) {
	b := setup(t)
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			b.createTopic(t, destination)
			return newSink(t, pubsub.Config{Endpoint: b.endpoint, Format: pubsub.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}})
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			return newSink(t, pubsub.Config{Endpoint: sinktest.ClosedAddr(t), Timeout: time.Second, Format: pubsub.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}})
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range b.received(destination) {
				attrs, data := readCloudEvent(t, m)
				if attrs["subject"] != m.OrderingKey {
					t.Fatalf("event %s: subject %q, ordering key %q", attrs["id"], attrs["subject"], m.OrderingKey)
				}
				out = append(out, sinktest.Received{ID: attrs["id"], Key: attrs["subject"],
					Destination: strings.TrimPrefix(m.Topic, "projects/"+project+"/topics/"), Payload: data})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 10_000_001)
		},
		// x-tenant, the suite's event header, is no valid extension name.
		Features: sinktest.Features{Binary: true, Keys: true, ReportsEarly: true},
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

// TestCloudEventsBinaryMessage: the message pstest stored carries exactly
// the binding's attributes, ce- prefixed (pubsub.md 3.1.3.1) with
// canonical string values, not percent-encoded (3.1.3.2), datacontenttype
// as content-type and not as ce-datacontenttype (3.1.1), the payload as the
// data (3.1.2), the key as the ordering key; no herald- attributes.
func TestCloudEventsBinaryMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("cebin")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint, Format: pubsub.FormatCloudEvents,
		CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent(topic)
	unkeyed := ceEvent(topic)
	unkeyed.Key = ""
	bin := ceEvent(topic)
	bin.Key = "bin"
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff}
	requireDelivered(t, publish(t, s, []sinks.Event{e, unkeyed, bin}))
	got := b.received(topic)
	if len(got) != 3 {
		t.Fatalf("server stored %d messages, want 3", len(got))
	}
	byID := map[string]*pstest.Message{}
	for _, m := range got {
		byID[m.Attributes["ce-id"]] = m
	}
	want := map[string]string{
		"ce-specversion": "1.0",
		"ce-id":          e.ID,
		"ce-source":      "/shop/orders",
		"ce-type":        "orders.created",
		"ce-subject":     "order 7 €",
		"ce-time":        "2026-12-01T19:04:05Z",
		"content-type":   "application/json",
		"ce-traceparent": e.Headers["traceparent"],
		"ce-tenant":      "acme",
	}
	m := byID[e.ID]
	if m == nil || !maps.Equal(m.Attributes, want) {
		t.Fatalf("attributes\n got %v\nwant %v", m, want)
	}
	if m.OrderingKey != "order 7 €" || string(m.Data) != `{"total":12}` {
		t.Fatalf("ordering key %q data %s", m.OrderingKey, m.Data)
	}
	if m := byID[unkeyed.ID]; m == nil || m.OrderingKey != "" || m.Attributes["ce-subject"] != "" {
		t.Fatalf("event without a key: %+v", m)
	}
	if _, ok := byID[unkeyed.ID].Attributes["ce-subject"]; ok {
		t.Fatalf("event without a key has ce-subject: %v", byID[unkeyed.ID].Attributes)
	}
	if m := byID[bin.ID]; m == nil || m.Attributes["content-type"] != "application/octet-stream" || string(m.Data) != string(bin.Payload) {
		t.Fatalf("binary payload: %+v", m)
	}

	// A type over Pub/Sub's attribute value limit is refused unsent,
	// naming the attribute.
	long := ceEvent(topic)
	long.Topic = strings.Repeat("t", 1025)
	errs := publish(t, s, []sinks.Event{long})
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), `CloudEvents attribute "ce-type"`) {
		t.Fatalf("type of 1025 bytes: %v, want a permanent error naming ce-type", errs[0])
	}
	if n := len(b.received(topic)); n != 3 {
		t.Fatalf("server stored %d messages after the refused one, want 3", n)
	}
}

// TestCloudEventsStructuredMessage: the data is the JSON event format and
// content-type its media type as pubsub.md 3.2.1 writes it, with no other
// attribute (3.2.3 makes them optional); a binary payload is data_base64;
// the key is still the ordering key.
func TestCloudEventsStructuredMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := uniqueTopic("cestr")
	b.createTopic(t, topic)
	s := newSink(t, pubsub.Config{Endpoint: b.endpoint, Format: pubsub.FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}})
	e := ceEvent(topic)
	bin := ceEvent(topic)
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff, 'a'}
	requireDelivered(t, publish(t, s, []sinks.Event{e, bin}))
	got := b.received(topic)
	if len(got) != 2 {
		t.Fatalf("server stored %d messages, want 2", len(got))
	}
	m := got[0]
	if !maps.Equal(m.Attributes, map[string]string{"content-type": "application/cloudevents+json; charset=UTF-8"}) || m.OrderingKey != "order 7 €" {
		t.Fatalf("attributes %v ordering key %q", m.Attributes, m.OrderingKey)
	}
	var body map[string]any
	if err := json.Unmarshal(m.Data, &body); err != nil {
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
		t.Fatalf("data %s\nwant %s", x, y)
	}
	attrs, data := readCloudEvent(t, got[1])
	if string(data) != string(bin.Payload) || attrs["datacontenttype"] != "application/octet-stream" ||
		!strings.Contains(string(got[1].Data), `"data_base64"`) {
		t.Fatalf("binary payload: %s", got[1].Data)
	}
	bad := ceEvent(topic)
	bad.Payload = []byte(`{"total":`)
	errs := publish(t, s, []sinks.Event{bad})
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "not valid JSON") || !strings.Contains(errs[0].Error(), bad.ID) {
		t.Fatalf("JSON content type with data that is not JSON: %v, want permanent, naming the event", errs[0])
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  pubsub.Config
		want string
	}{
		{pubsub.Config{Project: project, Format: pubsub.FormatCloudEvents}, "cloudevents.source: required"},
		{pubsub.Config{Project: project, Format: pubsub.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: "text", Source: "/s"}},
			`cloudevents.mode: "text" must be binary or structured`},
		{pubsub.Config{Project: project, CloudEvents: cloudevents.Config{Source: "/s"}}, "cloudevents: set, but format is not cloudevents"},
		{pubsub.Config{Project: project, Format: "json"}, `format: "json" must be herald or cloudevents`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
		if _, err := pubsub.New("x", tc.cfg, nil); err == nil {
			t.Errorf("New accepted %+v", tc.cfg)
		}
	}
	for _, ok := range []pubsub.Config{
		{Project: project, Format: pubsub.FormatHerald},
		{Project: project, Format: pubsub.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/s"}},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", ok, err)
		}
	}
}
