// Package redis is Herald's Redis Streams sink: it appends each event to
// the stream named by its Destination (the event's topic unless a route's
// destination template says otherwise) with XADD.
//
// # Entries
//
// Every entry has the same six fields, in this order:
//
//	id            the event id (consumers dedupe by it)
//	topic         the event's topic
//	key           the event's ordering key ("" when it has none)
//	content_type  the payload's media type
//	headers       the event's headers as a JSON object of strings ({} when none)
//	payload       the payload, byte for byte
//
// The entry id is the server's (XADD *). With max_len, every XADD carries
// MAXLEN ~ max_len, so the stream keeps about that many newest entries.
//
// # Delivery and order
//
// Publish sends a whole batch as one pipeline on one connection, one round
// trip, and reads one reply per XADD: an event is reported delivered when
// the server answered its XADD with an entry id. One connection runs its
// commands in order, so events of one key reach their stream in slice
// order, and a call returns only after every reply, so order holds across
// calls too. An event refused before sending (no stream name, payload
// over max_payload) is not sent and the later events of its key in the
// call are not either (sinks.ErrSkipped). An event the server refuses is
// known only once the whole pipeline ran: the later events of its key were
// sent and are reported as they went; the relay holds them back behind
// the failed one whatever the sink reports, so they arrive again after
// it, and consumers drop the copies by id.
//
// The sink does not retry by itself (go-redis retries are off): a retried
// pipeline whose first replies were lost would append its entries twice.
//
// # Errors
//
//   - connection refused or lost, TLS failure, NOAUTH, WRONGPASS, NOPERM,
//     LOADING, READONLY, MASTERDOWN, BUSY, OOM, a cluster redirect (MOVED,
//     ASK: point the sink at a non-cluster endpoint), XADD unknown:
//     sinks.Unavailable (the relay pauses the sink without spending the
//     events' attempts).
//   - WRONGTYPE, the destination key exists and is not a stream: permanent
//     (dead-lettered). It is decided per destination, and destinations
//     come from events: one misnamed key must not stop every other stream
//     of the sink, and the dead letters can be replayed once the key is
//     renamed. Routes with a fixed destination are checked at start
//     (sinks.DestinationChecker) and /readyz names such a key.
//   - an empty destination, a payload over max_payload: permanent, not sent.
//   - no reply within timeout or the context's deadline: retryable (the
//     entry may have been added).
//   - any other server error: retryable, on that event only.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Sink appends events to Redis streams. Create it with New.
type Sink struct {
	name   string
	cfg    Config
	shown  string // the URL with its password redacted, for errors and logs
	client *goredis.Client
	logger *slog.Logger

	mu     sync.Mutex // guards closed
	closed bool
}

var (
	_ sinks.DestinationChecker  = (*Sink)(nil)
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily (Check or the first Publish), so a relay starts while Redis is
// down. Every connection is named herald/<name> (CLIENT SETNAME), so that
// CLIENT LIST shows the sink's connections. A nil logger means
// slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	opts, err := cfg.options()
	if err != nil {
		return nil, err
	}
	if cfg.Username != "" {
		opts.Username = cfg.Username
	}
	if cfg.Password != "" {
		opts.Password = cfg.Password.Reveal()
	}
	tlsCfg, err := cfg.TLS.Build("tls")
	if err != nil {
		return nil, err
	}
	if tlsCfg == nil {
		tlsCfg = opts.TLSConfig // rediss://
	} else if tlsCfg.ServerName == "" && opts.TLSConfig != nil {
		tlsCfg.ServerName = opts.TLSConfig.ServerName
	}
	opts.TLSConfig = tlsCfg
	// Connecting gets half the timeout, and one try (the relay retries):
	// a connection that cannot be made then fails as such, marked
	// Unavailable, before the batch's deadline, which would only say
	// that no reply came.
	opts.DialTimeout = cfg.Timeout / 2
	opts.DialerRetries = 1
	opts.Dialer = dialer(opts.DialTimeout, tlsCfg)
	opts.ClientName = "herald/" + name
	opts.ReadTimeout = cfg.Timeout
	opts.WriteTimeout = cfg.Timeout
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	s := &Sink{name: name, cfg: cfg, shown: sinkconfig.RedactURL(cfg.URL), client: goredis.NewClient(opts), logger: logger}
	return s, nil
}

