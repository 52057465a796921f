// Package cloudevents turns a sinks.Event into a CloudEvent (CloudEvents
// 1.0, https://github.com/cloudevents/spec): its context attributes, for a
// sink's binary content mode, and its JSON event format body, for the
// structured content mode. Each sink maps the attributes onto its protocol
// as that protocol's binding says (the header prefix, where datacontenttype
// goes, whether values are percent-encoded): a Binding, of which HTTP,
// Kafka, NATS, AMQP, MQTT and Google Cloud Pub/Sub are declared here.
//
// The mapping from an event:
//
//	specversion      "1.0"
//	id               the event id
//	source           the sink's cloudevents.source setting
//	type             the event's topic
//	subject          the event's key; absent when the event has none
//	time             created_at, RFC 3339 in UTC
//	datacontenttype  the event's content type
//	traceparent,     the event's traceparent and tracestate headers, as the
//	tracestate       distributed tracing extension defines them
//	<name>           every other event header whose name is a valid
//	                 extension attribute name: lowercase letters a-z and
//	                 digits only, and not one of the spec's own attribute
//	                 names
//
// Other event headers ("x-tenant", "Tenant") are left out: an attribute
// name outside [a-z0-9] is invalid CloudEvents, and renaming it would
// invent a name consumers cannot predict. Headers whose value holds a
// control character are left out too: the spec's String type excludes
// them.
//
// The hand-written mapping stands in for github.com/cloudevents/sdk-go/v2:
// it is a dozen attributes, while the SDK would bring its own HTTP, Kafka,
// NATS, AMQP and MQTT clients next to the ones the sinks already use.
package cloudevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Mode is a CloudEvents content mode.
type Mode string

const (
	// ModeBinary carries the attributes in the protocol's headers and the
	// payload as the message body, unchanged. The default.
	ModeBinary Mode = "binary"
	// ModeStructured carries the whole event, attributes and payload, as a
	// JSON event format body (MediaType).
	ModeStructured Mode = "structured"
)

// SpecVersion is the CloudEvents version Herald emits.
const SpecVersion = "1.0"

// MediaType is the content type of a structured-mode body (JSON event
// format). The Kafka binding adds "; charset=UTF-8" (MediaTypeKafka).
const MediaType = "application/cloudevents+json"

// MediaTypePubSub is the content-type attribute of a structured-mode
// Pub/Sub message, as the Pub/Sub binding's 3.2.1 example writes it.
const MediaTypePubSub = MediaType + "; charset=UTF-8"

// MediaTypeKafka is the content-type header of a structured-mode Kafka
// record (bindings/kafka-protocol-binding.md, 3.3.1).
const MediaTypeKafka = MediaType + "; charset=UTF-8"

// Binding is how a protocol binding carries attributes as headers in the
// binary mode. A sink with a new protocol declares its own from the
// binding's "Header Names" section.
type Binding struct {
	// Prefix starts the header name of an attribute: ce- for HTTP.
	Prefix string
	// ContentTypeHeader, when set, is the header carrying datacontenttype
	// in place of a prefixed one (HTTP's Content-Type, Kafka's
	// content-type). Where the protocol has a content type property
	// rather than a header (AMQP, MQTT 5), it is that property's name, and
	// the sink puts the value there.
	ContentTypeHeader string
	// PercentEncode encodes values as PercentEncode does, for bindings
	// whose headers are printable ASCII only.
	PercentEncode bool
}

