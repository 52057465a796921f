package kafka

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// readCloudEvent decodes a record per the Kafka protocol binding with code
// independent of package cloudevents: structured when content-type starts
// with application/cloudevents (3.1), its value the JSON event format;
// binary otherwise, the attributes in ce_ headers and the data the value.
func readCloudEvent(t *testing.T, m kafkago.Message) (attrs map[string]string, data []byte) {
	t.Helper()
	attrs = map[string]string{}
	if strings.HasPrefix(header(m, "content-type"), "application/cloudevents") {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m.Value, &obj); err != nil {
			t.Fatalf("structured value: %v: %s", err, m.Value)
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
	for _, h := range m.Headers {
		if name, ok := strings.CutPrefix(h.Key, "ce_"); ok {
			attrs[name] = string(h.Value)
		}
	}
	attrs["datacontenttype"] = header(m, "content-type")
	return attrs, m.Value
}

func cloudEventsConformance(t *testing.T, mode cloudevents.Mode) {
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			createTopic(t, c, destination, 3, nil)
			s, err := New("conformance", Config{Brokers: []string{addr}, Format: FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := New("conformance", Config{Brokers: []string{sinktest.ClosedAddr(t)}, Format: FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range all(readTopic(t, addr, destination, nil)) {
				attrs, data := readCloudEvent(t, m)
				if attrs["subject"] != string(m.Key) {
					t.Fatalf("subject %q, record key %q", attrs["subject"], m.Key)
				}
				out = append(out, sinktest.Received{ID: attrs["id"], Key: string(m.Key), Destination: m.Topic, Payload: data})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2*DefaultMaxMessageBytes)
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

func ceEvent() sinks.Event {
	e := sinktest.Event("orders.v1", "order 7 €", []byte(`{"total":12}`))
	e.Topic = "orders.created"
	e.CreatedAt = time.Date(2026, 12, 1, 19, 4, 5, 0, time.UTC)
	e.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tenant":      "acme",
		"x-tenant":    "left out: not an extension name",
	}
	return e
}

// TestCloudEventsBinaryRecord: the record carries exactly the Kafka
// binding's headers, in the attribute order (kafka-protocol-binding.md
// 3.2.3.1: "`time` maps to `ce_time`", "`id` maps to `ce_id`",
// "`specversion` maps to `ce_specversion`"; 3.2.1: "the header
// `content-type` property MUST be mapped directly to the CloudEvents
// `datacontenttype` attribute"), values as UTF-8 without percent-encoding,
// the payload as the value (3.2.2) and the event key as the record key
// (3.1).
func TestCloudEventsBinaryRecord(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "orders.v1", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}, Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent()
	unkeyed := ceEvent()
	unkeyed.Key = ""
	requireOK(t, publish(t, s, []sinks.Event{e, unkeyed}))
	got := all(readTopic(t, addr, "orders.v1", nil))
	if len(got) != 2 {
		t.Fatalf("read %d records, want 2", len(got))
	}
	m := got[0]
	var headers []string
	for _, h := range m.Headers {
		headers = append(headers, h.Key+"="+string(h.Value))
	}
	want := []string{"ce_specversion=1.0", "ce_id=" + e.ID, "ce_source=/shop/orders", "ce_type=orders.created",
		"ce_subject=order 7 €", "ce_time=2026-12-01T19:04:05Z", "content-type=application/json",
		"ce_tenant=acme", "ce_traceparent=" + e.Headers["traceparent"]}
	if strings.Join(headers, "\n") != strings.Join(want, "\n") {
		t.Fatalf("headers\n got %q\nwant %q", headers, want)
	}
	if string(m.Key) != e.Key || !bytes.Equal(m.Value, e.Payload) || !m.Time.Equal(e.CreatedAt) {
		t.Fatalf("record key %q value %s time %s, want %q %s %s", m.Key, m.Value, m.Time, e.Key, e.Payload, e.CreatedAt)
	}
	if got[1].Key != nil || header(got[1], "ce_subject") != "" {
		t.Fatalf("unkeyed event: key %q, headers %v; want no key and no ce_subject", got[1].Key, got[1].Headers)
	}
}

// TestCloudEventsStructuredRecord: the value is the JSON event format and
// content-type is "application/cloudevents+json; charset=UTF-8"
// (kafka-protocol-binding.md 3.3.1), the only header.
func TestCloudEventsStructuredRecord(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	addr := c.ListenAddrs()[0]
	createTopic(t, c, "orders.v1", 1, nil)
	s := newSink(t, Config{Brokers: []string{addr}, Format: FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}})
	e := ceEvent()
	bad := ceEvent()
	bad.Key, bad.Payload = "other", []byte(`{"total":`)
	errs := publish(t, s, []sinks.Event{e, bad})
	if errs[0] != nil || !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), bad.ID) {
		t.Fatalf("results %v, want the JSON event delivered and the invalid JSON payload permanent naming the event", errs)
	}
	got := all(readTopic(t, addr, "orders.v1", nil))
	if len(got) != 1 {
		t.Fatalf("read %d records, want 1", len(got))
	}
	m := got[0]
	if len(m.Headers) != 1 || header(m, "content-type") != "application/cloudevents+json; charset=UTF-8" || string(m.Key) != e.Key {
		t.Fatalf("headers %v key %q", m.Headers, m.Key)
	}
	var body map[string]any
	if err := json.Unmarshal(m.Value, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": e.ID, "source": "/shop/orders", "type": "orders.created",
		"subject": "order 7 €", "time": "2026-12-01T19:04:05Z", "datacontenttype": "application/json",
		"traceparent": e.Headers["traceparent"], "tenant": "acme", "data": map[string]any{"total": 12.0},
	}
	a, _ := json.Marshal(body)
	b, _ := json.Marshal(want)
	if string(a) != string(b) {
		t.Fatalf("value %s\nwant  %s", a, b)
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	base := Config{Brokers: []string{"localhost:9092"}}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Format = FormatCloudEvents }, "cloudevents.source: required"},
		{func(c *Config) { c.CloudEvents.Source = "/s" }, "cloudevents: set, but format is not cloudevents"},
		{func(c *Config) { c.Format = "avro" }, `format: "avro" must be herald or cloudevents`},
		{func(c *Config) {
			c.Format, c.CloudEvents = FormatCloudEvents, cloudevents.Config{Source: "/s", Mode: "x"}
		}, `cloudevents.mode: "x"`},
	} {
		cfg := base
		tc.edit(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}
