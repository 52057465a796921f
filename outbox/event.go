package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// ContentTypeJSON is the content type of JSON payloads, assumed when an
// Event's ContentType is empty.
const ContentTypeJSON = "application/json"

// Limits enforced by Enqueue. The topic and key limits are also CHECK
// constraints of the outbox table; the header limits keep headers small
// enough for every sink (Kafka, NATS and HTTP headers).
const (
	// MaxTopicBytes is the longest topic, in bytes.
	MaxTopicBytes = 255
	// MaxKeyBytes is the longest key, in bytes.
	MaxKeyBytes = 1024
	// MaxHeaders is the most headers one event may carry.
	MaxHeaders = 100
	// MaxHeaderNameBytes is the longest header name, in bytes.
	MaxHeaderNameBytes = 256
	// MaxHeaderValueBytes is the longest header value, in bytes.
	MaxHeaderValueBytes = 8 << 10
	// MaxHeadersBytes bounds the sum of the lengths of every header name and
	// value of one event.
	MaxHeadersBytes = 64 << 10
)

// Event is one event to enqueue. Only Topic is required.
type Event struct {
	// ID identifies the event everywhere downstream: it is the dedupe key
	// sinks hand to consumers (Kafka header, Nats-Msg-Id, webhook-id), and it
	// is unique in the outbox table. The zero value means a new UUIDv7.
	ID uuid.UUID
	// Topic names the kind of event (e.g. "orders.created"); routes match on
	// it. Required; at most MaxTopicBytes bytes of UTF-8 without NUL.
	Topic string
	// Key orders events: the relay publishes events sharing a key in the
	// order they were enqueued. Empty means no key (stored as NULL); at most
	// MaxKeyBytes bytes of UTF-8 without NUL.
	Key string
	// Payload is the event's body. With a JSON content type it must be valid
	// JSON and is stored as text, byte for byte; other content types are
	// stored as bytes. An empty JSON payload is stored as NULL, which the
	// relay publishes as the JSON value null.
	Payload []byte
	// ContentType is the payload's media type. Empty means application/json.
	// application/json and +json types (parameters ignored) are JSON and go
	// to the payload column; any other type goes to payload_bin.
	ContentType string
	// Headers travel with the event to the sink (as Kafka, NATS or HTTP
	// headers). At most MaxHeaders, names 1 to MaxHeaderNameBytes bytes,
	// values up to MaxHeaderValueBytes, MaxHeadersBytes in all; UTF-8
	// without NUL.
	Headers map[string]string
	// Delay postpones publication: the event is published no earlier than
	// the database's clock at the insert plus Delay. Must not be negative,
	// nor set together with AvailableAt.
	Delay time.Duration
	// AvailableAt postpones publication to an absolute time. The zero value
	// means now (or now plus Delay).
	AvailableAt time.Time
	// MaxAttempts caps delivery attempts per sink before the event is
	// dead-lettered. 0 means the relay's default.
	MaxAttempts int
}

// JSON returns an event of the given topic whose payload is v marshalled
// with encoding/json.
func JSON(topic string, v any) (Event, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return Event{}, fmt.Errorf("outbox: marshalling payload of a %q event: %w", topic, err)
	}
	return Event{Topic: topic, Payload: payload}, nil
}

// ValidationError reports an event Enqueue refused. Nothing of the call was
// written. Use errors.As to read it.
type ValidationError struct {
	// Index is the event's position in the Enqueue call.
	Index int
	// Field names the offending field as the outbox column it fills, e.g.
	// "topic", "payload" or `headers["X-Tenant"]`.
	Field string
	// Reason says what is wrong.
	Reason string
}

// Error returns e.g. "outbox: events[3].topic: must not be empty".
func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox: events[%d].%s: %s", e.Index, e.Field, e.Reason)
}

// isJSON reports whether a content type denotes JSON: application/json or a
// +json suffix type, ignoring parameters. It is the relay's rule (the outbox
// package cannot import sinks), so both sides agree on which column to use.
func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimRight(mt, " ")
	return mt == ContentTypeJSON || len(mt) > 5 && strings.HasSuffix(mt, "+json")
}

