package pubsub

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
)

// Attribute names the sink sets on every message, next to the event's own
// headers (which keep their names; a clash with these is overwritten by the
// sink's value).
const (
	// AttrID carries the event id: the consumers' dedupe key.
	AttrID = "herald-id"
	// AttrTopic carries the event's topic.
	AttrTopic = "herald-topic"
	// AttrContentType carries the payload's media type.
	AttrContentType = "content-type"
)

// Pub/Sub's limits on a message
// (https://cloud.google.com/pubsub/quotas#resource_limits).
const (
	maxAttributes     = 100
	maxAttrKeyBytes   = 256
	maxAttrValueBytes = 1024
	maxOrderingKey    = 1024
	// maxMessageBytes bounds data, attributes and ordering key together:
	// the 10 MB of a publish request, less room for the request's own
	// fields.
	maxMessageBytes = pubsub.MaxPublishRequestBytes - 4096
)

// encode builds the Pub/Sub message for e in the configured format, with
// the event key as ordering key. A message Pub/Sub would refuse (an
// attribute over its limits, a payload over 10 MB) or that cannot be
// encoded (a JSON content type with a payload that is not JSON in the
// structured CloudEvents mode) is a permanent error naming the field.
func encode(e sinks.Event, cfg Config) (*pubsub.Message, error) {
	if len(e.Key) > maxOrderingKey {
		return nil, sinks.Permanent(fmt.Errorf("key is %d bytes, over Pub/Sub's ordering key limit of %d", len(e.Key), maxOrderingKey))
	}
	var attrs map[string]string
	data := e.Payload
	var err error
	if cfg.Format == FormatCloudEvents {
		attrs, data, err = encodeCloudEvent(e, cfg.CloudEvents)
	} else {
		attrs, err = heraldAttributes(e)
	}
	if err != nil {
		return nil, err
	}
	if len(attrs) > maxAttributes {
		return nil, sinks.Permanent(fmt.Errorf("%d attributes with the sink's own, over Pub/Sub's limit of %d", len(attrs), maxAttributes))
	}
	size := len(data) + len(e.Key)
	for k, v := range attrs {
		size += len(k) + len(v)
	}
	if size > maxMessageBytes {
		return nil, sinks.TooLarge(size, maxMessageBytes)
	}
	return &pubsub.Message{Data: data, Attributes: attrs, OrderingKey: e.Key}, nil
}

// heraldAttributes is the herald format's attributes: the event's headers
// under their own names, then the sink's, which win a clash.
func heraldAttributes(e sinks.Event) (map[string]string, error) {
	attrs := make(map[string]string, len(e.Headers)+3)
	for k, v := range e.Headers {
		if err := checkAttribute("header", k, v); err != nil {
			return nil, sinks.Permanent(err)
		}
		attrs[k] = v
	}
	attrs[AttrID] = e.ID
	attrs[AttrTopic] = e.Topic
	attrs[AttrContentType] = e.ContentType
	return attrs, nil
}

// encodeCloudEvent is the cloudevents format, per the Google Cloud Pub/Sub
// protocol binding (cloudevents.PubSub). In the binary mode the data is the
// payload (3.1.2), datacontenttype the content-type attribute (3.1.1) and
// every other attribute a ce- attribute holding its canonical string
// (3.1.3). In the structured mode the data is the JSON event format and
// content-type its media type (3.2.1, 3.2.2); the binding allows the ce-
// attributes there too (3.2.3) but does not ask for them, so the message
// carries only content-type. Either way there are no herald- attributes
// (consumers dedupe on the id attribute) and the event's headers travel
// only as extension attributes.
func encodeCloudEvent(e sinks.Event, ce cloudevents.Config) (map[string]string, []byte, error) {
	if ce.Structured() {
		body, err := cloudevents.Structured(e, ce.Source)
		if err != nil {
			return nil, nil, err
		}
		return map[string]string{AttrContentType: cloudevents.MediaTypePubSub}, body, nil
	}
	headers := cloudevents.PubSub.Headers(cloudevents.Attributes(e, ce.Source))
	attrs := make(map[string]string, len(headers))
	for _, h := range headers {
		// Extension attributes are valid Strings already; id, type and
		// subject come from the event as they are, and any value may be
		// over Pub/Sub's limit.
		if err := checkAttribute("CloudEvents attribute", h.Name, h.Value); err != nil {
			return nil, nil, sinks.Permanent(err)
		}
		attrs[h.Name] = h.Value
	}
	return attrs, e.Payload, nil
}

// checkAttribute reports whether a header or attribute (what names which)
// can travel as a Pub/Sub attribute: a non-empty UTF-8 name of at most 256
// bytes not starting with "goog" (reserved), a UTF-8 value of at most 1024
// bytes.
func checkAttribute(what, k, v string) error {
	switch {
	case k == "":
		return fmt.Errorf("%s with an empty name", what)
	case len(k) > maxAttrKeyBytes:
		return fmt.Errorf("%s %.40q… is %d bytes, over Pub/Sub's attribute key limit of %d", what, k, len(k), maxAttrKeyBytes)
	case strings.HasPrefix(k, "goog"):
		return fmt.Errorf("%s %q: Pub/Sub reserves attribute keys starting with \"goog\"", what, k)
	case !utf8.ValidString(k):
		return fmt.Errorf("%s %.40q: the name is not UTF-8", what, k)
	case len(v) > maxAttrValueBytes:
		return fmt.Errorf("%s %q: value of %d bytes, over Pub/Sub's attribute value limit of %d", what, k, len(v), maxAttrValueBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s %q: the value is not UTF-8", what, k)
	}
	return nil
}
