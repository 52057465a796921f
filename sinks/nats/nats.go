// Package nats is Herald's NATS sink: it publishes each event to the NATS
// subject named by its Destination, through JetStream (the default) or core
// NATS.
//
// # Messages
//
// The payload is the event's payload, byte for byte. Headers:
//
//	Nats-Msg-Id    the event id (JetStream drops duplicates by it)
//	Herald-Topic   the event's topic
//	Herald-Key     the event's key (absent when the event has none)
//	Content-Type   the payload's media type
//
// plus every event header under its own name. NATS trims white space around
// header values and turns CR and LF into spaces. An event header whose name
// NATS cannot carry, or that starts with "Nats-" (JetStream acts on those:
// Nats-Rollup purges a stream), fails the event permanently.
//
// With format: cloudevents the message is a CloudEvent per the CloudEvents
// NATS protocol binding (package cloudevents gives the attributes), still
// with Nats-Msg-Id. In the binary mode (cloudevents.mode: binary, the
// default) the payload is the event's, and every attribute is a ce- header
// with a percent-encoded value, datacontenttype included (ce-specversion,
// ce-id, ce-source, ce-type, ce-subject, ce-time, ce-datacontenttype, and
// the extensions: ce-traceparent, ce-tracestate, ce-<header> for event
// headers with [a-z0-9] names). In the structured mode the payload is the
// JSON event format and Content-Type is application/cloudevents+json.
//
// # Delivery
//
// In JetStream mode (mode: jetstream) Publish sends the whole batch with
// asynchronous publishes on one connection, at most max_pending unacknowledged
// at a time over all calls, and records each event's result as its PubAck
// arrives (each bounded by ack_timeout and by the context), reporting it at
// once to a caller that asked (sinks.WithResultFunc). An event is reported
// delivered only when a stream acknowledged storing it, or acknowledged it as
// a duplicate of a message it already holds.
// Each message carries Nats-Msg-Id = event id, so the stream drops a re-sent
// event inside its duplicate window (the stream's `duplicate_window`, 2 minutes
// by default): retries after a lost acknowledgement do not duplicate.
//
// In core mode (mode: core) Publish sends the batch and flushes: success means
// the server read the messages, not that any subscriber or stream got them.
// Core NATS has no persistence acknowledgement, so a message published while
// nobody listens is lost. Use it only where that is acceptable.
//
// # Order
//
// Events of one key are sent in slice order, on one connection, and a batch's
// acknowledgements are awaited before Publish returns, so order holds within
// and across calls. Once an event of key K failed (refused before it was
// sent, or its PubAck came back an error), the later events of K in the
// call not sent yet are not sent (sinks.ErrSkipped). Because
// JetStream mode pipelines, when an event of K fails after it was sent,
// later events of K may already be stored: they are reported as they went
// (stored is delivered), and the relay, which holds K's later events back
// behind the failed one whatever a sink reports, sends them again after it;
// the stream drops those retries as duplicates inside its window. A failure
// caused by a lost acknowledgement (ack timeout, disconnect) leaves order
// intact: the server stores one connection's messages in order, so the
// stored ones form a prefix. Order can break only when the server rejects
// one message of K but stores a later one (a per-message JetStream error
// such as the stream's max_msg_size), or when a retry comes after the
// duplicate window.
//
// # Reserved subjects
//
// An event's destination comes from event data (its topic, or a route's
// template over its fields), and some subjects are not mailboxes but
// commands: a message to $JS.API.STREAM.PURGE.<name> purges that stream,
// whether sent in core mode or in JetStream mode with check_streams off.
// The sink therefore refuses, as a permanent error naming the destination
// and allow_subject_prefixes, every destination starting with $JS.
// (JetStream API and acknowledgements), $SYS. (system account), $KV. and
// $O. (key-value and object stores) or _INBOX. (replies), before sending
// anything. A prefix listed in allow_subject_prefixes ("$KV.", or
// "$KV.orders." for one bucket) lifts the refusal for the subjects it
// starts.
//
// # Errors
//
//   - no connection, connection closed or lost, no servers, authentication
//     refused, TLS failure, JetStream disabled: sinks.Unavailable (the relay
//     pauses the sink). A publish during an outage fails at once: the
//     connection reconnects forever in the background with no reconnect
//     buffer.
//   - a message over the server's max_payload (checked before sending, against
//     the limit the server announced), over the stream's max_msg_size, with an
//     invalid subject or header name, to a reserved subject (see above):
//     permanent.
//   - no stream covers the subject (lookup found none, or "nats: no response
//     from stream"): sinks.Unavailable wrapping ErrNoStream, naming the
//     subject; see ErrNoStream.
//   - no PubAck within ack_timeout: retryable (the message may have been
//     stored; the Nats-Msg-Id dedupe makes the retry safe).
//   - any other JetStream error for a message: retryable, on that event only.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// reconnectWait is the pause between reconnect attempts to one server.
const reconnectWait = time.Second

