package nats_test

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/natstest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// readCloudEvent decodes a message per the NATS protocol binding with code
// independent of package cloudevents: structured when "the `Content-Type`
// header of `application/cloudevents` is present (matched
// case-insensitively)" (nats-protocol-binding.md 3), else binary with every
// attribute in a ce- header, percent-decoded (3.1.3).
func readCloudEvent(t *testing.T, m natstest.Message) (attrs map[string]string, data []byte) {
	t.Helper()
	attrs = map[string]string{}
	if strings.HasPrefix(strings.ToLower(m.Header.Get("Content-Type")), "application/cloudevents") {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(m.Data, &obj); err != nil {
			t.Fatalf("structured payload: %v: %s", err, m.Data)
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
	for name, vs := range m.Header {
		attr, ok := strings.CutPrefix(strings.ToLower(name), "ce-")
		if !ok {
			continue
		}
		v, err := url.PathUnescape(vs[0])
		if err != nil {
			t.Fatalf("header %s = %q: %v", name, vs[0], err)
		}
		attrs[attr] = v
	}
	return attrs, m.Data
}

func cloudEventsConformance(t *testing.T, mode cloudevents.Mode) {
	url := natstest.URL(t)
	nc := natstest.Connect(t, url)
	var streams sync.Map // destination → *natstest.TestStream
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			streams.Store(destination, natstest.Stream(t, nc, func(c *jetstream.StreamConfig) {
				c.Subjects = []string{destination}
			}))
			s, err := nats.New("conformance", nats.Config{URL: url, Format: nats.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := nats.New("conformance", nats.Config{URL: "nats://" + sinktest.ClosedAddr(t), Format: nats.FormatCloudEvents,
				CloudEvents: cloudevents.Config{Mode: mode, Source: "/test"}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			v, ok := streams.Load(destination)
			if !ok {
				t.Fatalf("no stream for %s", destination)
			}
			var out []sinktest.Received
			for _, m := range v.(*natstest.TestStream).Messages(t) {
				attrs, data := readCloudEvent(t, m)
				if attrs["id"] != m.Header.Get(nats.HeaderMsgID) {
					t.Fatalf("CloudEvent id %q, Nats-Msg-Id %q", attrs["id"], m.Header.Get(nats.HeaderMsgID))
				}
				out = append(out, sinktest.Received{ID: attrs["id"], Key: attrs["subject"], Destination: m.Subject, Payload: data})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 2<<20) // over the server's max_payload
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

func ceEvent(subject string) sinks.Event {
	e := sinktest.Event(subject, "order 7 €", []byte(`{"total":12}`))
	e.Topic = "orders.created"
	e.CreatedAt = time.Date(2026, 12, 1, 19, 4, 5, 0, time.UTC)
	e.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tenant":      "acme",
		"x-tenant":    "left out: not an extension name",
	}
	return e
}

// headersOf returns m's headers as name → value, names as received.
func headersOf(m natstest.Message) map[string]string {
	out := map[string]string{}
	for k, vs := range m.Header {
		out[k] = strings.Join(vs, ",")
	}
	return out
}

// TestCloudEventsBinaryMessage: the stored message carries exactly the NATS
// binding's headers (nats-protocol-binding.md 3.1.3.1: "`time` maps to
// `ce-time`", "`id` maps to `ce-id`", "`specversion` maps to
// `ce-specversion`", "`datacontenttype` maps to `ce-datacontenttype`"),
// percent-encoded (3.1.3.2), plus Nats-Msg-Id, and the payload as the data
// (3.1.1); no Content-Type, which would mark a structured message.
func TestCloudEventsBinaryMessage(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url, Format: nats.FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent(str.Subject("a"))
	unkeyed := ceEvent(str.Subject("a"))
	unkeyed.Key = ""
	publishOK(t, s, e, unkeyed)
	msgs := str.Messages(t)
	if len(msgs) != 2 {
		t.Fatalf("stream holds %d messages, want 2", len(msgs))
	}
	want := map[string]string{
		"Nats-Msg-Id":        e.ID,
		"ce-specversion":     "1.0",
		"ce-id":              e.ID,
		"ce-source":          "/shop/orders",
		"ce-type":            "orders.created",
		"ce-subject":         "order%207%20%E2%82%AC",
		"ce-time":            "2026-12-01T19:04:05Z",
		"ce-datacontenttype": "application/json",
		"ce-traceparent":     e.Headers["traceparent"],
		"ce-tenant":          "acme",
	}
	if got := headersOf(msgs[0]); !maps.Equal(got, want) {
		t.Fatalf("headers\n got %v\nwant %v", got, want)
	}
	if string(msgs[0].Data) != `{"total":12}` {
		t.Fatalf("data %s, want the payload", msgs[0].Data)
	}
	if attrs, _ := readCloudEvent(t, msgs[0]); attrs["subject"] != e.Key {
		t.Fatalf("decoded subject %q, want %q", attrs["subject"], e.Key)
	}
	if _, ok := headersOf(msgs[1])["ce-subject"]; ok {
		t.Fatalf("event without a key has ce-subject: %v", msgs[1].Header)
	}
}

// TestCloudEventsStructuredMessage: the payload is the JSON event format
// ("the NATS message payload MUST be the JSON event format",
// nats-protocol-binding.md 3), marked by Content-Type
// application/cloudevents+json, with Nats-Msg-Id and no ce- headers; a
// binary payload is data_base64.
func TestCloudEventsStructuredMessage(t *testing.T) {
	t.Parallel()
	url := natstest.URL(t)
	str := natstest.Stream(t, natstest.Connect(t, url))
	s := open(t, nats.Config{URL: url, Format: nats.FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}})
	e := ceEvent(str.Subject("a"))
	bin := ceEvent(str.Subject("a"))
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff, 'a'}
	publishOK(t, s, e, bin)
	msgs := str.Messages(t)
	if len(msgs) != 2 {
		t.Fatalf("stream holds %d messages, want 2", len(msgs))
	}
	if got, want := headersOf(msgs[0]), map[string]string{"Nats-Msg-Id": e.ID, "Content-Type": "application/cloudevents+json"}; !maps.Equal(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	var body map[string]any
	if err := json.Unmarshal(msgs[0].Data, &body); err != nil {
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
		t.Fatalf("payload %s\nwant    %s", a, b)
	}
	attrs, data := readCloudEvent(t, msgs[1])
	if string(data) != string(bin.Payload) || attrs["datacontenttype"] != "application/octet-stream" ||
		!strings.Contains(string(msgs[1].Data), `"data_base64"`) {
		t.Fatalf("binary payload: %s", msgs[1].Data)
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  nats.Config
		want string
	}{
		{nats.Config{URL: "nats://x:4222", Format: nats.FormatCloudEvents}, "cloudevents.source: required"},
		{nats.Config{URL: "nats://x:4222", CloudEvents: cloudevents.Config{Source: "/s"}}, "cloudevents: set, but format is not cloudevents"},
		{nats.Config{URL: "nats://x:4222", Format: "json"}, `format: "json" must be herald or cloudevents`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}
