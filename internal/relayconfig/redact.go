package relayconfig

import (
	"net/url"
	"regexp"
	"strings"
)

const redactedPassword = "xxxxx"

var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactURL returns a PostgreSQL connection string fit for logs and errors:
// the password of a postgres:// URL (in the user info or a password query
// parameter) or of a key=value string is replaced by "xxxxx". A URL that
// cannot be parsed is replaced entirely, since its password cannot be found.
func RedactURL(conn string) string {
	if !strings.Contains(conn, "://") {
		return kvPassword.ReplaceAllString(conn, "${1}"+redactedPassword)
	}
	u, err := url.Parse(conn)
	if err != nil {
		return "[unparsable connection URL]"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), redactedPassword)
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redactedPassword)
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// urlPassword returns the password in a connection string, if one is found.
func urlPassword(conn string) string {
	if !strings.Contains(conn, "://") {
		m := kvPassword.FindStringSubmatch(conn)
		if m == nil {
			return ""
		}
		return strings.Trim(m[2], "'")
	}
	u, err := url.Parse(conn)
	if err != nil {
		return ""
	}
	if p, ok := u.User.Password(); ok {
		return p
	}
	return u.Query().Get("password")
}

// ScrubPassword removes the password of connection string conn from text
// (an error message from a driver, say), as a second line of defence behind
// RedactURL.
func ScrubPassword(text, conn string) string {
	p := urlPassword(conn)
	if len(p) < 3 {
		// Too short to replace without mangling the text; drivers do not
		// print passwords, this is a safeguard for longer ones.
		return text
	}
	text = strings.ReplaceAll(text, p, redactedPassword)
	if esc := url.QueryEscape(p); esc != p {
		text = strings.ReplaceAll(text, esc, redactedPassword)
	}
	return text
}