// connectTimeout bounds one connection attempt when Publish's context leaves
// more time.
const connectTimeout = 5 * time.Second

// Sink publishes events to NATS. Create it with New.
type Sink struct {
	name    string
	cfg     Config
	servers string // comma-separated URLs for nats.Connect
	shown   string // servers with user information redacted, for errors and logs
	opts    []natsgo.Option
	logger  *slog.Logger

	mu     sync.Mutex // guards nc, js and closed
	nc     *natsgo.Conn
	js     jetstream.JetStream
	closed bool

	streamsMu sync.Mutex
	streams   map[string][]string // stream name → its subject filters, for streams found covering a subject
}

var _ sinks.Sink = (*Sink)(nil)

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily, on the first Publish or CheckSubjects, so a relay starts while
// NATS is down. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	s := &Sink{name: name, cfg: cfg, logger: logger, streams: map[string][]string{}}
	urls, _ := cfg.servers()
	shown := make([]string, len(urls))
	for i, u := range urls {
		shown[i] = sinkconfig.RedactURL(u)
	}
	s.servers = strings.Join(urls, ",")
	s.shown = strings.Join(shown, ",")

	opts := []natsgo.Option{
		natsgo.Name("herald/" + name),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(reconnectWait),
		natsgo.ReconnectBufSize(-1), // publishes fail fast while reconnecting
		natsgo.IgnoreAuthErrorAbort(),
		natsgo.DisconnectErrHandler(s.onDisconnect),
		natsgo.ReconnectHandler(s.onReconnect),
		natsgo.ErrorHandler(s.onAsyncError),
	}
	tlsCfg, err := cfg.TLS.Build("tls")
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, natsgo.Secure(tlsCfg))
	}
	switch {
	case cfg.CredentialsFile != "":
		if _, err := os.Stat(cfg.CredentialsFile); err != nil {
			return nil, fmt.Errorf("credentials_file: %w", err)
		}
		opts = append(opts, natsgo.UserCredentials(cfg.CredentialsFile))
	case cfg.Token != "":
		opts = append(opts, natsgo.Token(cfg.Token.Reveal()))
	case cfg.User != "":
		opts = append(opts, natsgo.UserInfo(cfg.User, cfg.Password.Reveal()))
	case cfg.NKeySeedFile != "":
		opt, err := natsgo.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nkey_seed_file: %w", err)
		}
		opts = append(opts, opt)
	}
	s.opts = opts
	return s, nil
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: each Publish
// call keeps its state to itself, the connection and the stream cache are
// guarded, and nats.go publishes from any goroutine.
func (s *Sink) PublishesConcurrently() bool { return true }

func (s *Sink) onDisconnect(nc *natsgo.Conn, err error) {
	if err != nil {
		s.logger.Warn("nats sink: disconnected", "sink", s.name, "error", err)
	}
}

func (s *Sink) onReconnect(nc *natsgo.Conn) {
	s.logger.Info("nats sink: reconnected", "sink", s.name, "server", nc.ConnectedAddr())
}

func (s *Sink) onAsyncError(nc *natsgo.Conn, _ *natsgo.Subscription, err error) {
	s.logger.Warn("nats sink: asynchronous error", "sink", s.name, "error", err)
}

// connect returns the connection, dialling it on first use. Once dialled,
// the connection reconnects by itself until Close.
func (s *Sink) connect(ctx context.Context) (*natsgo.Conn, jetstream.JetStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, sinks.Unavailable(ErrClosed)
	}
	if s.nc != nil {
		return s.nc, s.js, nil
	}
	timeout := connectTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	nc, err := natsgo.Connect(s.servers, append(s.opts, natsgo.Timeout(timeout))...)
	if err != nil {
		return nil, nil, sinks.Unavailable(fmt.Errorf("connecting to %s: %w", s.shown, err))
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(s.cfg.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(s.cfg.MaxPending),
		jetstream.WithDefaultTimeout(s.cfg.AckTimeout))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("creating JetStream context: %w", err)
	}
	s.logger.Info("nats sink: connected", "sink", s.name, "server", nc.ConnectedAddr(), "mode", s.cfg.Mode)
	s.nc, s.js = nc, js
	return nc, js, nil
}

