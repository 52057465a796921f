package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("redis: sink closed")

// dialError is a failure to connect or to complete the TLS handshake:
// nothing was sent.
type dialError struct{ err error }

func (e dialError) Error() string { return "connecting: " + e.err.Error() }
func (e dialError) Unwrap() error { return e.err }

// unavailableCodes are the error codes (the first word of a server error)
// that say the server or the sink's setup is the problem, whatever the
// event: authentication and ACLs, a server loading or read-only, a
// cluster node (this sink does not follow redirects), memory full.
var unavailableCodes = map[string]bool{
	"NOAUTH": true, "WRONGPASS": true, "NOPERM": true,
	"LOADING": true, "MASTERDOWN": true, "READONLY": true, "BUSY": true,
	"OOM": true, "MOVED": true, "ASK": true, "CLUSTERDOWN": true,
}

// classify marks err as Unavailable, Permanent or leaves it retryable.
func classify(err error) error {
	if err == nil || sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	if errors.As(err, new(dialError)) {
		return sinks.Unavailable(err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (the entry may have been added)", err)
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		code, _, _ := strings.Cut(msg, " ")
		switch {
		case code == "WRONGTYPE":
			return sinks.Permanent(fmt.Errorf("%w (the key exists and is not a stream)", err))
		case unavailableCodes[code],
			strings.HasPrefix(msg, "ERR max number of clients"),
			strings.HasPrefix(msg, "ERR unknown command"),
			strings.HasPrefix(msg, "ERR AUTH"):
			return sinks.Unavailable(err)
		}
		return err
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" {
			return sinks.Unavailable(err)
		}
		return fmt.Errorf("%w (no reply in time: the entry may have been added)", err)
	}
	switch {
	case errors.Is(err, goredis.ErrClosed), errors.Is(err, ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		sinkconfig.IsTLSError(err), errors.As(err, &netErr):
		return sinks.Unavailable(err)
	}
	return err
}
