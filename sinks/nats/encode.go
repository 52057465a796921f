package nats

import (
	"fmt"
	"net/textproto"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/internal/cloudevents"
)

// Header names the sink sets on every message, next to the event's own
// headers (which keep their names; a clash with these is overwritten by the
// sink's value).
const (
	// HeaderMsgID carries the event id; JetStream drops a message whose id
	// it already stored within the stream's duplicate window.
	HeaderMsgID = jetstream.MsgIDHeader // "Nats-Msg-Id"
	// HeaderTopic carries the event's topic.
	HeaderTopic = "Herald-Topic"
	// HeaderKey carries the event's ordering key; absent when it is empty.
	HeaderKey = "Herald-Key"
	// HeaderContentType carries the payload's media type.
	HeaderContentType = "Content-Type"
)

// headerLine and crlf frame an encoded NATS header block ("NATS/1.0\r\n",
// one "Key: value\r\n" per value, "\r\n").
const (
	headerLine = "NATS/1.0\r\n"
	crlf       = "\r\n"
)

// encode builds the NATS message for e. A message that can never be
// published (invalid subject or header name, a reserved subject not in
// allowed, over maxPayload counting the encoded headers) is a permanent
// error.
func encode(e sinks.Event, maxPayload int64, allowed []string) (*natsgo.Msg, error) {
	if err := checkDestination(e.Destination, allowed); err != nil {
		return nil, err
	}
	h := make(natsgo.Header, len(e.Headers)+4)
	for k, v := range e.Headers {
		if err := checkHeaderName(k); err != nil {
			return nil, sinks.Permanent(err)
		}
		h[k] = []string{v}
	}
	h[HeaderMsgID] = []string{e.ID}
	h[HeaderTopic] = []string{e.Topic}
	h[HeaderContentType] = []string{e.ContentType}
	if e.Key != "" {
		h[HeaderKey] = []string{e.Key}
	}
	return checkSize(e, &natsgo.Msg{Subject: e.Destination, Header: h, Data: e.Payload}, maxPayload)
}

// encodeCloudEvent builds the NATS message for e as a CloudEvent per the
// CloudEvents NATS protocol binding, with Nats-Msg-Id for JetStream's
// dedupe: in the binary mode the payload is the data and every attribute a
// ce- header, datacontenttype included (nats-protocol-binding.md 3.1); in
// the structured mode the payload is the JSON event format, marked by
// Content-Type (3 and 3.2). The errors are encode's, and a JSON content
// type with a payload that is not JSON is permanent in the structured mode.
func encodeCloudEvent(e sinks.Event, ce cloudevents.Config, maxPayload int64, allowed []string) (*natsgo.Msg, error) {
	if err := checkDestination(e.Destination, allowed); err != nil {
		return nil, err
	}
	msg := &natsgo.Msg{Subject: e.Destination, Header: natsgo.Header{HeaderMsgID: []string{e.ID}}}
	if ce.Structured() {
		body, err := cloudevents.Structured(e, ce.Source)
		if err != nil {
			return nil, err
		}
		msg.Header[HeaderContentType] = []string{cloudevents.MediaType}
		msg.Data = body
		return checkSize(e, msg, maxPayload)
	}
	// Values are percent-encoded, so NATS's trimming of white space and
	// CR/LF cannot alter them.
	for _, a := range cloudevents.NATS.Headers(cloudevents.Attributes(e, ce.Source)) {
		msg.Header[a.Name] = []string{a.Value}
	}
	msg.Data = e.Payload
	return checkSize(e, msg, maxPayload)
}

// checkSize returns msg, or a permanent error when it is over maxPayload
// counting the encoded headers.
func checkSize(e sinks.Event, msg *natsgo.Msg, maxPayload int64) (*natsgo.Msg, error) {
	size := len(msg.Data) + headerSize(msg.Header)
	if maxPayload > 0 && int64(size) > maxPayload {
		return nil, fmt.Errorf("the server's max_payload: %w", sinks.TooLarge(size, int(maxPayload)))
	}
	return msg, nil
}

// headerSize is the encoded size of h, computed as nats.go encodes it
// (values trimmed of surrounding white space).
func headerSize(h natsgo.Header) int {
	n := len(headerLine) + len(crlf)
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(textproto.TrimString(v)) + 4 // ": " and CRLF
		}
	}
	return n
}

// checkDestination refuses, as a permanent error, a subject that cannot or
// must not be published to: invalid, or under a reserved prefix that
// allowed (allow_subject_prefixes) does not cover.
func checkDestination(subject string, allowed []string) error {
	if err := checkSubject(subject); err != nil {
		return sinks.Permanent(err)
	}
	return sinks.Permanent(checkReserved(subject, allowed))
}

// checkSubject reports whether s can be published to: not empty, no white
// space, no empty token, no wildcard token.
func checkSubject(s string) error {
	if s == "" {
		return fmt.Errorf("destination is empty: not a NATS subject")
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return fmt.Errorf("destination %q contains white space: not a NATS subject", s)
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch tok {
		case "":
			return fmt.Errorf("destination %q has an empty token: not a NATS subject", s)
		case "*", ">":
			return fmt.Errorf("destination %q has a wildcard token: messages cannot be published to it", s)
		}
	}
	return nil
}

// checkHeaderName reports whether an event header can travel as a NATS
// header: printable ASCII without ':' and the separators nats.go rejects
// (ADR-4), and not in the Nats- namespace, whose headers JetStream acts on
// (Nats-Rollup purges a stream, Nats-Expected-* reject messages).
func checkHeaderName(k string) error {
	if k == "" {
		return fmt.Errorf("event header with an empty name")
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 33 || c > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("event header %q: NATS header names are printable ASCII without separators", k)
		}
	}
	if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
		return fmt.Errorf("event header %q: names starting with Nats- are reserved for the NATS server", k)
	}
	return nil
}
