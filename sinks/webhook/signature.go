package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Standard Webhooks header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// ErrBadSignature is wrapped by Verify's error when the signature headers
// are missing or malformed, or when no v1 signature matches.
var ErrBadSignature = errors.New("webhook: bad signature")

// ErrStaleTimestamp is wrapped by Verify's error when webhook-timestamp is
// further from now than the tolerance allows (a replayed request).
var ErrStaleTimestamp = errors.New("webhook: timestamp outside tolerance")

// appendSignatures appends the webhook-signature header value for body: one
// "v1,<base64 HMAC-SHA256>" per key, space separated. The signed content is
// id + "." + timestamp + "." + body.
func appendSignatures(dst []byte, keys [][]byte, id, timestamp string, body []byte) []byte {
	var sum [sha256.Size]byte
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = append(dst, "v1,"...)
		dst = base64.StdEncoding.AppendEncode(dst, sign(sum[:0], k, id, timestamp, body))
	}
	return dst
}

// sign appends the HMAC-SHA256 of id.timestamp.body under key to dst.
func sign(dst, key []byte, id, timestamp string, body []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(dst)
}

// Verify checks a request this sink signed, for consumers written in Go:
// header holds the webhook-id, webhook-timestamp and webhook-signature
// headers and body the raw request body. It returns nil when one v1
// signature matches secret (a "whsec_…" value) and the timestamp is within
// tolerance of now; tolerance <= 0 skips the timestamp check. Errors wrap
// ErrBadSignature or ErrStaleTimestamp, except for an invalid secret; they
// never include the secret.
func Verify(secret sinkconfig.Secret, header http.Header, body []byte, tolerance time.Duration) error {
	key, err := decodeSecret(secret)
	if err != nil {
		return fmt.Errorf("webhook: secret: %w", err)
	}
	id, ts, sigs := header.Get(HeaderID), header.Get(HeaderTimestamp), header.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("%w: missing %s, %s or %s header", ErrBadSignature, HeaderID, HeaderTimestamp, HeaderSignature)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is not a unix time in seconds", ErrBadSignature, HeaderTimestamp)
	}
	if tolerance > 0 {
		// Compare in seconds so that no timestamp overflows a Duration.
		skew := time.Now().Unix() - unix
		limit := int64(tolerance / time.Second)
		if skew > limit || skew < -limit {
			return fmt.Errorf("%w: %s is %d seconds from now, tolerance is %s", ErrStaleTimestamp, HeaderTimestamp, skew, tolerance)
		}
	}
	want := sign(nil, key, id, ts, body)
	for _, entry := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 signature matches", ErrBadSignature)
}