// connected returns the connection when it is up, or an Unavailable error.
func (s *Sink) connected(ctx context.Context) (*natsgo.Conn, jetstream.JetStream, error) {
	nc, js, err := s.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !nc.IsConnected() {
		err := fmt.Errorf("not connected to %s (%s)", s.shown, nc.Status())
		if last := nc.LastError(); last != nil {
			err = fmt.Errorf("%w: last error: %w", err, last)
		}
		return nil, nil, sinks.Unavailable(err)
	}
	return nc, js, nil
}

// Check implements sinks.Checker: it connects (once; the connection then
// reconnects by itself) and, in JetStream mode, asks the server for the
// account's JetStream information, which fails when JetStream is not
// enabled for the account. Streams are checked per subject on first
// publish (check_streams) or with CheckSubjects: destinations come from
// events.
func (s *Sink) Check(ctx context.Context) error {
	_, js, err := s.connected(ctx)
	if err != nil {
		return err
	}
	if s.cfg.Mode == ModeCore {
		return nil
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return sinks.Unavailable(fmt.Errorf("JetStream on %s: %w", s.shown, err))
	}
	return nil
}

// CheckDestinations implements sinks.DestinationChecker: it is
// CheckSubjects.
func (s *Sink) CheckDestinations(ctx context.Context, subjects ...string) error {
	return s.CheckSubjects(ctx, subjects...)
}

// encode builds the message for e in the configured format.
func (s *Sink) encode(e sinks.Event, maxPayload int64) (*natsgo.Msg, error) {
	if s.cfg.Format == FormatCloudEvents {
		return encodeCloudEvent(e, s.cfg.CloudEvents, maxPayload, s.cfg.AllowSubjectPrefixes)
	}
	return encode(e, maxPayload, s.cfg.AllowSubjectPrefixes)
}

