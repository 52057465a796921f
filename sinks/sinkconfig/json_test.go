package sinkconfig_test

import (
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks/sinkconfig"
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
		nested(sinkconfig.MaxJSONDepth, ""),
		nested(sinkconfig.MaxJSONDepth-1, `{"s": "[[[{{\"[[", "a": 1}`),
		[]byte(`"\\"`),
	} {
		if err := sinkconfig.CheckJSON(ok); err != nil {
			t.Errorf("CheckJSON(%.40s…) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct {
		payload []byte
		want    string
	}{
		{nested(sinkconfig.MaxJSONDepth+1, ""), "deeper than 10000 levels (level 10001 opens at byte 10000)"},
		{nested(sinkconfig.MaxJSONDepth, `{"a": 1}`), "deeper than 10000 levels"},
		{append(nested(sinkconfig.MaxJSONDepth+5, ""), '}'), "deeper than 10000 levels"},
		{[]byte(`{"a": 1,}`), "payload is not valid JSON: invalid character '}' looking for beginning of object key string (at byte 9)"},
		{[]byte(`["[[[[[[`), "payload is not valid JSON: unexpected end of JSON input"},
		{nil, "payload is not valid JSON"},
	} {
		err := sinkconfig.CheckJSON(tc.payload)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckJSON(%.40s…) = %v, want an error containing %q", tc.payload, err, tc.want)
		}
	}
}
