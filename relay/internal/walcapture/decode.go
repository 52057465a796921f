package walcapture

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/relay/internal/store"
)

// message is an event as outbox_emit encodes it: the text of a
// json_build_object with these keys, in this order.
type message struct {
	Seq         int64           `json:"seq"`
	ID          string          `json:"id"`
	Topic       string          `json:"topic"`
	Key         *string         `json:"key"`
	Lane        int16           `json:"lane"`
	Payload     json.RawMessage `json:"payload"`
	PayloadBin  *string         `json:"payload_bin"`
	ContentType *string         `json:"content_type"`
	Headers     json.RawMessage `json:"headers"`
	CreatedAt   time.Time       `json:"created_at"`
	MaxAttempts *int            `json:"max_attempts"`
}

// decoder reads events from messages' contents. It keeps the topics and
// content types it has seen, so that an event of a known topic costs no
// allocation for it. One goroutine uses a decoder.
type decoder struct {
	interned map[string]string
}

// maxInterned bounds the strings a decoder keeps: topics and content types
// come from applications, and a stream of distinct ones must not grow it.
const maxInterned = 1024

// decode reads an event from a message's content, which it does not keep.
// Messages as outbox_emit writes them are read by a scanner that knows
// their shape; anything else goes through encoding/json, which also
// explains what is wrong with it.
func (d *decoder) decode(content []byte) (store.Event, error) {
	if e, ok := d.scan(content); ok {
		return e, nil
	}
	return decodeJSON(content)
}

// decodeJSON reads an event from a message's content with encoding/json.
func decodeJSON(content []byte) (store.Event, error) {
	var m message
	if err := json.Unmarshal(content, &m); err != nil {
		return store.Event{}, fmt.Errorf("decoding an event from the WAL: %w", err)
	}
	e := store.Event{Seq: m.Seq, ID: m.ID, Topic: m.Topic, Lane: m.Lane, Headers: m.Headers, CreatedAt: m.CreatedAt}
	if m.Key != nil {
		e.Key = *m.Key
	}
	if m.ContentType != nil {
		e.ContentType = *m.ContentType
	}
	if m.MaxAttempts != nil {
		e.MaxAttempts = *m.MaxAttempts
	}
	switch {
	case m.PayloadBin != nil:
		b, err := base64.StdEncoding.DecodeString(*m.PayloadBin)
		if err != nil {
			return store.Event{}, fmt.Errorf("decoding the binary payload of event %s from the WAL: %w", m.ID, err)
		}
		e.PayloadBin = b
	case len(m.Payload) > 0 && string(m.Payload) != "null":
		e.Payload = m.Payload
	}
	e.PayloadBytes = int64(len(e.Payload) + len(e.PayloadBin))
	if len(e.Headers) == 0 || string(e.Headers) == "null" {
		e.Headers = []byte("{}")
	}
	return e, nil
}

// scan reads a message in the shape outbox_emit writes (the keys of
// message in its order, values as json_build_object renders them), the
// event's payload and headers sharing one copy of the content. ok is false
// when the content is in any other shape.
func (d *decoder) scan(content []byte) (e store.Event, ok bool) {
	s := scanner{b: bytes.Clone(content), ok: true}
	s.expect('{')
	s.key("seq")
	e.Seq = s.integer()
	s.key("id")
	e.ID = string(s.text())
	s.key("topic")
	e.Topic = d.intern(s.text())
	s.key("key")
	e.Key = string(s.text()) // "" for null: a key is never empty
	s.key("lane")
	e.Lane = int16(s.integer())
	s.key("payload")
	payload := s.raw()
	s.key("payload_bin")
	bin := s.text()
	s.key("content_type")
	e.ContentType = d.intern(s.text())
	s.key("headers")
	e.Headers = s.raw()
	s.key("created_at")
	created := s.text()
	s.key("max_attempts")
	e.MaxAttempts = int(s.integer())
	s.expect('}')
	s.space()
	if !s.ok || s.i != len(s.b) {
		return store.Event{}, false
	}
	// Only the server writes outbox_emit's messages, but anyone may call
	// pg_logical_emit_message with the outbox's prefix: what is passed on
	// as JSON must be JSON.
	if payload != nil && !json.Valid(payload) || e.Headers != nil && !json.Valid(e.Headers) {
		return store.Event{}, false
	}
	var err error
	if e.CreatedAt, err = time.Parse(time.RFC3339Nano, string(created)); err != nil {
		return store.Event{}, false
	}
	switch {
	case bin != nil:
		e.PayloadBin = make([]byte, base64.StdEncoding.DecodedLen(len(bin)))
		n, err := base64.StdEncoding.Decode(e.PayloadBin, bin)
		if err != nil {
			return store.Event{}, false
		}
		e.PayloadBin = e.PayloadBin[:n]
	case payload != nil:
		e.Payload = payload
	}
	e.PayloadBytes = int64(len(e.Payload) + len(e.PayloadBin))
	if e.Headers == nil {
		e.Headers = []byte("{}")
	}
	return e, true
}