// CheckSubjects connects, checks each subject is a destination Publish
// accepts (a valid subject, not under a reserved prefix that
// allow_subject_prefixes does not cover) and, in JetStream mode, that a
// stream covers it, caching the answers Publish uses. It reports every
// subject refused (permanent), every one no stream covers (wrapping
// ErrNoStream), or why it could not check. Call it at start with the
// subjects the routes can render, to fail early.
func (s *Sink) CheckSubjects(ctx context.Context, subjects ...string) error {
	_, js, err := s.connected(ctx)
	if err != nil {
		return fmt.Errorf("sink %s: %w", s.name, err)
	}
	var errs []error
	for _, subject := range subjects {
		err := checkDestination(subject, s.cfg.AllowSubjectPrefixes)
		if err == nil && s.cfg.Mode != ModeCore {
			err = s.checkStream(ctx, js, subject)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sink %s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// checkStream reports whether a stream covers subject. It asks the server
// only for subjects that no stream it already found covers: the cache holds
// the found streams' subject filters, so it stays as small as the number of
// streams however many subjects the routes render.
func (s *Sink) checkStream(ctx context.Context, js jetstream.JetStream, subject string) error {
	s.streamsMu.Lock()
	covered := false
	for _, filters := range s.streams {
		for _, f := range filters {
			covered = covered || subjectMatches(f, subject)
		}
	}
	s.streamsMu.Unlock()
	if covered {
		return nil
	}
	name, err := js.StreamNameBySubject(ctx, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return sinks.Unavailable(fmt.Errorf("subject %q: %w: create a stream whose subjects include it "+
			"(nats stream add NAME --subjects %q), or publish it with mode: core", subject, ErrNoStream, subject))
	}
	if err != nil {
		return classify(fmt.Errorf("looking up the stream of subject %q: %w", subject, err))
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return classify(fmt.Errorf("reading stream %s, which covers subject %q: %w", name, subject, err))
	}
	s.streamsMu.Lock()
	s.streams[name] = stream.CachedInfo().Config.Subjects
	s.streamsMu.Unlock()
	return nil
}

// forgetStreams empties the stream cache, after a stream stopped answering
// for a subject it covered (deleted, or its subjects changed).
func (s *Sink) forgetStreams() {
	s.streamsMu.Lock()
	clear(s.streams)
	s.streamsMu.Unlock()
}

// subjectMatches reports whether the subject filter f (with * and >
// wildcards) matches the literal subject.
func subjectMatches(f, subject string) bool {
	for {
		ft, frest, fmore := strings.Cut(f, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != st:
			return false
		case !fmore || !smore:
			return fmore == smore
		}
		f, subject = frest, srest
	}
}

// Publish sends events and returns one result per event, each reported as
// soon as it is known; see the package documentation for delivery, order
// and error classes.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, nil)
	if len(events) == 0 || res.Ended() {
		return res.Errors()
	}
	nc, js, err := s.connected(ctx)
	if err != nil {
		res.FailRest(err)
		return res.Errors()
	}
	if s.cfg.Mode == ModeCore {
		s.publishCore(ctx, res, events, nc)
	} else {
		s.publishJetStream(ctx, res, events, nc, js)
	}
	return res.Errors()
}

// publishCore publishes with core NATS and confirms with one flush.
func (s *Sink) publishCore(ctx context.Context, res *sinks.Results, events []sinks.Event, nc *natsgo.Conn) {
	maxPayload := nc.MaxPayload()
	var sent []int
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		msg, err := s.encode(e, maxPayload)
		if err == nil {
			err = nc.PublishMsg(msg)
		}
		if err != nil {
			res.Fail(i, classify(err))
			continue
		}
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	err := nc.FlushWithContext(fctx)
	switch {
	case err == nil:
	case !nc.IsConnected():
		err = sinks.Unavailable(fmt.Errorf("flushing: %w (connection lost)", err))
	default:
		err = classify(fmt.Errorf("flushing: %w (the server may or may not have received the messages)", err))
	}
	for _, i := range sent {
		if err != nil {
			res.Fail(i, err)
		} else {
			res.Delivered(i)
		}
	}
}

// publishJetStream pipelines the events with PublishMsgAsync (the JetStream
// context keeps at most MaxPending unacknowledged over all calls) and
// records each event's result as its PubAck arrives.
func (s *Sink) publishJetStream(ctx context.Context, res *sinks.Results, events []sinks.Event, nc *natsgo.Conn, js jetstream.JetStream) {
	maxPayload := nc.MaxPayload()
	missing := map[string]error{} // subjects found uncovered in this call
	var acks sync.WaitGroup
	defer acks.Wait()
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		msg, err := s.encode(e, maxPayload)
		if err == nil && *s.cfg.CheckStreams {
			var seen bool
			if err, seen = missing[e.Destination]; !seen {
				if err = s.checkStream(ctx, js, e.Destination); err != nil {
					missing[e.Destination] = err
				}
			}
		}
		if err != nil {
			res.Fail(i, err)
			continue
		}
		// Concurrent calls share the connection's MaxPending window, so a
		// call can find it full of others' messages: wait for room as
		// long as for an ack, not nats.go's default 200 ms.
		ack, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(s.cfg.AckTimeout))
		if err != nil {
			res.Fail(i, classify(err))
			continue
		}
		acks.Go(func() { s.await(ctx, res, i, ack) })
	}
}

// await waits for event i's PubAck, bounded by ctx (the ack timeout is the
// JetStream context's), and records the result.
func (s *Sink) await(ctx context.Context, res *sinks.Results, i int, ack jetstream.PubAckFuture) {
	var err error
	select {
	case <-ack.Ok():
		res.Delivered(i)
		return
	case err = <-ack.Err():
	default:
		select {
		case <-ack.Ok():
			res.Delivered(i)
			return
		case err = <-ack.Err():
		case <-ctx.Done():
			err = fmt.Errorf("waiting for the PubAck: %w (the message may have been stored)", ctx.Err())
		}
	}
	err = classify(err)
	if errors.Is(err, ErrNoStream) {
		s.forgetStreams()
	}
	res.Fail(i, err)
}

// Close flushes what the connection still buffers, within ctx's deadline
// (or ack_timeout when ctx has none), and closes the connection. Publish
// fails with ErrClosed (Unavailable) afterwards. Close is idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.nc == nil {
		return nil
	}
	var err error
	if s.nc.IsConnected() {
		fctx := ctx
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(ctx, s.cfg.AckTimeout)
			defer cancel()
		}
		if ferr := s.nc.FlushWithContext(fctx); ferr != nil {
			err = fmt.Errorf("closing sink %s: flushing: %w", s.name, ferr)
		}
	}
	s.nc.Close()
	return err
}
