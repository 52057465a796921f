package webhook

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
)

// isTLSError reports whether err comes from a failed TLS handshake: an
// invalid or untrusted certificate, a peer that does not speak TLS, or an
// alert from the server (such as a refused or missing client certificate).
// net/http replaces the tls.RecordHeaderError of a plain HTTP server by an
// error of its own, recognised by its text.
func isTLSError(err error) bool {
	if strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return true
	}
	var certErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var opErr *net.OpError
	return errors.As(err, &certErr) || errors.As(err, &recErr) ||
		errors.As(err, &opErr) && opErr.Op == "remote error"
}