// The bindings of Herald's sinks.
var (
	// HTTP is bindings/http-protocol-binding.md, 3.1.1 and 3.1.3: ce-
	// headers, datacontenttype as Content-Type, percent-encoded values.
	HTTP = Binding{Prefix: "ce-", ContentTypeHeader: "Content-Type", PercentEncode: true}
	// Kafka is bindings/kafka-protocol-binding.md, 3.2.1 and 3.2.3: ce_
	// headers, datacontenttype as content-type, UTF-8 values as they are.
	Kafka = Binding{Prefix: "ce_", ContentTypeHeader: "content-type"}
	// NATS is bindings/nats-protocol-binding.md, 3.1.3: ce- headers for
	// every attribute, datacontenttype included, percent-encoded values.
	NATS = Binding{Prefix: "ce-", PercentEncode: true}
	// AMQP is bindings/amqp-protocol-binding.md, 3.1.1 and 3.1.3:
	// application properties prefixed cloudEvents_ (the separator the spec
	// prefers over ':', as JMS 2.0 selectors cannot name the other),
	// datacontenttype as the content-type message property, values as
	// canonical strings. The binding is written for AMQP 1.0; the
	// RabbitMQ sink speaks AMQP 0-9-1 and puts application properties in
	// the message headers and content-type in the content_type property,
	// the pairs RabbitMQ's own conversion between the two protocols uses
	// (rabbitmq.com/docs/conversions). The CloudEvents Java SDK's Spring
	// AMQP module also writes cloudEvents_ headers on AMQP 0-9-1.
	AMQP = Binding{Prefix: "cloudEvents_", ContentTypeHeader: "content-type"}
	// MQTT is bindings/mqtt-protocol-binding.md, 3.1.1 and 3.1.3 (MQTT 5):
	// user properties named as the attributes, unprefixed, datacontenttype
	// as the PUBLISH packet's Content Type property, values as canonical
	// strings.
	MQTT = Binding{ContentTypeHeader: "Content Type"}
	// PubSub is the Google Cloud Pub/Sub protocol binding, 3.1.1 and
	// 3.1.3: ce- attributes, datacontenttype as the content-type
	// attribute, values as canonical strings (Pub/Sub attributes are
	// UTF-8, so nothing is percent-encoded). The CloudEvents spec has no
	// Pub/Sub binding of its own; cloudevents/proprietary-specs.md lists
	// Google's, github.com/googleapis/google-cloudevents
	// docs/spec/pubsub.md (a working draft for CloudEvents 1.0), which
	// this follows. Its binary-mode example also shows a
	// ce-datacontenttype attribute, but 3.1.1 says the content-type
	// attribute "MUST be used as the CloudEvents datacontenttype", so the
	// value goes there only, as the MQTT binding's does. The CloudEvents
	// Go SDK's Pub/Sub protocol (sdk-go protocol/pubsub/v2) departs from
	// the text: it writes and reads "Content-Type", and Pub/Sub attribute
	// names are case-sensitive, so an SDK consumer loses datacontenttype
	// of a binary message and does not recognise a structured one.
	PubSub = Binding{Prefix: "ce-", ContentTypeHeader: "content-type"}
)

// Headers returns the binary-mode headers of attrs, in their order.
func (b Binding) Headers(attrs []Attribute) []Attribute {
	out := make([]Attribute, len(attrs))
	for i, a := range attrs {
		name, v := b.Prefix+a.Name, a.Value
		if a.Name == AttrDataContentType && b.ContentTypeHeader != "" {
			name = b.ContentTypeHeader
		}
		if b.PercentEncode {
			v = PercentEncode(v)
		}
		out[i] = Attribute{name, v}
	}
	return out
}

// Names of the attributes the mapping sets.
const (
	AttrSpecVersion     = "specversion"
	AttrID              = "id"
	AttrSource          = "source"
	AttrType            = "type"
	AttrSubject         = "subject"
	AttrTime            = "time"
	AttrDataContentType = "datacontenttype"
	AttrTraceParent     = "traceparent"
	AttrTraceState      = "tracestate"
)

// reserved are the names the spec and the JSON format give a meaning: an
// event header of one of these names must not pose as that attribute.
var reserved = map[string]bool{
	AttrSpecVersion: true, AttrID: true, AttrSource: true, AttrType: true, AttrSubject: true,
	AttrTime: true, AttrDataContentType: true, "dataschema": true, "data": true, "data_base64": true,
}

// Config is a sink's `cloudevents:` settings, used when its format is
// cloudevents.
type Config struct {
	// Mode is binary or structured. Defaults to binary.
	Mode Mode `yaml:"mode"`
	// Source is the source attribute of every event (a URI-reference
	// naming the producer, such as "/orders-service" or
	// "https://shop.example.com/orders"). Required.
	Source string `yaml:"source"`
}

// Validate reports the first problem, naming the key under cloudevents.
func (c Config) Validate() error {
	switch c.Mode {
	case "", ModeBinary, ModeStructured:
	default:
		return fmt.Errorf("cloudevents.mode: %q must be binary or structured", c.Mode)
	}
	if c.Source == "" {
		return errors.New("cloudevents.source: required with format: cloudevents (a URI-reference naming the producer, such as /orders-service)")
	}
	if !validString(c.Source) {
		return errors.New("cloudevents.source: must be UTF-8 without control characters")
	}
	return nil
}

