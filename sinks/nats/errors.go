package nats

import (
	"context"
	"errors"
	"fmt"
	"net"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// ErrNoStream is reported, wrapped in sinks.Unavailable, for an event whose
// subject no JetStream stream covers: the stream lookup found none, or the
// publish got "nats: no response from stream". A missing stream is a setup
// error that every event to the subject meets, so the relay pauses the sink
// instead of spending the events' attempts until they dead-letter; the
// message names the subject, and the sink resumes once a stream covers it.
var ErrNoStream = errors.New("nats: no JetStream stream covers the subject")

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("nats: sink closed")

// unavailableErrs are the nats.go errors that mean the server, not the
// message, is the problem.
var unavailableErrs = []error{
	natsgo.ErrConnectionClosed, natsgo.ErrConnectionDraining, natsgo.ErrConnectionReconnecting,
	natsgo.ErrReconnectBufExceeded, natsgo.ErrDisconnected, natsgo.ErrNoServers,
	natsgo.ErrAuthorization, natsgo.ErrAuthExpired, natsgo.ErrAuthRevoked, natsgo.ErrAccountAuthExpired,
	natsgo.ErrSecureConnRequired, natsgo.ErrSecureConnWanted, natsgo.ErrTLS, natsgo.ErrConnectionNotTLS,
	natsgo.ErrStaleConnection, natsgo.ErrMaxConnectionsExceeded, natsgo.ErrMaxAccountConnectionsExceeded,
	natsgo.ErrInvalidConnection, natsgo.ErrNoInfoReceived, natsgo.ErrHeadersNotSupported,
	jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount, ErrClosed,
}

// classify marks err as Unavailable, Permanent or leaves it retryable.
func classify(err error) error {
	if err == nil || sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	for _, target := range unavailableErrs {
		if errors.Is(err, target) {
			return sinks.Unavailable(err)
		}
	}
	var netErr net.Error
	if sinkconfig.IsTLSError(err) || errors.As(err, &netErr) && !errors.Is(err, context.DeadlineExceeded) {
		return sinks.Unavailable(err)
	}
	switch {
	case errors.Is(err, natsgo.ErrMaxPayload):
		return sinks.Permanent(fmt.Errorf("%w (over the server's max_payload)", err))
	case errors.Is(err, natsgo.ErrBadSubject), errors.Is(err, natsgo.ErrBadHeaderMsg):
		return sinks.Permanent(err)
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return sinks.Unavailable(fmt.Errorf("%w: %w (the stream may be missing or have no leader)", ErrNoStream, err))
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return fmt.Errorf("%w: no PubAck within ack_timeout; the message may have been stored, "+
			"and a retry inside the stream's duplicate window is dropped as a duplicate", err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return sinks.Permanent(fmt.Errorf("%w (over the stream's max_msg_size)", err))
	}
	return err
}
