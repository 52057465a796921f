package rabbitmq_test

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// readCloudEvent decodes a delivery per the AMQP protocol binding with code
// independent of package cloudevents: structured when "the `content-type`
// message property field ... is prefixed with the CloudEvents media type
// `application/cloudevents` (matched case-insensitively)"
// (amqp-protocol-binding.md 3), else binary with datacontenttype from
// content-type (3.1.1) and every other attribute in a header prefixed
// "cloudEvents_" or "cloudEvents:" (3.1.3.1), which consumers "SHOULD
// understand" both.
func readCloudEvent(t *testing.T, d amqp.Delivery) (attrs map[string]string, data []byte) {
	t.Helper()
	attrs = map[string]string{}
	if strings.HasPrefix(strings.ToLower(d.ContentType), "application/cloudevents") {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(d.Body, &obj); err != nil {
			t.Fatalf("structured body: %v: %s", err, d.Body)
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
	if d.ContentType != "" {
		attrs["datacontenttype"] = d.ContentType
	}
	for name, v := range d.Headers {
		attr, ok := strings.CutPrefix(name, "cloudEvents_")
		if !ok {
			attr, ok = strings.CutPrefix(name, "cloudEvents:")
		}
		if !ok {
			continue
		}
		s, isString := v.(string)
		if !isString {
			t.Fatalf("header %s = %#v, want a string", name, v)
		}
		attrs[attr] = s
	}
	return attrs, d.Body
}

func cloudEventsConformance(t *testing.T, mode cloudevents.Mode) {
	u := brokerURL(t)
	b := newBroker(t, u)
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			b.queue(t, destination, nil)
			s, err := rabbitmq.New("conformance", rabbitmq.Config{URL: secret(u), Format: rabbitmq.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := rabbitmq.New("conformance", rabbitmq.Config{URL: secret("amqp://guest:guest@" + sinktest.ClosedAddr(t) + "/"), Format: rabbitmq.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, d := range b.messages(t, destination) {
				attrs, data := readCloudEvent(t, d)
				if attrs["id"] != d.MessageId {
					t.Fatalf("CloudEvent id %q, message_id %q", attrs["id"], d.MessageId)
				}
				out = append(out, sinktest.Received{ID: attrs["id"], Key: attrs["subject"], Destination: d.RoutingKey, Payload: data})
			}
			return out
		},
		// A routing key over AMQP's 255 bytes: refused before sending.
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event(destination+"."+strings.Repeat("x", 256), key, []byte(`{"refused":true}`))
		},
		// No queue is bound to this routing key: the broker returns it.
		RefusedByPeer: func(t *testing.T, destination, key string) sinks.Event {
			return sinktest.Event(destination+".unbound", key, []byte(`{"refused":true}`))
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

func ceEvent(queue string) sinks.Event {
	e := sinktest.Event(queue, "order 7 €", []byte(`{"total":12}`))
	e.Topic = "orders.created"
	e.CreatedAt = time.Date(2026, 12, 1, 19, 4, 5, 0, time.UTC)
	e.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tenant":      "acme",
		"x-tenant":    "left out: not an extension name",
	}
	return e
}

// stringHeaders returns d's headers, failing on a value that is not a
// string (the binding's canonical string form, an AMQP 0-9-1 longstr).
func stringHeaders(t *testing.T, d amqp.Delivery) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			t.Fatalf("header %s = %#v, want a string", k, v)
		}
		out[k] = s
	}
	return out
}

// TestCloudEventsBinaryMessage: the queued message carries exactly the AMQP
// binding's application properties as headers (amqp-protocol-binding.md
// 3.1.3.1: "`time` maps to `cloudEvents_time`", "`id` maps to
// `cloudEvents_id`", "`specversion` maps to `cloudEvents_specversion`"),
// values as canonical strings (3.1.3.2), datacontenttype as content_type
// and not as a header (3.1.1, 3.1.3), the payload as the body (3.1.2), and
// message_id, delivery_mode and timestamp as in the herald format.
func TestCloudEventsBinaryMessage(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test_ce"), nil)
	s := open(t, rabbitmq.Config{URL: secret(u), Format: rabbitmq.FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent(q)
	unkeyed := ceEvent(q)
	unkeyed.Key = ""
	publishOK(t, s, e, unkeyed)
	got := b.waitMessages(t, q, 2)
	want := map[string]string{
		"cloudEvents_specversion": "1.0",
		"cloudEvents_id":          e.ID,
		"cloudEvents_source":      "/shop/orders",
		"cloudEvents_type":        "orders.created",
		"cloudEvents_subject":     "order 7 €",
		"cloudEvents_time":        "2026-12-01T19:04:05Z",
		"cloudEvents_traceparent": e.Headers["traceparent"],
		"cloudEvents_tenant":      "acme",
	}
	d := got[0]
	if h := stringHeaders(t, d); !maps.Equal(h, want) {
		t.Fatalf("headers\n got %v\nwant %v", h, want)
	}
	if d.ContentType != "application/json" || string(d.Body) != `{"total":12}` {
		t.Fatalf("content_type %q body %s, want application/json and the payload", d.ContentType, d.Body)
	}
	if d.MessageId != e.ID || d.DeliveryMode != amqp.Persistent || !d.Timestamp.Equal(e.CreatedAt) {
		t.Fatalf("message_id %q delivery_mode %d timestamp %s, want %s, persistent, %s", d.MessageId, d.DeliveryMode, d.Timestamp, e.ID, e.CreatedAt)
	}
	if _, ok := got[1].Headers["cloudEvents_subject"]; ok {
		t.Fatalf("event without a key has cloudEvents_subject: %v", got[1].Headers)
	}

	// An extension whose prefixed name is over AMQP's 255 bytes: refused
	// unsent, naming the header.
	long := ceEvent(q)
	long.Headers[strings.Repeat("a", 250)] = "v"
	if errs := publish(t, s, long); !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), `"cloudEvents_aaaa`) {
		t.Fatalf("extension name over 255 bytes with its prefix: %v, want a permanent error naming it", errs[0])
	}
}

// TestCloudEventsStructuredMessage: the body is the JSON event format and
// content_type its media type (amqp-protocol-binding.md 3.2.1, 3.2.2), with
// no cloudEvents_ headers (3.2.3 makes them optional); a binary payload is
// data_base64; max_message_size counts the encoded body, not the payload.
func TestCloudEventsStructuredMessage(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	q := b.queue(t, uniqueName("herald_test_ce"), nil)
	cfg := rabbitmq.Config{URL: secret(u), Format: rabbitmq.FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}}
	s := open(t, cfg)
	e := ceEvent(q)
	bin := ceEvent(q)
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff, 'a'}
	publishOK(t, s, e, bin)
	got := b.waitMessages(t, q, 2)
	d := got[0]
	if d.ContentType != "application/cloudevents+json" || len(d.Headers) != 0 || d.MessageId != e.ID || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("content_type %q headers %v message_id %q delivery_mode %d", d.ContentType, d.Headers, d.MessageId, d.DeliveryMode)
	}
	var body map[string]any
	if err := json.Unmarshal(d.Body, &body); err != nil {
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
		t.Fatalf("body %s\nwant %s", x, y)
	}
	attrs, data := readCloudEvent(t, got[1])
	if string(data) != string(bin.Payload) || attrs["datacontenttype"] != "application/octet-stream" ||
		!strings.Contains(string(got[1].Body), `"data_base64"`) {
		t.Fatalf("binary payload: %s", got[1].Body)
	}

	cfg.MaxMessageSize = 100 // over the payload, under the encoded event
	small := open(t, cfg)
	if errs := publish(t, small, ceEvent(q)); !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "max_message_size") {
		t.Fatalf("event whose CloudEvent is over max_message_size: %v, want permanent naming max_message_size", errs[0])
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	u := secret("amqp://guest:guest@127.0.0.1:5672/")
	for _, tc := range []struct {
		cfg  rabbitmq.Config
		want string
	}{
		{rabbitmq.Config{URL: u, Format: rabbitmq.FormatCloudEvents}, "cloudevents.source: required"},
		{rabbitmq.Config{URL: u, Format: rabbitmq.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: "text", Source: "/s"}},
			`cloudevents.mode: "text" must be binary or structured`},
		{rabbitmq.Config{URL: u, CloudEvents: cloudevents.Config{Source: "/s"}}, "cloudevents: set, but format is not cloudevents"},
		{rabbitmq.Config{URL: u, Format: "json"}, `format: "json" must be herald or cloudevents`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
		if _, err := rabbitmq.New("x", tc.cfg, quiet); err == nil {
			t.Errorf("New accepted %+v", tc.cfg)
		}
	}
	ok := rabbitmq.Config{URL: u, Format: rabbitmq.FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/s"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid cloudevents config: %v", err)
	}
}
