package relay

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// cleaned is the text storedError must keep of msg, restated rune by rune
// rather than with the calls storedError makes: every valid rune but NUL as
// it is, NUL as U+FFFD, and each run of bytes that are not valid UTF-8 as
// one U+FFFD.
func cleaned(msg string) string {
	var b strings.Builder
	inInvalid := false
	for i := 0; i < len(msg); {
		r, size := utf8.DecodeRuneInString(msg[i:])
		i += size
		switch {
		case r == utf8.RuneError && size == 1:
			if !inInvalid {
				b.WriteRune(utf8.RuneError)
			}
			inInvalid = true
			continue
		case r == 0:
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteRune(r)
		}
		inInvalid = false
	}
	return b.String()
}

// FuzzStoredError feeds storedError the error texts a hostile peer could
// make a sink report (NUL bytes, invalid UTF-8, overlong and surrogate
// encodings, multi-byte runes and invalid runs straddling the 2048-byte
// cut, texts already ending in an ellipsis). What it stores must be valid
// UTF-8 without NUL, at most maxErrorBytes plus the ellipsis, and the
// cleaned text itself when that fits, or else the longest prefix of the
// cleaned text that ends on a rune boundary within maxErrorBytes, followed
// by "…".
func FuzzStoredError(f *testing.F) {
	if storedError(nil).Valid {
		f.Fatal("storedError(nil) is not NULL")
	}
	a := func(n int) string { return strings.Repeat("a", n) }
	for _, s := range []string{
		"", "HTTP 503: upstream down", "done…", "a\x00b", "\x00", "\x00\x00",
		"\xff", "\xff\xfe\xfd", "\xff\x00\xff", "\xed\xa0\x80", "\xc0\xaf", "\xe2\x82", "ok \xf0\x9f\x98",
		"\uFFFD\xff\uFFFD",
		a(maxErrorBytes), a(maxErrorBytes + 1), a(maxErrorBytes-1) + "\x00",
		a(maxErrorBytes-1) + "€",            // a 3-byte rune across the cut
		a(maxErrorBytes-2) + "😀tail",        // a 4-byte rune across the cut
		a(maxErrorBytes-3) + "😀",            // a 4-byte rune ending one byte past the limit
		a(maxErrorBytes-4) + "😀",            // a 4-byte rune ending at the limit
		a(maxErrorBytes-1) + "\xff\xff\xff", // an invalid run at the cut, cleaned to 3 bytes
		a(maxErrorBytes-1) + "\x00b",        // NUL at the cut, cleaned to 3 bytes
		a(maxErrorBytes-3) + "\x00",         // NUL cleaned to end exactly at the limit
		strings.Repeat("é\x00\xff", 1000),
		strings.Repeat("\x00", 3000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		got := storedError(errors.New(msg))
		if !got.Valid {
			t.Fatalf("%q: stored as NULL", msg)
		}
		s := got.String
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			t.Fatalf("%q: stored %q, which is not valid UTF-8 without NUL", msg, s)
		}
		if len(s) > maxErrorBytes+len("…") {
			t.Fatalf("%q: stored %d bytes, more than %d and the ellipsis", msg, len(s), maxErrorBytes)
		}
		want := cleaned(msg)
		if len(want) <= maxErrorBytes {
			if s != want {
				t.Fatalf("%q: stored %q, want %q", msg, s, want)
			}
			return
		}
		kept, ok := strings.CutSuffix(s, "…")
		if !ok || !strings.HasPrefix(want, kept) || len(kept) > maxErrorBytes {
			t.Fatalf("%q: stored %q, want a prefix of %q of at most %d bytes and an ellipsis", msg, s, want, maxErrorBytes)
		}
		if !utf8.RuneStart(want[len(kept)]) {
			t.Fatalf("%q: cut at byte %d, inside a rune", msg, len(kept))
		}
		for i := len(kept) + 1; i <= maxErrorBytes; i++ {
			if utf8.RuneStart(want[i]) {
				t.Fatalf("%q: kept %d bytes, but the rune boundary at %d is within the limit", msg, len(kept), i)
			}
		}
	})
}
