package webhook

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// wireCloudEvent is a CloudEvent as a consumer reads it from a request,
// decoded with code independent of package cloudevents.
type wireCloudEvent struct {
	structured bool
	attrs      map[string]string // every attribute but data, by name
	data       []byte
}

// readCloudEvent decodes r per the HTTP protocol binding: structured when
// Content-Type is application/cloudevents+json (3.2.1), else binary, where
// "Content-Type header value corresponds to ... the CloudEvents
// datacontenttype attribute" (3.1.1) and the other attributes are ce-
// headers, percent-decoded (3.1.3).
func readCloudEvent(t *testing.T, r request) wireCloudEvent {
	t.Helper()
	ce := wireCloudEvent{attrs: map[string]string{}}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/cloudevents+json") {
		ce.structured = true
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &obj); err != nil {
			t.Fatalf("structured body: %v: %s", err, r.Body)
		}
		for k, v := range obj {
			switch k {
			case "data":
				ce.data = v
			case "data_base64":
				var s string
				if err := json.Unmarshal(v, &s); err != nil {
					t.Fatalf("data_base64: %v", err)
				}
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					t.Fatalf("data_base64: %v", err)
				}
				ce.data = b
			default:
				var s string
				if err := json.Unmarshal(v, &s); err != nil {
					t.Fatalf("attribute %s is not a string: %s", k, v)
				}
				ce.attrs[k] = s
			}
		}
		return ce
	}
	ce.data = r.Body
	ce.attrs["datacontenttype"] = r.Header.Get("Content-Type")
	for name, vs := range r.Header {
		attr, ok := strings.CutPrefix(strings.ToLower(name), "ce-")
		if !ok {
			continue
		}
		v, err := url.PathUnescape(vs[0])
		if err != nil {
			t.Fatalf("header %s = %q: %v", name, vs[0], err)
		}
		ce.attrs[attr] = v
	}
	return ce
}

func ceEvent() sinks.Event {
	e := sinktest.Event("ignored", "order 42 €", []byte(`{"total":12}`))
	e.Topic = "orders.created"
	e.CreatedAt = time.Date(2026, 12, 1, 19, 4, 5, 0, time.UTC)
	e.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "rojo=00f067aa0ba902b7",
		"tenant":      "acme",
		"x-tenant":    "left out: not an extension name",
	}
	return e
}

// TestCloudEventsBinary: the request carries exactly the HTTP binding's
// headers (http-protocol-binding.md 3.1.3.1: "`time` maps to `ce-time`",
// "`id` maps to `ce-id`", "`specversion` maps to `ce-specversion`"; 3.1.1:
// Content-Type is datacontenttype and "a `ce-datacontenttype` HTTP header
// MUST NOT also be present"), values percent-encoded (3.1.3.2), the payload
// as the body (3.1.2), and still the Standard Webhooks signature.
func TestCloudEventsBinary(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	secret := newSecret(t)
	s := newSink(t, Config{URL: rc.srv.URL, Secret: secret, Format: FormatCloudEvents,
		CloudEvents: cloudevents.Config{Source: "/shop/orders"}})
	e := ceEvent()
	if err := publish(t, s, e)[0]; err != nil {
		t.Fatal(err)
	}
	r := rc.requests()[0]
	gotCE := map[string]string{}
	for name, vs := range r.Header {
		if strings.HasPrefix(strings.ToLower(name), "ce-") {
			gotCE[strings.ToLower(name)] = strings.Join(vs, ",")
		}
	}
	want := map[string]string{
		"ce-specversion": "1.0",
		"ce-id":          e.ID,
		"ce-source":      "/shop/orders",
		"ce-type":        "orders.created",
		"ce-subject":     "order%2042%20%E2%82%AC",
		"ce-time":        "2026-12-01T19:04:05Z",
		"ce-traceparent": e.Headers["traceparent"],
		"ce-tracestate":  e.Headers["tracestate"],
		"ce-tenant":      "acme",
	}
	if !maps.Equal(gotCE, want) {
		t.Fatalf("ce- headers =\n%v\nwant\n%v", gotCE, want)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q, want the datacontenttype application/json", ct)
	}
	if string(r.Body) != `{"total":12}` {
		t.Fatalf("body = %s, want the payload", r.Body)
	}
	// distributed-tracing.md: the extension's attributes travel as ce-
	// headers next to the protocol's own traceparent.
	if r.Header.Get("Traceparent") != e.Headers["traceparent"] {
		t.Fatalf("traceparent = %q, want it forwarded as before", r.Header.Get("Traceparent"))
	}
	if verifyIndependently(t, secret, r.Header, r.Body) != 1 || r.Header.Get("Webhook-Id") != e.ID {
		t.Fatalf("request not signed per Standard Webhooks: %v", r.Header)
	}
	if got := readCloudEvent(t, r).attrs["subject"]; got != e.Key {
		t.Fatalf("decoded subject = %q, want %q", got, e.Key)
	}

	e = ceEvent()
	e.Key = ""
	if err := publish(t, s, e)[0]; err != nil {
		t.Fatal(err)
	}
	if v, ok := rc.requests()[1].Header["Ce-Subject"]; ok {
		t.Fatalf("event without a key sent ce-subject %q", v)
	}
}