// validate checks e, the index-th event of a call, against the table's
// constraints and Herald's limits.
func (e *Event) validate(index int) error {
	fail := func(field, format string, args ...any) error {
		return &ValidationError{Index: index, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case e.Topic == "":
		return fail("topic", "must not be empty")
	case len(e.Topic) > MaxTopicBytes:
		return fail("topic", "is %d bytes long; at most %d are allowed", len(e.Topic), MaxTopicBytes)
	}
	if reason := textProblem(e.Topic); reason != "" {
		return fail("topic", "%s", reason)
	}
	if len(e.Key) > MaxKeyBytes {
		return fail("key", "is %d bytes long; at most %d are allowed", len(e.Key), MaxKeyBytes)
	}
	if reason := textProblem(e.Key); reason != "" {
		return fail("key", "%s", reason)
	}
	if reason := textProblem(e.ContentType); reason != "" {
		return fail("content_type", "%s", reason)
	}
	if len(e.Payload) > 0 && e.payloadIsJSON() {
		if why := jsonProblem(e.Payload); why != "" {
			ct := e.ContentType
			if ct == "" {
				ct = ContentTypeJSON
			}
			return fail("payload", "not valid JSON (content type %s): %s", ct, why)
		}
	}
	if err := validateHeaders(index, e.Headers); err != nil {
		return err
	}
	switch {
	case e.Delay < 0:
		return fail("delay", "must not be negative, got %s", e.Delay)
	case e.Delay != 0 && !e.AvailableAt.IsZero():
		return fail("delay", "must not be set together with available_at; set one of Delay and AvailableAt")
	case e.MaxAttempts < 0:
		return fail("max_attempts", "must not be negative, got %d", e.MaxAttempts)
	case e.MaxAttempts > math.MaxInt32:
		return fail("max_attempts", "must be at most %d, got %d", math.MaxInt32, e.MaxAttempts)
	}
	return nil
}

// payloadIsJSON reports whether the payload belongs in the json column.
func (e *Event) payloadIsJSON() bool {
	return e.ContentType == "" || isJSON(e.ContentType)
}

// validateHeaders checks the headers of the index-th event. When several
// headers are wrong it names the first in sorted order, so the error does not
// depend on map iteration.
func validateHeaders(index int, headers map[string]string) error {
	if len(headers) > MaxHeaders {
		return &ValidationError{Index: index, Field: "headers",
			Reason: fmt.Sprintf("has %d headers; at most %d are allowed", len(headers), MaxHeaders)}
	}
	var (
		total       int
		badName     string
		badReason   string
		haveProblem bool
	)
	for name, value := range headers {
		total += len(name) + len(value)
		reason := headerProblem(name, value)
		if reason != "" && (!haveProblem || name < badName) {
			badName, badReason, haveProblem = name, reason, true
		}
	}
	if haveProblem {
		return &ValidationError{Index: index, Field: fmt.Sprintf("headers[%q]", badName), Reason: badReason}
	}
	if total > MaxHeadersBytes {
		return &ValidationError{Index: index, Field: "headers",
			Reason: fmt.Sprintf("names and values total %d bytes; at most %d are allowed", total, MaxHeadersBytes)}
	}
	return nil
}

// headerProblem describes what is wrong with one header, or returns "".
func headerProblem(name, value string) string {
	switch {
	case name == "":
		return "name must not be empty"
	case len(name) > MaxHeaderNameBytes:
		return fmt.Sprintf("name is %d bytes long; at most %d are allowed", len(name), MaxHeaderNameBytes)
	case len(value) > MaxHeaderValueBytes:
		return fmt.Sprintf("value is %d bytes long; at most %d are allowed", len(value), MaxHeaderValueBytes)
	}
	if reason := textProblem(name); reason != "" {
		return "name " + reason
	}
	if reason := textProblem(value); reason != "" {
		return "value " + reason
	}
	return ""
}

// textProblem reports why s cannot be stored in a PostgreSQL text (or jsonb
// string) value, or returns "".
func textProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which PostgreSQL text cannot hold"
	}
	return ""
}

// jsonProblem says what is wrong with a JSON payload, or "" when nothing
// is. PostgreSQL's json type stores values nested deeper than Go's
// encoding/json (and so every sink) accepts: those are refused here, saying
// so, rather than dead-lettered later.
func jsonProblem(payload []byte) string {
	if !utf8.Valid(payload) {
		return "not valid UTF-8"
	}
	if json.Valid(payload) {
		return ""
	}
	var syntax *json.SyntaxError
	if err := json.Unmarshal(payload, new(json.RawMessage)); errors.As(err, &syntax) {
		if strings.HasSuffix(syntax.Error(), "exceeded max depth") {
			return fmt.Sprintf("arrays and objects nest deeper than 10000 levels at byte %d, the most the relay's JSON encoder accepts", syntax.Offset)
		}
		return fmt.Sprintf("%s at byte %d", syntax, syntax.Offset)
	}
	return "not one JSON value"
}
