package sinkconfig

import (
	"encoding/json"
	"errors"
	"fmt"
)

// MaxJSONDepth is how deeply arrays and objects may nest in a JSON payload
// a sink encodes: Go's encoding/json refuses deeper values, although
// PostgreSQL's json type stores them.
const MaxJSONDepth = 10000

// CheckJSON returns nil when payload is one valid JSON value that
// encoding/json accepts, and otherwise an error saying what is wrong: the
// nesting beyond MaxJSONDepth, or the syntax error and where it is. Sinks
// that embed or parse JSON payloads call it to explain a refusal.
func CheckJSON(payload []byte) error {
	if json.Valid(payload) {
		return nil
	}
	if at := tooDeep(payload, MaxJSONDepth); at >= 0 {
		return fmt.Errorf("payload nests arrays and objects deeper than %d levels (level %d opens at byte %d), the most the JSON encoder accepts",
			MaxJSONDepth, MaxJSONDepth+1, at)
	}
	var syntax *json.SyntaxError
	if err := json.Unmarshal(payload, new(json.RawMessage)); errors.As(err, &syntax) {
		return fmt.Errorf("payload is not valid JSON: %s (at byte %d)", syntax, syntax.Offset)
	}
	return errors.New("payload is not valid JSON")
}

// tooDeep returns the offset of the bracket that opens nesting level
// limit+1 in payload, or -1 when payload never nests that deep. Brackets
// inside strings do not count.
func tooDeep(payload []byte, limit int) int {
	depth, inString, escaped := 0, false, false
	for i, c := range payload {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > limit {
				return i
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return -1
}
