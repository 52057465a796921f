package sinks_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks"
)

// nested returns a JSON value of depth arrays inside one another, with
// inner at the bottom.
func nested(depth int, inner string) []byte {
	return []byte(strings.Repeat("[", depth) + inner + strings.Repeat("]", depth))
}

// TestCheckJSONSaysWhatIsWrong covers hostile JSON payloads that PostgreSQL
// stores but encoding/json refuses: nesting one level past MaxJSONDepth
// (brackets inside strings do not count), which must be reported as too
// deep, naming the limit, rather than as invalid JSON; and broken syntax,
// reported with its offset.
func TestCheckJSONSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, ok := range [][]byte{
		nested(sinks.MaxJSONDepth, ""),
		nested(sinks.MaxJSONDepth-1, `{"s": "[[[{{\"[[", "a": 1}`),
		[]byte(`"\\"`),
	} {
		if err := sinks.CheckJSON(ok); err != nil {
			t.Errorf("CheckJSON(%.40s…) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct {
		payload []byte
		want    string
	}{
		{nested(sinks.MaxJSONDepth+1, ""), "deeper than 10000 levels (level 10001 opens at byte 10000)"},
		{nested(sinks.MaxJSONDepth, `{"a": 1}`), "deeper than 10000 levels"},
		{append(nested(sinks.MaxJSONDepth+5, ""), '}'), "deeper than 10000 levels"},
		{[]byte(`{"a": 1,}`), "payload is not valid JSON: invalid character '}' looking for beginning of object key string (at byte 9)"},
		{[]byte(`["[[[[[[`), "payload is not valid JSON: unexpected end of JSON input"},
		{nil, "payload is not valid JSON"},
	} {
		err := sinks.CheckJSON(tc.payload)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckJSON(%.40s…) = %v, want an error containing %q", tc.payload, err, tc.want)
		}
	}
}

// TestStdoutExplainsDeepJSON covers the stdout sink given a JSON payload
// nested past MaxJSONDepth: the event fails permanently, saying it nests
// too deep, and the next event is still written.
func TestStdoutExplainsDeepJSON(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s := sinks.NewStdout("console", &out)
	events := []sinks.Event{
		{ID: "deep", Topic: "t", Destination: "t", ContentType: sinks.ContentTypeJSON, Payload: nested(sinks.MaxJSONDepth+1, "")},
		{ID: "fine", Topic: "t", Destination: "t", ContentType: sinks.ContentTypeJSON, Payload: []byte(`{"a":1}`)},
	}
	errs := s.Publish(context.Background(), events)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "deeper than 10000 levels") {
		t.Fatalf("deep payload: %v, want permanent saying it nests deeper than 10000 levels", errs[0])
	}
	if errs[1] != nil || !strings.Contains(out.String(), `"id":"fine"`) {
		t.Fatalf("next event: %v, output %q", errs[1], out.String())
	}
}