// dialer connects and, with tlsCfg, completes the TLS handshake, each
// bounded by timeout and ctx. Its errors are marked dialError: whatever
// they say (a handshake a plain server never answers ends in a context
// deadline), nothing was sent, and the server is what failed.
func dialer(timeout time.Duration, tlsCfg *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		conn, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, dialError{err}
		}
		if tlsCfg == nil {
			return conn, nil
		}
		cfg := tlsCfg
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			cfg = cfg.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, dialError{fmt.Errorf("TLS handshake with %s: %w", addr, err)}
		}
		return tc, nil
	}
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: each Publish
// call runs its pipeline on a connection of its own from the pool.
func (s *Sink) PublishesConcurrently() bool { return true }

func (s *Sink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Check implements sinks.Checker: it connects (when no pooled connection is
// open), authenticates and sends PING.
func (s *Sink) Check(ctx context.Context) error {
	if s.isClosed() {
		return sinks.Unavailable(ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return s.unavailable(fmt.Errorf("sink %s: pinging %s: %w", s.name, s.shown, err))
	}
	return nil
}

// unavailable classifies err and, since a check failure is about the
// destination as a whole, marks what is left retryable as Unavailable too.
func (s *Sink) unavailable(err error) error {
	err = classify(err)
	if sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	return sinks.Unavailable(err)
}

// CheckDestinations implements sinks.DestinationChecker: each stream must
// be a stream or not exist yet (XADD creates it). It reports every key
// holding another type, which would fail its events with WRONGTYPE, or
// why it could not check.
func (s *Sink) CheckDestinations(ctx context.Context, streams ...string) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	types := make([]*goredis.StatusCmd, len(streams))
	for i, stream := range streams {
		types[i] = pipe.Type(ctx, stream)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.As(err, new(goredis.Error)) {
		return s.unavailable(fmt.Errorf("sink %s: checking streams on %s: %w", s.name, s.shown, err))
	}
	var errs []error
	for i, cmd := range types {
		switch typ, err := cmd.Result(); {
		case err != nil:
			errs = append(errs, classify(fmt.Errorf("sink %s: checking stream %q: %w", s.name, streams[i], err)))
		case typ != "stream" && typ != "none":
			errs = append(errs, sinks.Permanent(fmt.Errorf("sink %s: stream %q: the key holds a %s, not a stream: "+
				"its events would fail with WRONGTYPE (rename the key or change the route's destination)", s.name, streams[i], typ)))
		}
	}
	return errors.Join(errs...)
}

// Publish appends events in one pipelined round trip and returns one
// result per event; see the package documentation for delivery, order and
// error classes.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, stream)
	if len(events) == 0 || res.Ended() {
		return res.Errors()
	}
	if s.isClosed() {
		res.FailRest(sinks.Unavailable(ErrClosed))
		return res.Errors()
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()

	pipe := s.client.Pipeline()
	cmds := make([]*goredis.StringCmd, len(events))
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		values, err := encode(e, s.cfg.MaxPayload)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &goredis.XAddArgs{Stream: e.Destination, MaxLen: s.cfg.MaxLen, Approx: s.cfg.MaxLen > 0, Values: values})
	}
	if pipe.Len() == 0 {
		return res.Errors()
	}
	// Each command holds its own reply or error, which is what the results
	// report. A failure before any command ran (dial, authentication) is
	// only Exec's: a command with neither error nor entry id gets it.
	_, execErr := pipe.Exec(ctx)
	var lost error
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		err := cmd.Err()
		if err == nil && cmd.Val() == "" {
			err = execErr
			if err == nil {
				err = errors.New("no entry id in the reply")
			}
		}
		if err == nil {
			res.Delivered(i)
			continue
		}
		err = classify(err)
		if lost == nil && sinks.IsUnavailable(err) {
			lost = err
		}
		res.Fail(i, err)
	}
	if lost != nil {
		s.logger.WarnContext(ctx, "redis sink: server unavailable", "sink", s.name, "server", s.shown, "error", lost)
	}
	return res.Errors()
}

// stream names an event's stream in errors.
func stream(e *sinks.Event) string { return "stream " + strconv.Quote(e.Destination) }

// Close closes the sink's connections; nothing is buffered between calls.
// Publish fails with ErrClosed (Unavailable) afterwards. Close is
// idempotent.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("closing sink %s: %w", s.name, err)
	}
	return nil
}
