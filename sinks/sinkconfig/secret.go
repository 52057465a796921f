package sinkconfig

import (
	"log/slog"
	"net/url"
	"strings"
)

// Secret is a configuration value that must never be printed: a password, a
// token, a webhook signing secret. It formats, logs and marshals as
// "[redacted]"; call Reveal where the value is really needed.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer, so %#v redacts too.
func (s Secret) GoString() string { return `sinkconfig.Secret("` + s.String() + `")` }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON implements json.Marshaler.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// MarshalText implements encoding.TextMarshaler.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// RedactURL returns raw fit for logs and errors: the user information of a
// URL (which may hold a password or token) becomes "[redacted]". A URL
// that cannot be parsed keeps only what follows its last "@" (user
// information ends there); one with no "@" holds none and is kept whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		// Unparsable, or parsed without user information although it may
		// hold some ("user:password@host" lacks a scheme).
		if i := strings.LastIndex(raw, "@"); i >= 0 {
			return redacted + "@" + raw[i+1:]
		}
		return raw
	}
	u.User = nil
	return strings.Replace(u.String(), "://", "://"+redacted+"@", 1)
}