// ValidateFormat validates the format setting of a sink whose formats are
// herald (the default, also "") and cloudevents, with c its cloudevents
// block: the block is refused unless the format is cloudevents, and
// validated when it is.
func (c Config) ValidateFormat(format string) error {
	switch format {
	case "", "herald":
		if c != (Config{}) {
			return errors.New("cloudevents: set, but format is not cloudevents (set format: cloudevents)")
		}
		return nil
	case "cloudevents":
		return c.Validate()
	default:
		return fmt.Errorf("format: %q must be herald or cloudevents", format)
	}
}

// Structured reports whether c selects the structured mode.
func (c Config) Structured() bool { return c.Mode == ModeStructured }

// Attribute is one context attribute with its canonical string value.
type Attribute struct {
	Name, Value string
}

// Attributes returns e's context attributes, the required ones first
// (specversion, id, source, type), then subject, time, datacontenttype and
// the extensions in name order. The order is fixed so that messages are
// reproducible.
func Attributes(e sinks.Event, source string) []Attribute {
	attrs := make([]Attribute, 0, 7+len(e.Headers))
	attrs = append(attrs,
		Attribute{AttrSpecVersion, SpecVersion},
		Attribute{AttrID, e.ID},
		Attribute{AttrSource, source},
		Attribute{AttrType, e.Topic},
	)
	if e.Key != "" {
		attrs = append(attrs, Attribute{AttrSubject, e.Key})
	}
	attrs = append(attrs,
		Attribute{AttrTime, e.CreatedAt.UTC().Format(time.RFC3339Nano)},
		Attribute{AttrDataContentType, e.ContentType},
	)
	start := len(attrs)
	for name, v := range e.Headers {
		if validExtensionName(name) && validString(v) {
			attrs = append(attrs, Attribute{name, v})
		}
	}
	slices.SortFunc(attrs[start:], func(a, b Attribute) int { return strings.Compare(a.Name, b.Name) })
	return attrs
}

// validExtensionName reports whether name can be an extension attribute:
// lowercase a-z and 0-9 (spec.md, "Attribute Naming Convention"), and not
// a name the spec defines.
func validExtensionName(name string) bool {
	if name == "" || reserved[name] {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// validString reports whether s is a CloudEvents String: UTF-8 without
// the control characters U+0000-U+001F and U+007F-U+009F (spec.md, "Type
// System").
func validString(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			return false
		}
	}
	return true
}

// Structured returns e as a JSON event format body (formats/json-format.md):
// the attributes as members, the payload under "data" when the content
// type is JSON, else base64 under "data_base64". A JSON content type with a
// payload that is not JSON is a permanent error.
func Structured(e sinks.Event, source string) ([]byte, error) {
	attrs := Attributes(e, source)
	obj := make(map[string]any, len(attrs)+1)
	for _, a := range attrs {
		obj[a.Name] = a.Value
	}
	if sinks.IsJSON(e.ContentType) {
		if err := sinkconfig.CheckJSON(e.Payload); err != nil {
			return nil, sinks.Permanent(fmt.Errorf("%w, although its content type is %s", err, e.ContentType))
		}
		obj["data"] = json.RawMessage(e.Payload)
	} else {
		// encoding/json writes []byte as standard base64, which is what
		// data_base64 holds (RFC 4648, formats/json-format.md 3.1).
		obj["data_base64"] = append([]byte{}, e.Payload...)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, sinks.Permanent(fmt.Errorf("encoding the CloudEvent: %w", err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// PercentEncode encodes an attribute value for an HTTP or NATS header
// (bindings/http-protocol-binding.md 3.1.3.2, nats-protocol-binding.md
// 3.1.3.2): space, double quote, percent and every byte outside printable
// ASCII become %XY, upper-case hex. Values without them come back as they
// are.
func PercentEncode(v string) string {
	const hex = "0123456789ABCDEF"
	i := strings.IndexFunc(v, needsEncoding)
	if i < 0 {
		return v
	}
	var b strings.Builder
	b.Grow(len(v) + 8)
	b.WriteString(v[:i])
	// Byte by byte: a character outside ASCII is encoded as its UTF-8
	// bytes, each of which needs encoding.
	for ; i < len(v); i++ {
		if c := v[i]; c < utf8.RuneSelf && !needsEncoding(rune(c)) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[v[i]>>4])
		b.WriteByte(hex[v[i]&0xf])
	}
	return b.String()
}

// needsEncoding reports whether r must be percent-encoded: space, double
// quote, percent, or outside printable ASCII (U+0021-U+007E).
func needsEncoding(r rune) bool {
	return r <= ' ' || r > '~' || r == '"' || r == '%'
}
