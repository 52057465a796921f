package rabbitmq

import (
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
)

// Header names the sink sets on every message, next to the event's own
// headers (which keep their names; a clash with these is overwritten by the
// sink's value).
const (
	// HeaderTopic carries the event's topic.
	HeaderTopic = "herald-topic"
	// HeaderKey carries the event's ordering key; absent when it is empty.
	HeaderKey = "herald-key"
)

// encode builds the AMQP message for e in the configured format. A message
// that can never be published (routing key or header name too long for
// AMQP, a header the broker routes by, a body over max_message_size, a JSON
// content type with a payload that is not JSON in the structured
// CloudEvents mode) is a permanent error.
func encode(e sinks.Event, cfg Config) (amqp.Publishing, error) {
	if len(e.Destination) > maxShortString {
		return amqp.Publishing{}, sinks.Permanent(fmt.Errorf("routing key %.40q… is %d bytes, over AMQP's limit of %d",
			e.Destination, len(e.Destination), maxShortString))
	}
	var msg amqp.Publishing
	var err error
	if cfg.Format == FormatCloudEvents {
		msg, err = encodeCloudEvent(e, cfg.CloudEvents)
	} else {
		msg, err = encodeHerald(e)
	}
	if err != nil {
		return amqp.Publishing{}, err
	}
	if len(msg.Body) > cfg.MaxMessageSize {
		return amqp.Publishing{}, fmt.Errorf("max_message_size: %w", sinks.TooLarge(len(msg.Body), cfg.MaxMessageSize))
	}
	// Properties of every format: message_id is the consumers' dedupe key,
	// and persistence is what a publisher confirm is worth.
	msg.MessageId = e.ID
	msg.DeliveryMode = amqp.Persistent
	msg.Timestamp = e.CreatedAt
	return msg, nil
}

// encodeHerald is the herald format: the payload as the body, metadata as
// properties and headers.
func encodeHerald(e sinks.Event) (amqp.Publishing, error) {
	h := make(amqp.Table, len(e.Headers)+2)
	for k, v := range e.Headers {
		if err := checkHeaderName(k); err != nil {
			return amqp.Publishing{}, sinks.Permanent(err)
		}
		h[k] = v
	}
	h[HeaderTopic] = e.Topic
	if e.Key != "" {
		h[HeaderKey] = e.Key
	}
	return amqp.Publishing{Headers: h, ContentType: e.ContentType, Body: e.Payload}, nil
}

// encodeCloudEvent is the cloudevents format, per the CloudEvents AMQP
// protocol binding mapped onto AMQP 0-9-1 (see cloudevents.AMQP): in the
// binary mode the payload is the body, datacontenttype the content_type
// property and every other attribute a cloudEvents_ header holding its
// canonical string (amqp-protocol-binding.md 3.1); in the structured mode
// the body is the JSON event format and content_type its media type
// (3.2). The event's own headers travel only as extension attributes.
func encodeCloudEvent(e sinks.Event, ce cloudevents.Config) (amqp.Publishing, error) {
	if ce.Structured() {
		body, err := cloudevents.Structured(e, ce.Source)
		if err != nil {
			return amqp.Publishing{}, err
		}
		return amqp.Publishing{ContentType: cloudevents.MediaType, Body: body}, nil
	}
	attrs := cloudevents.AMQP.Headers(cloudevents.Attributes(e, ce.Source))
	msg := amqp.Publishing{Headers: make(amqp.Table, len(attrs)), Body: e.Payload}
	for _, a := range attrs {
		if a.Name == cloudevents.AMQP.ContentTypeHeader {
			msg.ContentType = a.Value
			continue
		}
		if err := checkHeaderName(a.Name); err != nil {
			return amqp.Publishing{}, sinks.Permanent(err)
		}
		msg.Headers[a.Name] = a.Value
	}
	return msg, nil
}

// checkHeaderName reports whether an event header can travel as an AMQP
// header without changing where the message goes: a short string, and not
// CC or BCC, with which RabbitMQ copies a message to more routing keys
// (sender-selected distribution). Header names come from event data.
func checkHeaderName(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("event header with an empty name")
	case len(k) > maxShortString:
		return fmt.Errorf("event header %.40q… is %d bytes, over AMQP's limit of %d", k, len(k), maxShortString)
	case strings.EqualFold(k, "CC"), strings.EqualFold(k, "BCC"):
		return fmt.Errorf("event header %q: RabbitMQ routes copies of the message by it (sender-selected distribution)", k)
	}
	return nil
}
