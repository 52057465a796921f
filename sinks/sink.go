// Package sinks defines the Sink interface the relay publishes through, the
// errors a sink reports, and two sinks with no broker behind them: Stdout (for
// trying Herald out) and Discard (for benchmarks). Sinks that talk to a broker
// live in sub-packages, one per protocol, and all pass the sinktest suite.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Event is one outbox row as a sink sees it.
type Event struct {
	// ID is the event's UUID in canonical text form: the dedupe key consumers
	// use (Kafka header, Nats-Msg-Id, webhook-id, Message-ID).
	ID string
	// Seq is the row's insert sequence number; events of one key are handed
	// to a sink in ascending Seq.
	Seq int64
	// Topic is the event's topic as written by the application.
	Topic string
	// Key orders events: those with the same key are published in order.
	// Empty means no key.
	Key string
	// Destination is where the sink should publish: a Kafka topic, a NATS
	// subject… It is the route's rendered destination template, or Topic.
	Destination string
	// Payload is the body: JSON text when ContentType is JSON, bytes otherwise.
	Payload []byte
	// ContentType is the payload's media type, never empty.
	ContentType string
	// Headers are the application's string headers (may be nil).
	Headers map[string]string
	// CreatedAt is when the event was written.
	CreatedAt time.Time
	// Attempt counts deliveries of this event to this sink, from 1.
	Attempt int
}

// Sink publishes batches of events to one destination system.
//
// Publish delivers events in slice order and returns exactly one error per
// event, at the same index: nil when the destination acknowledged the event,
// otherwise an error the relay classifies with IsPermanent and IsUnavailable
// (anything else is retried with backoff, or after the delay RetryAfter
// marked it with). Events sharing a Key must not be
// reordered. What a failure means for the later events of its key is the
// relay's to decide: whatever the sink reports for them, they wait behind
// the failed one and are sent again after it. So a sink should not send
// them once one failed, when it can tell (report ErrSkipped): that spares a
// duplicate arriving out of order. Publish must honour ctx's deadline. The
// relay never calls Publish concurrently on one Sink, unless it implements
// ConcurrentPublisher.
//
// Close flushes anything buffered and releases connections.
type Sink interface {
	Name() string
	Publish(ctx context.Context, events []Event) []error
	Close(ctx context.Context) error
}

// ConcurrentPublisher is implemented by a Sink whose Publish may run in
// several goroutines at once, each call with its own events. The relay's
// workers then publish in parallel instead of taking turns. Calls that run
// at the same time never carry events of the same key.
type ConcurrentPublisher interface {
	Sink
	// PublishesConcurrently reports whether concurrent Publish calls are safe.
	PublishesConcurrently() bool
}

// Checker is implemented by a Sink that can tell, without publishing,
// whether its destination answers: it connects (when it is not connected)
// and checks what it can of its settings against the destination (a NATS
// server offering JetStream, Kafka brokers answering a metadata request,
// an SMTP server accepting EHLO and the credentials). The relay checks its
// sinks at start and then periodically, and reports the failing ones on
// /readyz; a sink that cannot be checked usefully does not implement it
// (the webhook: a request would be an event the endpoint must answer, and
// a TCP connect proves little behind a load balancer).
type Checker interface {
	Sink
	// Check returns nil when the destination answers, else an error
	// saying why, which names neither secrets nor event data. It must
	// honour ctx's deadline and may run while Publish does.
	Check(ctx context.Context) error
}

// DestinationChecker is implemented by a Checker that can also check
// destinations known before any event (a route's fixed NATS subject or
// Kafka topic): that a JetStream stream covers the subject, that the topic
// exists. The relay calls it, after Check passed, with the destinations
// its routes fix; destinations rendered from events are checked by
// publishing.
type DestinationChecker interface {
	Checker
	// CheckDestinations reports every destination that cannot be
	// published to, or why it could not check.
	CheckDestinations(ctx context.Context, destinations ...string) error
}

// ErrSkipped is reported for an event a sink did not try because an earlier
// event of the same key failed in the same call. The relay counts no
// attempt for it.
var ErrSkipped = errors.New("sinks: not attempted: an earlier event of the same key failed")

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as a failure that retrying cannot fix (a rejected
// message, a payload over the destination's limit): the event is
// dead-lettered at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as a failure of the destination itself rather than of
// the event (connection refused, DNS failure, TLS handshake, authentication
// refused, broker unavailable). The relay pauses the sink with backoff and
// does not count the attempt against the event. Unavailable(nil) is nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

// IsUnavailable reports whether err was marked with Unavailable.
func IsUnavailable(err error) bool {
	var u unavailableError
	return errors.As(err, &u)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.delay)
}
func (e retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as a retryable failure for which the destination asked
// to be left alone for d (an HTTP Retry-After, a broker's throttle time). The
// relay schedules the event's next attempt d after the failure, capped at its
// backoff maximum, instead of its own backoff. The attempt still counts.
// A d of 0 or less leaves the delay to the backoff; RetryAfter(nil, d) is
// nil.
//
// The mark is found through wrapping like Permanent and Unavailable, and
// those take precedence: Permanent(RetryAfter(err, d)) is dead-lettered at
// once, Unavailable(RetryAfter(err, d)) pauses the sink.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return retryAfterError{err: err, delay: max(d, 0)}
}

// RetryDelay returns the delay err was marked with by RetryAfter (the
// outermost mark when there are several), and whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	var r retryAfterError
	if !errors.As(err, &r) {
		return 0, false
	}
	return r.delay, true
}

// Fill returns a slice of n copies of err: the result of a call that failed
// as a whole.
func Fill(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// ContentTypeJSON is the content type of JSON payloads.
const ContentTypeJSON = "application/json"

// IsJSON reports whether a content type denotes JSON (application/json or a
// +json suffix type), ignoring parameters.
func IsJSON(contentType string) bool {
	mt := contentType
	for i := 0; i < len(mt); i++ {
		if mt[i] == ';' {
			mt = mt[:i]
			break
		}
	}
	for len(mt) > 0 && mt[len(mt)-1] == ' ' {
		mt = mt[:len(mt)-1]
	}
	return mt == ContentTypeJSON || len(mt) > 5 && mt[len(mt)-5:] == "+json"
}

// TooLarge returns the permanent error for a payload over a sink's limit,
// naming the event, the size and the limit.
func TooLarge(e Event, size, limit int) error {
	return Permanent(fmt.Errorf("event %s: message of %d bytes exceeds the sink's limit of %d bytes", e.ID, size, limit))
}
