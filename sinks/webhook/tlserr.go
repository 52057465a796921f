package webhook

import (
	"strings"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// isTLSError reports whether err comes from a failed TLS handshake (see
// sinkconfig.IsTLSError). net/http replaces the tls.RecordHeaderError of a
// plain HTTP server by an error of its own, recognised by its text.
func isTLSError(err error) bool {
	return sinkconfig.IsTLSError(err) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}