// intern returns b as a string, the same string for the same bytes.
func (d *decoder) intern(b []byte) string {
	if s, ok := d.interned[string(b)]; ok {
		return s
	}
	s := string(b)
	if d.interned == nil {
		d.interned = map[string]string{}
	}
	if len(d.interned) < maxInterned {
		d.interned[s] = s
	}
	return s
}

// scanner reads the text of a JSON object whose members come in a known
// order. Once ok is false (the text is not in the shape asked for), every
// read returns nothing.
type scanner struct {
	b       []byte
	i       int
	ok      bool
	members int // read so far
}

func (s *scanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\n' || s.b[s.i] == '\t' || s.b[s.i] == '\r') {
		s.i++
	}
}

// expect reads c, after white space.
func (s *scanner) expect(c byte) {
	s.space()
	if !s.ok || s.i >= len(s.b) || s.b[s.i] != c {
		s.ok = false
		return
	}
	s.i++
}

// key reads the next member's key, which must be name, and the colon after
// it; before it, unless it is the first, the comma after the previous
// member.
func (s *scanner) key(name string) {
	if s.members > 0 {
		s.expect(',')
	}
	s.members++
	s.space()
	end := s.i + 1 + len(name)
	if !s.ok || end >= len(s.b) || s.b[s.i] != '"' || string(s.b[s.i+1:end]) != name || s.b[end] != '"' {
		s.ok = false
		return
	}
	s.i = end + 1
	s.expect(':')
	s.space()
}

// null reads a null if one is next.
func (s *scanner) null() bool {
	if s.ok && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// integer reads an integer, 0 for null.
func (s *scanner) integer() int64 {
	if !s.ok || s.null() {
		return 0
	}
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil || s.b[digits] == '0' && s.i-digits > 1 { // JSON has no leading zeros
		s.ok = false
		return 0
	}
	return n
}

// text reads a string's value, nil for null. A string with an escape is
// unquoted by encoding/json.
func (s *scanner) text() []byte {
	if !s.ok || s.null() {
		return nil
	}
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		s.ok = false
		return nil
	}
	start := s.i
	end, escaped := stringEnd(s.b, s.i)
	if end < 0 {
		s.ok = false
		return nil
	}
	s.i = end
	if !escaped {
		return s.b[start+1 : end-1 : end-1]
	}
	var v string
	if err := json.Unmarshal(s.b[start:end], &v); err != nil {
		s.ok = false
		return nil
	}
	return []byte(v)
}

// raw reads a JSON value's text, nil for null. The server wrote it (the
// text of a jsonb), so only its end is looked for.
func (s *scanner) raw() []byte {
	if !s.ok || s.null() {
		return nil
	}
	start, depth := s.i, 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			end, _ := stringEnd(s.b, s.i)
			if end < 0 {
				s.ok = false
				return nil
			}
			s.i = end
			if depth == 0 {
				return s.b[start:s.i:s.i]
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return s.b[start:s.i:s.i]
			}
		case ',':
			if depth == 0 { // the end of a number, true or false
				return s.b[start:s.i:s.i]
			}
		}
		if depth < 0 {
			s.ok = false
			return nil
		}
		s.i++
	}
	s.ok = false
	return nil
}

// stringEnd returns the position after the string that starts (with its
// quote) at b[i], and whether it holds an escape; -1 if it does not end.
func stringEnd(b []byte, i int) (end int, escaped bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		default:
			if b[j] < 0x20 || b[j] >= utf8.RuneSelf {
				// A control character (which JSON does not allow raw)
				// or a non-ASCII one (which must be valid UTF-8):
				// encoding/json judges the string.
				escaped = true
			}
		}
	}
	return -1, escaped
}
