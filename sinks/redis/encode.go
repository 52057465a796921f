package redis

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/heraldhq/herald/sinks"
)

// Field names of every stream entry the sink adds, in the order XADD
// writes them.
const (
	// FieldID carries the event id, the consumers' dedupe key.
	FieldID = "id"
	// FieldTopic carries the event's topic.
	FieldTopic = "topic"
	// FieldKey carries the event's ordering key; empty when it has none.
	FieldKey = "key"
	// FieldContentType carries the payload's media type.
	FieldContentType = "content_type"
	// FieldHeaders carries the event's headers as a JSON object of strings
	// ({} when it has none).
	FieldHeaders = "headers"
	// FieldPayload carries the payload, byte for byte.
	FieldPayload = "payload"
)

// encode returns the XADD field-value pairs of e: the one place that
// decides what an entry holds (a format other than the native one, such
// as CloudEvents, would be a second encoder chosen here). An event that
// can never be added (no stream name, payload over maxPayload) is a
// permanent error.
func encode(e sinks.Event, maxPayload int) ([]any, error) {
	if e.Destination == "" {
		return nil, sinks.Permanent(errors.New("destination is empty: not a stream name"))
	}
	if len(e.Payload) > maxPayload {
		return nil, fmt.Errorf("max_payload: %w", sinks.TooLarge(len(e.Payload), maxPayload))
	}
	headers := []byte("{}")
	if len(e.Headers) > 0 {
		// A map of strings always marshals (invalid UTF-8 becomes U+FFFD).
		headers, _ = json.Marshal(e.Headers)
	}
	return []any{
		FieldID, e.ID,
		FieldTopic, e.Topic,
		FieldKey, e.Key,
		FieldContentType, e.ContentType,
		FieldHeaders, headers,
		FieldPayload, e.Payload,
	}, nil
}
