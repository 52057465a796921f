// Package sinks is the contract between the relay and a sink: the Sink
// interface and its optional companions (ConcurrentPublisher, Checker,
// DestinationChecker), the classes of failure a sink reports (Permanent,
// Unavailable, RetryAfter, ErrSkipped, ErrNotSent, TooLarge), and Results,
// the helper that keeps the contract's rules for a sink. It also holds two
// sinks with no peer behind them: Stdout (for trying Herald out) and
// Discard (for benchmarks). Sinks that talk to a peer live in sub-packages,
// one per protocol, and all pass the sinktest suite; what they share
// besides the contract is in sinkconfig.
//
// # What a sink must do
//
// Publish returns exactly one result per event, at the event's index: nil
// once the peer has the event, or an error of the class that says what the
// relay should do:
//
//   - Permanent (and TooLarge): no retry can fix it; the event is
//     dead-lettered at once.
//   - Unavailable: the peer or the sink's settings are at fault, not the
//     event (connection refused, credentials refused, a missing queue); the
//     relay pauses the sink and counts no attempt.
//   - RetryAfter: retry no sooner than the peer asked.
//   - ErrSkipped, ErrNotSent: the event was not sent (behind a failed event
//     of its key, or the call ended first); no attempt is counted.
//   - any other error: retried with backoff, the attempt counted.
//
// The events of one key are sent in slice order. Once an event of a key
// failed, the later events of that key in the call are not sent: the relay
// holds them back behind the failed one anyway, and sending them would put
// a copy before its predecessor. Once the peer is found unavailable, and
// once the call's context ended, nothing more is sent. A sink that
// pipelines may learn of a failure after it sent later events of the key;
// it reports those as they went.
//
// # Results
//
// A sink keeps these rules with Results, made once per call: it asks
// Blocked before it sends each event, and sets each result (Delivered, Fail,
// FailRest) as soon as it knows it. Results names the event and where it
// went in every error ("publishing event ID to WHERE: cause"), and returns
// the call's results with Errors. A sink that sends over a connection gets
// it with Connect, which connects only for a call that has something to
// send and makes a failure to connect every event's result. A sink that
// sends one event at a time hands the sending to Results.PublishEach, which
// sends a key's events in order and different keys at once, as many as a
// Limiter shared by all the sink's calls allows.
//
// # Early results
//
// The relay asks a call for each result as soon as it is known
// (WithResultFunc), so that an event still in flight holds back only its
// own key: it records the others' results while that one waits, and hands
// it over to the sink's queue when its time is up. Results reports each
// result the moment it is set, so a sink reports early by setting results
// as its peer answers: per acknowledgement (a NATS PubAck, an MQTT PUBACK,
// a RabbitMQ confirm), per produce request or batch request (Kafka,
// SQS/SNS), per message (email, webhook). A result reported early is final
// and is the one Publish returns.
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
// marked it with). Events sharing a Key must not be reordered, and once one
// of them failed the later ones in the call are not sent (ErrSkipped); see
// the package documentation for the rules, and Results, which keeps them.
// Publish must honour ctx's deadline and should report each result as soon
// as it knows it (WithResultFunc). The relay never calls Publish
// concurrently on one Sink, unless it implements ConcurrentPublisher.
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

// classified is err marked with the failure class C: a type per class, so
// that an error may carry several classes and errors.As finds each.
type classified[C any] struct{ err error }

func (e classified[C]) Error() string { return e.err.Error() }
func (e classified[C]) Unwrap() error { return e.err }

// The failure classes.
type (
	permanent   struct{}
	unavailable struct{}
)

func mark[C any](err error) error {
	if err == nil {
		return nil
	}
	return classified[C]{err}
}

func isMarked[C any](err error) bool {
	var c classified[C]
	return errors.As(err, &c)
}

// Permanent marks err as a failure that retrying cannot fix (a rejected
// message, a payload over the destination's limit): the event is
// dead-lettered at once. Permanent(nil) is nil.
func Permanent(err error) error { return mark[permanent](err) }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return isMarked[permanent](err) }

// Unavailable marks err as a failure of the destination itself rather than of
// the event (connection refused, DNS failure, TLS handshake, authentication
// refused, broker unavailable). The relay pauses the sink with backoff and
// does not count the attempt against the event. Unavailable(nil) is nil.
func Unavailable(err error) error { return mark[unavailable](err) }

// IsUnavailable reports whether err was marked with Unavailable.
func IsUnavailable(err error) bool { return isMarked[unavailable](err) }

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

// TooLarge returns the permanent error for a message of size bytes over a
// sink's limit of limit bytes: retrying cannot shrink it.
func TooLarge(size, limit int) error {
	return Permanent(fmt.Errorf("message of %d bytes exceeds the sink's limit of %d bytes", size, limit))
}
