package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/outbox"
)

func TestValidationNamesFieldAndIndexAndWritesNothing(t *testing.T) {
	t.Parallel()
	manyHeaders := map[string]string{}
	for i := range outbox.MaxHeaders + 1 {
		manyHeaders[fmt.Sprint("h", i)] = "v"
	}
	bigHeaders := map[string]string{}
	for i := range 9 {
		bigHeaders[fmt.Sprint("h", i)] = strings.Repeat("v", 8000) // each within 8 KiB, 72,018 bytes in all
	}
	at := time.Now().Add(time.Hour)
	cases := []struct {
		name   string
		event  outbox.Event
		field  string
		reason string
	}{
		{"empty topic", outbox.Event{}, "topic", "must not be empty"},
		{"long topic", outbox.Event{Topic: strings.Repeat("t", 256)}, "topic", "is 256 bytes long; at most 255 are allowed"},
		{"topic NUL", outbox.Event{Topic: "a\x00b"}, "topic", "contains a NUL byte, which PostgreSQL text cannot hold"},
		{"topic UTF-8", outbox.Event{Topic: "a\xffb"}, "topic", "is not valid UTF-8"},
		{"long key", outbox.Event{Topic: "t", Key: strings.Repeat("k", 1025)}, "key", "is 1025 bytes long; at most 1024 are allowed"},
		{"key NUL", outbox.Event{Topic: "t", Key: "\x00"}, "key", "contains a NUL byte, which PostgreSQL text cannot hold"},
		{"key UTF-8", outbox.Event{Topic: "t", Key: "\xc3"}, "key", "is not valid UTF-8"},
		{"content type NUL", outbox.Event{Topic: "t", ContentType: "text/plain\x00"}, "content_type", "contains a NUL byte, which PostgreSQL text cannot hold"},
		{"bad JSON", outbox.Event{Topic: "t", Payload: []byte(`{"a":`)}, "payload", "not valid JSON (content type application/json): unexpected end of JSON input at byte 5"},
		{"bad +json", outbox.Event{Topic: "t", Payload: []byte(`nope`), ContentType: "application/cloudevents+json"}, "payload", "not valid JSON (content type application/cloudevents+json): invalid character 'o' in literal null (expecting 'u') at byte 2"},
		{"JSON bad UTF-8", outbox.Event{Topic: "t", Payload: []byte("\"\xff\"")}, "payload", "not valid JSON (content type application/json): not valid UTF-8"},
		{"JSON too deep", outbox.Event{Topic: "t", Payload: []byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))}, "payload",
			"not valid JSON (content type application/json): arrays and objects nest deeper than 10000 levels at byte 10001, the most the relay's JSON encoder accepts"},
		{"empty header name", outbox.Event{Topic: "t", Headers: map[string]string{"": "v"}}, `headers[""]`, "name must not be empty"},
		{"long header name", outbox.Event{Topic: "t", Headers: map[string]string{strings.Repeat("n", 257): "v"}}, `headers["` + strings.Repeat("n", 257) + `"]`, "name is 257 bytes long; at most 256 are allowed"},
		{"long header value", outbox.Event{Topic: "t", Headers: map[string]string{"a": strings.Repeat("v", 8193)}}, `headers["a"]`, "value is 8193 bytes long; at most 8192 are allowed"},
		{"header name NUL", outbox.Event{Topic: "t", Headers: map[string]string{"a\x00": "v"}}, `headers["a\x00"]`, "name contains a NUL byte, which PostgreSQL text cannot hold"},
		{"header value NUL", outbox.Event{Topic: "t", Headers: map[string]string{"a": "\x00"}}, `headers["a"]`, "value contains a NUL byte, which PostgreSQL text cannot hold"},
		{"header value UTF-8", outbox.Event{Topic: "t", Headers: map[string]string{"a": "\xff"}}, `headers["a"]`, "value is not valid UTF-8"},
		{"first bad header in order", outbox.Event{Topic: "t", Headers: map[string]string{"z": "\x00", "b": "\xff", "c": "\x00"}}, `headers["b"]`, "value is not valid UTF-8"},
		{"too many headers", outbox.Event{Topic: "t", Headers: manyHeaders}, "headers", "has 101 headers; at most 100 are allowed"},
		{"headers too big", outbox.Event{Topic: "t", Headers: bigHeaders}, "headers", "names and values total 72018 bytes; at most 65536 are allowed"},
		{"negative delay", outbox.Event{Topic: "t", Delay: -time.Second}, "delay", "must not be negative, got -1s"},
		{"delay and available_at", outbox.Event{Topic: "t", Delay: time.Second, AvailableAt: at}, "delay", "must not be set together with available_at; set one of Delay and AvailableAt"},
		{"negative max attempts", outbox.Event{Topic: "t", MaxAttempts: -1}, "max_attempts", "must not be negative, got -1"},
		{"huge max attempts", outbox.Event{Topic: "t", MaxAttempts: 1 << 31}, "max_attempts", "must be at most 2147483647, got 2147483648"},
	}
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Config{})
			for _, tc := range cases {
				// The bad event is the third of four; the others are valid.
				events := []outbox.Event{{Topic: "ok"}, {Topic: "ok", Payload: []byte(`{}`)}, tc.event, {Topic: "ok"}}
				ids, err := d.run(t, b, true, events...)
				var ve *outbox.ValidationError
				if !errors.As(err, &ve) {
					t.Errorf("%s: err = %v, want a *ValidationError", tc.name, err)
					continue
				}
				if ve.Index != 2 || ve.Field != tc.field || ve.Reason != tc.reason || ids != nil {
					t.Errorf("%s: got index %d field %q reason %q (ids %v); want 2, %q, %q", tc.name, ve.Index, ve.Field, ve.Reason, ids, tc.field, tc.reason)
				}
				if want := fmt.Sprintf("outbox: events[2].%s: %s", tc.field, tc.reason); err.Error() != want {
					t.Errorf("%s: message %q, want %q", tc.name, err, want)
				}
			}
			// Each transaction above committed after the refused call.
			if rows := readRows(t, b); len(rows) != 0 {
				t.Fatalf("%d rows written by refused calls, want 0", len(rows))
			}
		})
	}
}

func TestValidationAcceptsTheLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	headers := map[string]string{strings.Repeat("n", outbox.MaxHeaderNameBytes): "v"}
	for i := range 7 {
		headers[fmt.Sprint("h", i)] = strings.Repeat("v", outbox.MaxHeaderValueBytes)
	}
	// 257 + 7 × (2 + 8192) = 57,615 bytes, under 64 KiB; fill up to exactly 64 KiB.
	headers["pad"] = strings.Repeat("p", outbox.MaxHeadersBytes-57615-3)
	hundred := map[string]string{}
	for i := range outbox.MaxHeaders {
		hundred[fmt.Sprint("h", i)] = "é"
	}
	events := []outbox.Event{
		{Topic: strings.Repeat("t", outbox.MaxTopicBytes), Key: strings.Repeat("k", outbox.MaxKeyBytes), Headers: headers},
		{Topic: "ünïcode", Key: "ключ", Headers: hundred, MaxAttempts: 1<<31 - 1},
		{Topic: "t", Payload: []byte("not json at all\x00"), ContentType: "text/plain"},
	}
	for _, d := range drivers {
		if _, err := d.run(t, b, true, events...); err != nil {
			t.Fatalf("%s: events at the limits refused: %v", d.name, err)
		}
	}
	rows := readRows(t, b)
	if len(rows) != 6 || len(rows[0].headers) != 9 || rows[0].headers["pad"] != headers["pad"] || len(rows[1].headers) != 100 {
		t.Fatalf("stored %d rows; headers of the first two: %d and %d", len(rows), len(rows[0].headers), len(rows[1].headers))
	}
}