// TestCloudEventsStructured: the body is the JSON event format with
// Content-Type application/cloudevents+json (http-protocol-binding.md 3.2.1,
// json-format.md: "MUST use the media type `application/cloudevents+json`"),
// JSON data as JSON, other data as data_base64; no ce- headers.
func TestCloudEventsStructured(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.srv.URL, Format: FormatCloudEvents,
		CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/shop/orders"}})
	e := ceEvent()
	bin := ceEvent()
	bin.ContentType, bin.Payload = "application/octet-stream", []byte{0, 0xff, 'a'}
	for _, err := range publish(t, s, e, bin) {
		if err != nil {
			t.Fatal(err)
		}
	}
	reqs := rc.requests()
	r := reqs[0]
	if ct := r.Header.Get("Content-Type"); ct != "application/cloudevents+json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	for name := range r.Header {
		if strings.HasPrefix(strings.ToLower(name), "ce-") {
			t.Fatalf("structured request has header %s", name)
		}
	}
	var got map[string]any
	if err := json.Unmarshal(r.Body, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": e.ID, "source": "/shop/orders", "type": "orders.created",
		"subject": "order 42 €", "time": "2026-12-01T19:04:05Z", "datacontenttype": "application/json",
		"traceparent": e.Headers["traceparent"], "tracestate": e.Headers["tracestate"], "tenant": "acme",
		"data": map[string]any{"total": 12.0},
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	if string(a) != string(b) {
		t.Fatalf("body = %s\nwant %s", a, b)
	}
	ce := readCloudEvent(t, reqs[1])
	if string(ce.data) != string(bin.Payload) || ce.attrs["datacontenttype"] != "application/octet-stream" {
		t.Fatalf("binary payload: %q %v, want data_base64 of %q", ce.data, ce.attrs, bin.Payload)
	}
	if !strings.Contains(string(reqs[1].Body), `"data_base64":"`+base64.StdEncoding.EncodeToString(bin.Payload)+`"`) {
		t.Fatalf("binary payload body %s has no data_base64", reqs[1].Body)
	}
}

func TestCloudEventsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "http://x", Format: FormatCloudEvents}, "cloudevents.source: required"},
		{Config{URL: "http://x", Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/s", Mode: "json"}}, `cloudevents.mode: "json" must be binary or structured`},
		{Config{URL: "http://x", CloudEvents: cloudevents.Config{Source: "/s"}}, `cloudevents: set, but format is "envelope"`},
		{Config{URL: "http://x", Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/s"},
			Headers: map[string]sinkconfig.Secret{"Ce-Source": "x"}}, "headers.Ce-Source: ce- headers carry CloudEvents attributes"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{URL: "http://x", Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/s"}}).Validate(); err != nil {
		t.Fatal(err)
	}
}
