package mqtt

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/eclipse/paho.golang/paho"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
)

// User property names the sink sets on every message, next to the event's
// own headers (which keep their names; an event header with one of these
// names, in any case, is dropped for the sink's value).
const (
	// PropertyID carries the event id, the consumer's dedupe key.
	PropertyID = "Herald-Id"
	// PropertyTopic carries the event's topic.
	PropertyTopic = "Herald-Topic"
	// PropertyKey carries the event's ordering key; absent when it is empty.
	PropertyKey = "Herald-Key"
)

// payloadFormatUTF8 is the MQTT 5 payload format indicator for UTF-8 text.
var payloadFormatUTF8 byte = 1

// encode builds the QoS 1 PUBLISH for e in the configured format. A
// message that can never be published (a topic that is not a publishable
// topic name, a header or attribute that is not UTF-8, more bytes than the
// broker's maximum packet size when it announced one, a JSON content type
// with a payload that is not JSON in the structured CloudEvents mode) is a
// permanent error.
func encode(e sinks.Event, cfg Config, maxPacket uint32) (*paho.Publish, error) {
	if err := checkTopic(e.Destination); err != nil {
		return nil, sinks.Permanent(err)
	}
	var props *paho.PublishProperties
	var payload []byte
	var err error
	if cfg.Format == FormatCloudEvents {
		props, payload, err = encodeCloudEvent(e, cfg.CloudEvents)
	} else {
		props, payload, err = encodeHerald(e)
	}
	if err != nil {
		return nil, err
	}
	if sinks.IsJSON(props.ContentType) {
		// JSON is UTF-8 text (RFC 8259), and so is a structured
		// CloudEvent (application/cloudevents+json); the indicator lets
		// consumers and the broker know, and a broker that validates it
		// refuses a payload that is not (PUBACK 0x99, permanent).
		props.PayloadFormat = &payloadFormatUTF8
	}
	p := &paho.Publish{QoS: 1, Retain: cfg.Retain, Topic: e.Destination, Properties: props, Payload: payload}
	if maxPacket > 0 {
		var n countingWriter
		if _, err := p.Packet().WriteTo(&n); err != nil {
			return nil, fmt.Errorf("sizing the message: %w", err)
		}
		if n > countingWriter(maxPacket) {
			return nil, fmt.Errorf("the broker's maximum packet size: %w", sinks.TooLarge(int(n), int(maxPacket)))
		}
	}
	return p, nil
}

// encodeHerald is the herald format: the payload byte for byte, metadata
// in properties.
func encodeHerald(e sinks.Event) (*paho.PublishProperties, []byte, error) {
	props := &paho.PublishProperties{ContentType: e.ContentType}
	props.User = make(paho.UserProperties, 0, len(e.Headers)+3)
	props.User = append(props.User, paho.UserProperty{Key: PropertyID, Value: e.ID},
		paho.UserProperty{Key: PropertyTopic, Value: e.Topic})
	if e.Key != "" {
		props.User = append(props.User, paho.UserProperty{Key: PropertyKey, Value: e.Key})
	}
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	slices.Sort(names) // a stable order, so that equal events encode equally
	for _, k := range names {
		if strings.EqualFold(k, PropertyID) || strings.EqualFold(k, PropertyTopic) || strings.EqualFold(k, PropertyKey) {
			continue
		}
		v := e.Headers[k]
		if !validText(k) || !validText(v) {
			return nil, nil, sinks.Permanent(fmt.Errorf("event header %q: MQTT user properties are UTF-8 text without NUL", k))
		}
		props.User = append(props.User, paho.UserProperty{Key: k, Value: v})
	}
	return props, e.Payload, nil
}

// encodeCloudEvent is the cloudevents format, per the CloudEvents MQTT
// protocol binding for MQTT 5 (cloudevents.MQTT): in the binary mode the
// payload is the data, datacontenttype the Content Type property and every
// other attribute a user property of its own name holding its canonical
// string (mqtt-protocol-binding.md 3.1); in the structured mode the
// payload is the JSON event format and Content Type its media type (3.2).
// The event's own headers travel only as extension attributes.
func encodeCloudEvent(e sinks.Event, ce cloudevents.Config) (*paho.PublishProperties, []byte, error) {
	if ce.Structured() {
		body, err := cloudevents.Structured(e, ce.Source)
		if err != nil {
			return nil, nil, err
		}
		return &paho.PublishProperties{ContentType: cloudevents.MediaType}, body, nil
	}
	attrs := cloudevents.MQTT.Headers(cloudevents.Attributes(e, ce.Source))
	props := &paho.PublishProperties{User: make(paho.UserProperties, 0, len(attrs))}
	for _, a := range attrs {
		if a.Name == cloudevents.MQTT.ContentTypeHeader {
			props.ContentType = a.Value
			continue
		}
		// Extension attributes are valid Strings already; id, type and
		// subject come from the event as they are.
		if !validText(a.Value) {
			return nil, nil, sinks.Permanent(fmt.Errorf("CloudEvents attribute %s: MQTT user properties are UTF-8 text without NUL", a.Name))
		}
		props.User = append(props.User, paho.UserProperty{Key: a.Name, Value: a.Value})
	}
	return props, e.Payload, nil
}

// validText reports whether s can be an MQTT UTF-8 string: valid UTF-8
// without NUL.
func validText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// countingWriter counts the bytes written to it.
type countingWriter int64

func (w *countingWriter) Write(p []byte) (int, error) {
	*w += countingWriter(len(p))
	return len(p), nil
}

var _ io.Writer = (*countingWriter)(nil)

// checkTopic reports whether topic is a name a message can be published
// to: not empty, UTF-8 without NUL, at most 65535 bytes, no wildcard
// (+ and # are only for subscribing), and not starting with $, which
// brokers reserve for themselves ($SYS/...) and refuse or act on.
func checkTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("destination is empty: not an MQTT topic")
	case len(topic) > 65535:
		return fmt.Errorf("destination of %d bytes: MQTT topics are at most 65535 bytes", len(topic))
	case !utf8.ValidString(topic) || strings.IndexByte(topic, 0) >= 0:
		return fmt.Errorf("destination %q: MQTT topics are UTF-8 text without NUL", topic)
	case strings.ContainsAny(topic, "+#"):
		return fmt.Errorf("destination %q holds a wildcard (+ or #): messages cannot be published to it", topic)
	case strings.HasPrefix(topic, "$"):
		return fmt.Errorf("destination %q starts with $, which brokers reserve for their own topics: not published", topic)
	}
	return nil
}
