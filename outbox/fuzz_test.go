package outbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidate checks that validation never panics and that whatever it
// accepts can be stored: text without NUL and valid UTF-8, within the limits,
// JSON payloads that parse, headers that survive their JSON encoding. Seeds
// are in testdata/fuzz/FuzzValidate.
func FuzzValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, topic, key, contentType string, payload []byte, headerName, headerValue string) {
		e := Event{Topic: topic, Key: key, ContentType: contentType, Payload: payload,
			Headers: map[string]string{headerName: headerValue}}
		err := e.validate(0)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Index != 0 || ve.Field == "" || ve.Reason == "" ||
				!strings.HasPrefix(err.Error(), "outbox: events[0].") {
				t.Fatalf("error %v is not a well-formed *ValidationError", err)
			}
			return
		}
		for _, s := range []string{topic, key, contentType, headerName, headerValue} {
			if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted text PostgreSQL cannot store: %q", s)
			}
		}
		if topic == "" || len(topic) > MaxTopicBytes || len(key) > MaxKeyBytes || headerName == "" ||
			len(headerName) > MaxHeaderNameBytes || len(headerValue) > MaxHeaderValueBytes {
			t.Fatalf("accepted an event over a limit: %+v", e)
		}
		if e.payloadIsJSON() && len(payload) > 0 && (!json.Valid(payload) || !utf8.Valid(payload)) {
			t.Fatalf("accepted invalid JSON %q as %q", payload, contentType)
		}
		cols, err := encode([]Event{e}, nil)
		if err != nil {
			t.Fatalf("encoding an accepted event: %v", err)
		}
		var headers map[string]string
		if err := json.Unmarshal(cols.headers[0], &headers); err != nil || headers[headerName] != headerValue || len(headers) != 1 {
			t.Fatalf("headers %q do not round-trip: %v, %v", cols.headers[0], headers, err)
		}
		if json, bin := cols.payloads[0] != nil, cols.payloadBins[0] != nil; json == bin && len(payload) > 0 {
			t.Fatalf("payload goes to both or neither column (json %v, bin %v)", json, bin)
		}
	})
}
