package rabbitmq

import (
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
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

// encode builds the AMQP message for e (the binary content mode: payload as
// the body, metadata as properties and headers). A message that can never
// be published (routing key or header name too long for AMQP, a header the
// broker routes by, a payload over maxSize) is a permanent error.
//
// A CloudEvents format would be a second encoder next to this one, chosen
// by the sink's configuration.
func encode(e sinks.Event, maxSize int) (amqp.Publishing, error) {
	if len(e.Destination) > maxShortString {
		return amqp.Publishing{}, sinks.Permanent(fmt.Errorf("routing key %.40q… is %d bytes, over AMQP's limit of %d",
			e.Destination, len(e.Destination), maxShortString))
	}
	if len(e.Payload) > maxSize {
		return amqp.Publishing{}, fmt.Errorf("max_message_size: %w", sinks.TooLarge(e, len(e.Payload), maxSize))
	}
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
	return amqp.Publishing{
		Headers:      h,
		ContentType:  e.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    e.ID,
		Timestamp:    e.CreatedAt,
		Body:         e.Payload,
	}, nil
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
