package cloudevents_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
)

func event() sinks.Event {
	return sinks.Event{
		ID: "0190a0b0-0000-7000-8000-000000000001", Topic: "orders.created", Key: "order-42",
		Payload: []byte(`{"total":12}`), ContentType: "application/json",
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "rojo=00f067aa0ba902b7",
			"tenant":      "acme",
			"x-tenant":    "dropped: not [a-z0-9]",
			"Region":      "dropped: upper case",
			"id":          "dropped: poses as the id attribute",
			"note":        "dropped: control\ncharacter",
		},
		CreatedAt: time.Date(2026, 12, 1, 19, 4, 5, 123456000, time.FixedZone("CET", 3600)),
	}
}

// TestAttributes checks the mapping of an event onto the context
// attributes, named as cloudevents/spec.md names them ("#### id",
// "#### source", "#### specversion", "#### type", "#### datacontenttype",
// "#### subject", "#### time") and as extensions/distributed-tracing.md
// names its two ("### traceparent", "### tracestate"); other extension
// names must "consist of lower-case letters [a-z] or digits [0-9]"
// (spec.md, Attribute Naming Convention).
func TestAttributes(t *testing.T) {
	t.Parallel()
	got := cloudevents.Attributes(event(), "/shop/orders")
	want := []cloudevents.Attribute{
		{"specversion", "1.0"},
		{"id", "0190a0b0-0000-7000-8000-000000000001"},
		{"source", "/shop/orders"},
		{"type", "orders.created"},
		{"subject", "order-42"},
		{"time", "2026-12-01T18:04:05.123456Z"},
		{"datacontenttype", "application/json"},
		{"tenant", "acme"},
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"tracestate", "rojo=00f067aa0ba902b7"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Attributes =\n%v\nwant\n%v", got, want)
	}
	if _, err := time.Parse(time.RFC3339, got[5].Value); err != nil {
		t.Fatalf("time %q is not RFC 3339: %v", got[5].Value, err)
	}

	e := event()
	e.Key, e.Headers = "", nil
	for _, a := range cloudevents.Attributes(e, "/s") {
		if a.Name == "subject" {
			t.Fatalf("event without a key: subject = %q, want no subject attribute", a.Value)
		}
	}
}

// TestBindingHeaderNames checks each binding's header names against the
// examples its spec text gives ("`time` maps to `ce-time`"), read from
// testdata excerpts of the spec files.
func TestBindingHeaderNames(t *testing.T) {
	t.Parallel()
	maps := regexp.MustCompile("`([a-z]+)` maps to `([^`]+)`")
	for file, b := range map[string]cloudevents.Binding{
		"testdata/http-names.txt":  cloudevents.HTTP,
		"testdata/kafka-names.txt": cloudevents.Kafka,
		"testdata/nats-names.txt":  cloudevents.NATS,
		"testdata/amqp-names.txt":  cloudevents.AMQP,
		// Google's Pub/Sub binding, 3.1.3.1 (not in cloudevents/spec).
		"testdata/pubsub-names.txt": cloudevents.PubSub,
	} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		headers := map[string]string{}
		for _, h := range b.Headers(cloudevents.Attributes(event(), "/shop/orders")) {
			headers[h.Name] = h.Value
		}
		checked := 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			m := maps.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			checked++
			if _, ok := headers[m[2]]; !ok {
				t.Errorf("%s: %s must map to header %s; headers are %v", file, m[1], m[2], headers)
			}
		}
		f.Close()
		if checked < 3 {
			t.Fatalf("%s: %d mapping examples found, want at least 3", file, checked)
		}
	}
}

