package awssink

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/heraldhq/herald/sinks"
)

// Message attribute names. Every message carries ID, Topic and
// ContentType, Key when the event has one, Headers when it has any, and
// Encoding when the body is base64: at most six of the ten attributes SQS
// and SNS allow, whatever the number of headers.
const (
	// AttrID carries the event id, the consumers' dedupe key.
	AttrID = "herald.id"
	// AttrTopic carries the event's topic.
	AttrTopic = "herald.topic"
	// AttrKey carries the event's ordering key.
	AttrKey = "herald.key"
	// AttrContentType carries the payload's media type.
	AttrContentType = "herald.content_type"
	// AttrHeaders carries the event's headers as one JSON object of
	// strings: header names need not be valid attribute names, and their
	// number is not bounded by the services' ten attributes.
	AttrHeaders = "herald.headers"
	// AttrEncoding is "base64" when the body is the payload in base64
	// (a payload that is not text the services accept as a body).
	AttrEncoding = "herald.encoding"
)

// MaxMessageSize is the largest message, body and attributes together,
// that both SQS and SNS accept (256 KiB), and the largest batch request.
const MaxMessageSize = 256 << 10

// stringType is the data type of every attribute, counted in its size.
const stringType = "String"

// Message is an event as both services carry it.
type Message struct {
	Body       string
	Attributes map[string]string
	// Size is what the services count against MaxMessageSize: the body
	// and each attribute's name, data type and value.
	Size int
}

// Encode returns e as a message: the one place that decides what a
// message holds (a format such as CloudEvents would be a second encoder
// chosen here). An event that can never be sent (a message over
// MaxMessageSize) is a permanent error.
func Encode(e sinks.Event) (Message, error) {
	m := Message{Attributes: map[string]string{
		AttrID:          e.ID,
		AttrTopic:       e.Topic,
		AttrContentType: e.ContentType,
	}}
	if e.Key != "" {
		m.Attributes[AttrKey] = e.Key
	}
	if len(e.Headers) > 0 {
		// A map of strings always marshals (invalid UTF-8 becomes U+FFFD).
		h, _ := json.Marshal(e.Headers)
		m.Attributes[AttrHeaders] = string(h)
	}
	if isBodyText(e.Payload) {
		m.Body = string(e.Payload)
	} else {
		m.Body = base64.StdEncoding.EncodeToString(e.Payload)
		m.Attributes[AttrEncoding] = "base64"
	}
	m.Size = len(m.Body)
	for name, value := range m.Attributes {
		m.Size += len(name) + len(stringType) + len(value)
	}
	if m.Size > MaxMessageSize {
		return Message{}, sinks.TooLarge(m.Size, MaxMessageSize)
	}
	return m, nil
}

// isBodyText reports whether b can be a message body as it is: non-empty
// UTF-8 made of the characters SQS allows (#x9, #xA, #xD, #x20 to #xD7FF,
// #xE000 to #xFFFD, #x10000 to #x10FFFF).
func isBodyText(b []byte) bool {
	if len(b) == 0 || !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF:
		case r >= 0xE000 && r <= 0xFFFD:
		case r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}

// Decode is Encode's inverse for consumers and tests: the payload of a
// received body and its attributes.
func Decode(body string, attrs map[string]string) ([]byte, error) {
	if attrs[AttrEncoding] != "base64" {
		return []byte(body), nil
	}
	b, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("decoding a base64 body: %w", err)
	}
	return b, nil
}
