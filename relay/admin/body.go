package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
)

// maxBodyDepth bounds how deeply a request body nests: a Selection is one
// object holding a list of strings.
const maxBodyDepth = 8

// decodeBody decodes one JSON object from r into v strictly: an unknown
// field, a key repeated in one object, nesting deeper than maxBodyDepth or
// data after the value is an error. encoding/json alone keeps the last of
// repeated keys and matches keys to fields ignoring case, so
// {"all": false, "ALL": true} would select everything.
func decodeBody(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	var bad *keyError
	if err := checkKeys(json.NewDecoder(bytes.NewReader(data)), "", 0); errors.As(err, &bad) {
		return err
	}
	// Any other error is a syntax error, which the decoder below words.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON object")
	}
	return nil
}

// keyError is a body refused for the shape of its keys.
type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }

// checkKeys reads one JSON value from dec and reports, as a *keyError, the
// first key that repeats within an object (compared as encoding/json
// matches fields) or nesting deeper than maxBodyDepth. path locates the
// value in errors; other errors are the decoder's syntax errors.
func checkKeys(dec *json.Decoder, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if depth == maxBodyDepth {
		return &keyError{fmt.Sprintf("nested deeper than %d levels", maxBodyDepth)}
	}
	switch delim {
	case '{':
		seen := map[string]string{} // folded key → key as written
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if first, dup := seen[foldKey(key)]; dup {
				msg := fmt.Sprintf("duplicate key %q", key)
				if first != key {
					msg += fmt.Sprintf(" (the same field as %q: keys match fields ignoring case)", first)
				}
				if path != "" {
					msg += " in " + path
				}
				return &keyError{msg}
			}
			seen[foldKey(key)] = key
			if err := checkKeys(dec, joinPath(path, key), depth+1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := checkKeys(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// foldKey maps key to one representative of the keys encoding/json
// treats as the same field name (equal under Unicode simple case folding,
// as strings.EqualFold compares).
func foldKey(key string) string {
	var b strings.Builder
	for _, r := range key {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