// TestMQTTUserPropertyNames checks the MQTT binding against its text:
// "CloudEvents attribute names MUST be used unchanged in each mapped User
// Property" (mqtt-protocol-binding.md 3.1.3.1), with the names of the
// example's User Properties block (3.1.4). The example also lists
// datacontenttype there, but 3.1.1 says the Content Type property "MUST be
// mapped directly to the CloudEvents datacontenttype attribute" and 3.1.3
// maps "all other" attributes to user properties: the normative text wins,
// and TestBindingContentType checks it.
func TestMQTTUserPropertyNames(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("testdata/mqtt-names.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "attribute names MUST be used unchanged") {
		t.Fatal("testdata/mqtt-names.txt no longer holds section 3.1.3.1")
	}
	props := map[string]string{}
	for _, h := range cloudevents.MQTT.Headers(cloudevents.Attributes(event(), "/shop/orders")) {
		props[h.Name] = h.Value
	}
	_, example, _ := strings.Cut(string(text), "User Properties")
	checked := 0
	for _, m := range regexp.MustCompile(`(?m)^([a-z]+): `).FindAllStringSubmatch(example, -1) {
		if m[1] == "datacontenttype" {
			continue
		}
		checked++
		if _, ok := props[m[1]]; !ok {
			t.Errorf("attribute %s must be user property %s; properties are %v", m[1], m[1], props)
		}
	}
	if checked < 5 {
		t.Fatalf("%d example user properties found, want at least 5", checked)
	}
}

// TestBindingContentType checks where datacontenttype goes: HTTP
// "Content-Type header value corresponds to ... the CloudEvents
// datacontenttype attribute. Note that a ce-datacontenttype HTTP header MUST
// NOT also be present" (http-protocol-binding.md 3.1.1); Kafka "the header
// content-type property MUST be mapped directly to the CloudEvents
// datacontenttype attribute" (kafka-protocol-binding.md 3.2.1); NATS maps
// "`datacontenttype` maps to `ce-datacontenttype`" (nats-protocol-binding.md
// 3.1.3.1); AMQP "the AMQP `content-type` property field value maps
// directly to the CloudEvents `datacontenttype` attribute"
// (amqp-protocol-binding.md 3.1.1) and "All CloudEvents attributes with
// exception of `datacontenttype`" go to application properties (3.1.3);
// MQTT "the MQTT PUBLISH message's Content Type property MUST be mapped
// directly to the CloudEvents datacontenttype attribute"
// (mqtt-protocol-binding.md 3.1.1).
func TestBindingContentType(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		b              cloudevents.Binding
		header, absent string
	}{
		"http":  {cloudevents.HTTP, "Content-Type", "ce-datacontenttype"},
		"kafka": {cloudevents.Kafka, "content-type", "ce_datacontenttype"},
		"nats":  {cloudevents.NATS, "ce-datacontenttype", "Content-Type"},
		"amqp":  {cloudevents.AMQP, "content-type", "cloudEvents_datacontenttype"},
		"mqtt":  {cloudevents.MQTT, "Content Type", "datacontenttype"},
		// Pub/Sub binding 3.1.1: the content-type attribute "MUST be used
		// as the CloudEvents datacontenttype attribute".
		"pubsub": {cloudevents.PubSub, "content-type", "ce-datacontenttype"},
	} {
		found := false
		for _, h := range tc.b.Headers(cloudevents.Attributes(event(), "/s")) {
			found = found || h.Name == tc.header && h.Value == "application/json"
			if h.Name == tc.absent {
				t.Errorf("%s: header %s present, must not be", name, tc.absent)
			}
		}
		if !found {
			t.Errorf("%s: no %s: application/json header", name, tc.header)
		}
	}
}

// TestPubSubTextMatches checks what the Pub/Sub binding's excerpt states
// in prose: the content-type attribute carries datacontenttype in the
// binary mode (3.1.1), and a structured message's content-type is the
// JSON format's media type as 3.2.1 writes it (MediaTypePubSub).
func TestPubSubTextMatches(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("testdata/pubsub-names.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"the [Pub/Sub Attribute `" + cloudevents.PubSub.ContentTypeHeader + "`][content-type], if\npresent, MUST be used as the CloudEvents `datacontenttype` attribute",
		`"` + cloudevents.PubSub.ContentTypeHeader + `": "` + cloudevents.MediaTypePubSub + `"`,
		"each attribute name MUST\nbe prefixed with \"" + cloudevents.PubSub.Prefix + "\"",
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("testdata/pubsub-names.txt does not say %q", want)
		}
	}
}

