package awssink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("aws: sink closed")

// unavailableCodes are the error codes that say the sink's setup is the
// problem whatever the event: credentials, permissions, a queue or topic
// that does not exist, a KMS key that cannot be used. The relay pauses the
// sink instead of spending the events' attempts.
var unavailableCodes = map[string]bool{
	"QueueDoesNotExist": true, "AWS.SimpleQueueService.NonExistentQueue": true,
	"NotFound": true, "NotFoundException": true,
	"InvalidClientTokenId": true, "SignatureDoesNotMatch": true, "IncompleteSignature": true,
	"MissingAuthenticationToken": true, "UnrecognizedClientException": true,
	"ExpiredToken": true, "ExpiredTokenException": true, "RequestExpired": true,
	"AccessDenied": true, "AccessDeniedException": true, "AuthorizationError": true,
	"InvalidSecurity": true, "AWS.SimpleQueueService.UnsupportedOperation": true,
	"KMSDisabled": true, "KMSNotFound": true, "KMSAccessDenied": true, "KMSInvalidState": true,
	"KMS.DisabledException": true, "KMS.NotFoundException": true, "KMS.AccessDeniedException": true,
	"KMS.InvalidStateException": true, "KMSOptInRequired": true, "KMS.OptInRequired": true,
}

// permanentCodes are request errors no retry fixes: the request as built
// from the events is refused.
var permanentCodes = map[string]bool{
	"InvalidMessageContents": true, "MessageTooLong": true, "BatchRequestTooLong": true,
	"InvalidParameterValue": true, "InvalidParameter": true, "ParameterValueInvalid": true,
	"InvalidAttributeName": true, "InvalidAttributeValue": true, "ValidationError": true,
	"ValidationException": true, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct": true,
}

// Classify marks err, the error of a whole request to what (a queue or
// topic, named in the message), as Unavailable, Permanent or leaves it
// retryable.
func Classify(err error) error {
	if err == nil || sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (the messages may have been sent)", err)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch code := apiErr.ErrorCode(); {
		case unavailableCodes[code]:
			return sinks.Unavailable(err)
		case permanentCodes[code]:
			return sinks.Permanent(err)
		}
		return err // throttling, service errors: retried
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.As(err, &dnsErr), sinkconfig.IsTLSError(err):
		// Nothing was sent: the endpoint is what failed.
		return sinks.Unavailable(err)
	}
	var respErr *smithyhttp.ResponseError
	if errors.As(err, &respErr) {
		// An answer the client could not decode (an emulator's or a
		// proxy's HTML page): its status says what it is.
		if s := respErr.HTTPStatusCode(); s == 401 || s == 403 || s == 404 {
			return sinks.Unavailable(err)
		}
	}
	// A connection lost during a request: the messages may have been
	// sent, the event is retried and consumers drop copies by id.
	return err
}

// CheckError classifies the error of a check: a check is about the
// destination as a whole, so what is left retryable is Unavailable too.
func CheckError(err error) error {
	err = Classify(err)
	if sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	return sinks.Unavailable(err)
}

// EntryError returns the error of one entry of a batch the service
// refused, from its code, message and fault side: a sender fault (invalid
// contents, too large) is permanent unless its code says the setup is
// wrong; the service's own faults (throttling, internal errors) are
// retried.
func EntryError(code, message string, senderFault bool) error {
	err := fmt.Errorf("refused with %s: %s", clean(code, 64), clean(message, 256))
	switch {
	case unavailableCodes[code]:
		return sinks.Unavailable(err)
	case senderFault:
		return sinks.Permanent(err)
	}
	return err
}

// clean bounds a peer's text and drops control characters before it
// reaches a log or the database.
func clean(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) > limit {
		s = strings.ToValidUTF8(s[:limit], "") + "…"
	}
	return s
}
