package relay

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeHeaders feeds the headers column decoder whatever JSON (or not)
// a hand-written INSERT could leave there: it must never panic, must refuse
// what is not a JSON object, and must keep every key of an object, string
// values as they are. Seeds: testdata/fuzz/FuzzDecodeHeaders and below.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `{"n":5,"o":{"x":[1,null]},"b":true}`, `[]`, `null`, `"x"`,
		`{"a":"\u0000"}`, `{"a":"\ud800"}`, `{"a":1e999}`, `{"a":"b","a":"c"}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := decodeHeaders(raw)
		var obj map[string]json.RawMessage
		objErr := json.Unmarshal(raw, &obj)
		if err != nil {
			if objErr == nil {
				t.Fatalf("refused a JSON object %q: %v", raw, err)
			}
			return
		}
		if objErr != nil {
			t.Fatalf("accepted %q, which is not a JSON object", raw)
		}
		if len(got) != len(obj) {
			t.Fatalf("%q: %d headers decoded, %d keys in the object", raw, len(got), len(obj))
		}
		for k, v := range obj {
			var s string
			if json.Unmarshal(v, &s) == nil {
				if got[k] != s {
					t.Fatalf("%q: header %q = %q, want %q", raw, k, got[k], s)
				}
			} else if got[k] != string(v) {
				t.Fatalf("%q: header %q = %q, want the JSON text %q", raw, k, got[k], v)
			}
			if utf8.ValidString(string(raw)) && !utf8.ValidString(got[k]) {
				t.Fatalf("%q: header %q decoded to invalid UTF-8", raw, k)
			}
		}
	})
}
