package pubsub

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/heraldhq/herald/sinks"
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

// encode builds the Pub/Sub message for e: the payload as data, the event
// key as ordering key, metadata as attributes. A message Pub/Sub would
// refuse (an attribute over its limits, a payload over 10 MB) is a
// permanent error, named after the event and the field.
//
// A CloudEvents format would be a second encoder next to this one (the
// CloudEvents Pub/Sub binding: ce- attributes), chosen by the sink's
// configuration.
func encode(e sinks.Event) (*pubsub.Message, error) {
	if len(e.Key) > maxOrderingKey {
		return nil, sinks.Permanent(fmt.Errorf("event %s: key is %d bytes, over Pub/Sub's ordering key limit of %d", e.ID, len(e.Key), maxOrderingKey))
	}
	attrs := make(map[string]string, len(e.Headers)+3)
	size := len(e.Payload) + len(e.Key)
	for k, v := range e.Headers {
		if err := checkAttribute(k, v); err != nil {
			return nil, sinks.Permanent(fmt.Errorf("event %s: %w", e.ID, err))
		}
		attrs[k] = v
	}
	attrs[AttrID] = e.ID
	attrs[AttrTopic] = e.Topic
	attrs[AttrContentType] = e.ContentType
	if len(attrs) > maxAttributes {
		return nil, sinks.Permanent(fmt.Errorf("event %s: %d attributes with the sink's own, over Pub/Sub's limit of %d", e.ID, len(attrs), maxAttributes))
	}
	for k, v := range attrs {
		size += len(k) + len(v)
	}
	if size > maxMessageBytes {
		return nil, sinks.TooLarge(e, size, maxMessageBytes)
	}
	return &pubsub.Message{Data: e.Payload, Attributes: attrs, OrderingKey: e.Key}, nil
}

// checkAttribute reports whether an event header can travel as a Pub/Sub
// attribute: a non-empty UTF-8 name of at most 256 bytes not starting with
// "goog" (reserved), a UTF-8 value of at most 1024 bytes.
func checkAttribute(k, v string) error {
	switch {
	case k == "":
		return fmt.Errorf("header with an empty name")
	case len(k) > maxAttrKeyBytes:
		return fmt.Errorf("header %.40q… is %d bytes, over Pub/Sub's attribute key limit of %d", k, len(k), maxAttrKeyBytes)
	case strings.HasPrefix(k, "goog"):
		return fmt.Errorf("header %q: Pub/Sub reserves attribute keys starting with \"goog\"", k)
	case !utf8.ValidString(k):
		return fmt.Errorf("header %.40q: the name is not UTF-8", k)
	case len(v) > maxAttrValueBytes:
		return fmt.Errorf("header %q: value of %d bytes, over Pub/Sub's attribute value limit of %d", k, len(v), maxAttrValueBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("header %q: the value is not UTF-8", k)
	}
	return nil
}