// TestPercentEncode uses the example of http-protocol-binding.md and
// nats-protocol-binding.md 3.1.3.2: "Euro € 😀" SHOULD be encoded as
// "Euro%20%E2%82%AC%20%F0%9F%98%80"; space, double quote and percent MUST be
// encoded too.
func TestPercentEncode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Euro € 😀":     "Euro%20%E2%82%AC%20%F0%9F%98%80",
		`a "b" 100%`:   "a%20%22b%22%20100%25",
		"/shop/orders": "/shop/orders",
		"":             "",
		" x":           "%20x",
	} {
		if got := cloudevents.PercentEncode(in); got != want {
			t.Errorf("PercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
	for _, h := range cloudevents.HTTP.Headers(cloudevents.Attributes(sinks.Event{Key: "Euro €", ContentType: "text/plain"}, "/s")) {
		if h.Name == "ce-subject" && h.Value != "Euro%20%E2%82%AC" {
			t.Errorf("HTTP ce-subject = %q, want percent-encoded", h.Value)
		}
	}
	// AMQP and MQTT carry strings as UTF-8: "the canonical string form"
	// (amqp-protocol-binding.md 3.1.3.2), "the respective CloudEvents
	// attribute type's canonical string representation"
	// (mqtt-protocol-binding.md 3.1.3.2).
	for name, b := range map[string]cloudevents.Binding{"ce_subject": cloudevents.Kafka,
		"cloudEvents_subject": cloudevents.AMQP, "subject": cloudevents.MQTT} {
		found := false
		for _, h := range b.Headers(cloudevents.Attributes(sinks.Event{Key: "Euro €", ContentType: "text/plain"}, "/s")) {
			if h.Name == name {
				found = true
				if h.Value != "Euro €" {
					t.Errorf("%s = %q, want the UTF-8 value as is", name, h.Value)
				}
			}
		}
		if !found {
			t.Errorf("no %s header", name)
		}
	}
}

// TestStructured checks the JSON event format (formats/json-format.md): the
// attributes as members, a JSON payload under "data" as JSON, any other
// under "data_base64" ("use the member name `data_base64`").
func TestStructured(t *testing.T) {
	t.Parallel()
	body, err := cloudevents.Structured(event(), "/shop/orders")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	want := map[string]any{
		"specversion": "1.0", "id": "0190a0b0-0000-7000-8000-000000000001", "source": "/shop/orders",
		"type": "orders.created", "subject": "order-42", "time": "2026-12-01T18:04:05.123456Z",
		"datacontenttype": "application/json", "tenant": "acme",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "rojo=00f067aa0ba902b7",
		"data": map[string]any{"total": float64(12)},
	}
	if !jsonEqual(got, want) {
		t.Fatalf("structured body = %s\nwant %v", body, want)
	}

	e := event()
	e.ContentType, e.Payload = "application/octet-stream", []byte{0, 1, 0xff}
	body, err = cloudevents.Structured(e, "/s")
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got["data_base64"] != base64.StdEncoding.EncodeToString(e.Payload) || got["data"] != nil {
		t.Fatalf("binary payload: %s, want data_base64 %q and no data", body, base64.StdEncoding.EncodeToString(e.Payload))
	}

	e.ContentType, e.Payload = "application/json", []byte(`{"total":`)
	if _, err := cloudevents.Structured(e, "/s"); !sinks.IsPermanent(err) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("invalid JSON payload: %v, want a permanent error saying so", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  cloudevents.Config
		want string
	}{
		{cloudevents.Config{Source: "/s"}, ""},
		{cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/s"}, ""},
		{cloudevents.Config{}, "cloudevents.source: required"},
		{cloudevents.Config{Mode: "text", Source: "/s"}, `cloudevents.mode: "text" must be binary or structured`},
		{cloudevents.Config{Source: "/a\nb"}, "cloudevents.source: must be UTF-8 without control characters"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestConfigValidateFormat(t *testing.T) {
	t.Parallel()
	block := cloudevents.Config{Source: "/s"}
	for _, tc := range []struct {
		format string
		cfg    cloudevents.Config
		want   string
	}{
		{"", cloudevents.Config{}, ""},
		{"herald", cloudevents.Config{}, ""},
		{"cloudevents", block, ""},
		{"herald", block, "cloudevents: set, but format is not cloudevents"},
		{"", block, "cloudevents: set, but format is not cloudevents"},
		{"cloudevents", cloudevents.Config{}, "cloudevents.source: required"},
		{"avro", cloudevents.Config{}, `format: "avro" must be herald or cloudevents`},
	} {
		err := tc.cfg.ValidateFormat(tc.format)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("format %q, %+v: ValidateFormat() = %v, want %q", tc.format, tc.cfg, err, tc.want)
		}
	}
}

func jsonEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
