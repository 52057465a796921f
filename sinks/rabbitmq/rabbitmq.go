// Package rabbitmq is Herald's RabbitMQ sink: it publishes each event to an
// exchange (the default exchange unless configured; a fixed name or a
// template rendered from the event) with the event's Destination as the
// routing key, over AMQP 0-9-1 with publisher confirms.
//
// # Messages
//
// The body is the event's payload, byte for byte. Properties: message_id =
// the event id (the consumers' dedupe key), content_type = the payload's
// media type, delivery_mode = 2 (persistent), timestamp = the event's
// creation time. Headers: every event header under its own name (string
// values), plus
//
//	herald-topic   the event's topic
//	herald-key     the event's key (absent when the event has none)
//
// An event header named CC or BCC (RabbitMQ copies the message to the
// routing keys they list), a header name or routing key over AMQP's 255
// bytes, or a payload over max_message_size fails the event permanently,
// unsent.
//
// # CloudEvents
//
// With format: cloudevents each message is a CloudEvent per the CloudEvents
// AMQP protocol binding (package cloudevents, Binding AMQP). The binding is
// written for AMQP 1.0; on AMQP 0-9-1 its application properties are the
// message headers and its content-type the content_type property, which is
// how RabbitMQ converts between the two protocols. In the binary mode the
// body is the payload, content_type = datacontenttype, and every other
// attribute is a string header cloudEvents_<name> (cloudEvents_id,
// cloudEvents_source, cloudEvents_type…: the '_' separator, which the
// spec prefers to ':' for JMS clients). In the structured mode the body is
// the JSON event format and content_type application/cloudevents+json.
// Either way message_id, delivery_mode and timestamp are set as above, and
// there are no herald- headers; max_message_size counts the encoded body.
//
// # Delivery
//
// Publish sends the whole batch on one channel in confirm mode (a channel
// per concurrent call, kept open for later calls), at most
// max_pending unconfirmed at a time, and records each event's result as its
// confirm arrives (each bounded by confirm_timeout and by the context),
// reporting it at once to a caller that asked (sinks.WithResultFunc). An
// event is reported
// delivered only when the broker acknowledged it: for a persistent message
// to a durable queue, once the queue has written it to disk. With mandatory
// (the default) the broker returns a message no queue is bound to receive
// before it acknowledges it; the sink reports that event as a permanent
// failure naming the exchange and routing key.
//
// # Order
//
// One channel carries a call's messages, in slice order, and Publish
// returns only when the batch is confirmed, so the events of one key reach
// a queue in order within and across calls (the relay never publishes one
// key in two calls at once). Once an event of key K failed (before it was
// sent, or by a confirm that arrived before the later ones were sent), the
// later events of K in the call not sent yet are not sent
// (sinks.ErrSkipped). An event that fails after the later events of K were
// sent (returned, refused) leaves them as they went: the relay holds them
// back behind the failed one and sends them again, and consumers drop the
// copies by message_id.
//
// # Connection
//
// The sink connects on first use (Check or Publish) and, once the broker or
// the network closed the connection, dials again on the next call: a
// publish during an outage fails at once as Unavailable, and the relay's
// pause decides when to try again. A channel the broker closed (a missing
// exchange closes it), or that a call left with unconfirmed messages, is
// closed and not used again, so a late confirm cannot be taken for a later
// message's.
//
// # Errors
//
//   - connection refused or lost, authentication or vhost refused, TLS
//     failure, the exchange does not exist (the broker closes the channel
//     with 404): sinks.Unavailable (the relay pauses the sink). These are
//     setup errors that affect every event. The error names the exchange;
//     a rendered exchange found missing is then checked by Check too (at
//     most maxMissing of them), so /readyz names it until it exists.
//   - a message returned as unroutable (mandatory), a message the broker
//     refused as too large (channel closed with 406), one refused by
//     encode (see Messages), or an exchange template that fails on the
//     event (a header it names is missing) or renders over 255 bytes:
//     permanent.
//   - a negative confirm (a queue full with x-overflow: reject-publish, a
//     broker-side failure), no confirm within confirm_timeout: retryable,
//     on that event only.
package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// connectTimeout bounds dialling and the AMQP handshake when the caller's
// context leaves more time.
const connectTimeout = 5 * time.Second

// maxMissing bounds the rendered exchanges remembered as missing for Check:
// names come from event data, so there may be any number of them.
const maxMissing = 16

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("rabbitmq: sink closed")

// ErrReturned is reported (wrapped, permanent) for an event the broker
// returned because no queue is bound to receive it.
var ErrReturned = errors.New("rabbitmq: message returned unroutable")

// ErrNacked is reported (wrapped, retryable) for an event the broker
// refused with a negative confirm.
var ErrNacked = errors.New("rabbitmq: broker refused the message (negative confirm)")

// Sink publishes events to RabbitMQ. Create it with New.
type Sink struct {
	name    string
	cfg     Config
	url     string // the revealed URL, for dialling only
	shown   string // the URL with its user information redacted
	amqpCfg amqp.Config
	logger  *slog.Logger
	// exchange is cfg.Exchange parsed.
	exchange exchangeTemplate

	mu     sync.Mutex // guards conn and closed
	conn   *amqp.Connection
	closed bool

	idleMu sync.Mutex // guards idle
	idle   []*pubChannel

	missingMu sync.Mutex // guards missing
	// missing are rendered exchanges a publish found missing, oldest
	// first, which Check checks until they exist.
	missing []string
}

// pubChannel is a channel in confirm mode with its notifications. One
// Publish call uses it at a time.
type pubChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
}

var (
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
	_ sinks.DestinationChecker  = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily, on the first Check or Publish, so a relay starts while RabbitMQ is
// down. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.TLS.Build("tls")
	if err != nil {
		return nil, err
	}
	exchange, err := parseExchange(cfg.Exchange)
	if err != nil {
		return nil, err
	}
	s := &Sink{name: name, cfg: cfg, url: cfg.URL.Reveal(), shown: sinkconfig.RedactURL(cfg.URL.Reveal()), logger: logger, exchange: exchange}
	s.amqpCfg = amqp.Config{
		TLSClientConfig: tlsCfg,
		// The connection name shows in the management UI and lets an
		// operator close this relay's connection alone.
		Properties: amqp.Table{"connection_name": "herald/" + name, "product": "herald"},
	}
	return s, nil
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: each Publish
// call publishes on a channel of its own (taken from the idle ones or
// opened), and the broker serves channels in parallel. Order holds because
// concurrent calls never share a key, and a call returns only once its
// messages are confirmed, so they are in their queues before a later call
// sends the next events of their keys.
func (s *Sink) PublishesConcurrently() bool { return true }

// connection returns the connection, dialling it when there is none or the
// last one closed.
func (s *Sink) connection(ctx context.Context) (*amqp.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sinks.Unavailable(ErrClosed)
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	timeout := connectTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	cfg := s.amqpCfg
	cfg.Dial = amqp.DefaultDial(timeout)
	conn, err := amqp.DialConfig(s.url, cfg)
	if err != nil {
		return nil, sinks.Unavailable(fmt.Errorf("connecting to %s: %w", s.shown, err))
	}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		// The library closes closes when the connection ends; a nil
		// error means Close ended it.
		if err := <-closes; err != nil {
			s.logger.Warn("rabbitmq sink: connection closed", "sink", s.name, "server", s.shown, "error", err)
		}
	}()
	s.logger.Info("rabbitmq sink: connected", "sink", s.name, "server", s.shown)
	s.conn = conn
	return conn, nil
}

// channel returns an open publishing channel: an idle one, or a new one
// (dialling the connection when it is down).
func (s *Sink) channel(ctx context.Context) (*pubChannel, error) {
	s.idleMu.Lock()
	for len(s.idle) > 0 {
		pc := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if !pc.ch.IsClosed() {
			s.idleMu.Unlock()
			return pc, nil
		}
	}
	s.idleMu.Unlock()
	conn, err := s.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, classify(fmt.Errorf("opening a channel on %s: %w", s.shown, err))
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, classify(fmt.Errorf("putting the channel in confirm mode: %w", err))
	}
	return &pubChannel{
		ch: ch,
		// Returns are read while confirms are awaited, and at most
		// MaxPending messages are unconfirmed: a buffer that large never
		// fills, which matters because the library drops a return it
		// cannot deliver.
		returns: ch.NotifyReturn(make(chan amqp.Return, s.cfg.MaxPending)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// release hands pc back for the next call, or closes it when it may still
// owe confirms (a late confirm would be taken for a later message's) or
// is closed.
func (s *Sink) release(pc *pubChannel, unsettled bool) {
	if !unsettled && !pc.ch.IsClosed() {
		s.idleMu.Lock()
		s.idle = append(s.idle, pc)
		s.idleMu.Unlock()
		return
	}
	// Closing waits for the broker's close-ok, which a stalled broker may
	// never send: the call must not wait for it. The close ends when the
	// broker answers or the connection ends.
	go func() { _ = pc.ch.Close() }()
}

// closeReason returns why pc closed. The library sends the reason before it
// fails the pending confirms, so it is there when a confirm failed because
// of the close.
func (pc *pubChannel) closeReason() error {
	select {
	case e, ok := <-pc.closes:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp.ErrClosed
}

// Check implements sinks.Checker: it connects (or reuses the connection) and
// checks that the exchanges it knows of exist: a fixed named exchange, and
// the rendered exchanges publishes found missing (a templated exchange is
// known only once an event renders it). One found to exist is forgotten.
func (s *Sink) Check(ctx context.Context) error {
	conn, err := s.connection(ctx)
	if err != nil {
		return err
	}
	s.missingMu.Lock()
	names := slices.Clone(s.missing)
	s.missingMu.Unlock()
	if !s.exchange.templated() && s.exchange.fixed != "" {
		names = append(names, s.exchange.fixed)
	}
	var errs []error
	for _, name := range names {
		// A failed passive declare closes its channel: one channel each.
		err := onChannel(ctx, conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(name, amqp.ExchangeDirect, false, false, false, false, nil)
		})
		if err != nil {
			errs = append(errs, classify(fmt.Errorf("exchange %q on %s: %w", name, s.shown, err)))
			continue
		}
		s.found(name)
	}
	return errors.Join(errs...)
}

// noteMissing remembers a rendered exchange the broker said does not exist,
// for Check, forgetting the oldest beyond maxMissing.
func (s *Sink) noteMissing(exchange string) {
	if !s.exchange.templated() {
		return // Check checks the fixed exchange anyway
	}
	s.missingMu.Lock()
	defer s.missingMu.Unlock()
	if slices.Contains(s.missing, exchange) {
		return
	}
	if len(s.missing) >= maxMissing {
		s.missing = slices.Delete(s.missing, 0, 1)
	}
	s.missing = append(s.missing, exchange)
}

// found forgets exchange as missing.
func (s *Sink) found(exchange string) {
	s.missingMu.Lock()
	defer s.missingMu.Unlock()
	if i := slices.Index(s.missing, exchange); i >= 0 {
		s.missing = slices.Delete(s.missing, i, i+1)
	}
}

// CheckDestinations implements sinks.DestinationChecker. It checks that each
// routing key fits AMQP and, on the default exchange (where a routing key
// names a queue), that the queue exists. Behind a named or templated
// exchange the routes depend on bindings the broker does not list per key;
// Check checks the exchange, and mandatory reports unroutable messages.
func (s *Sink) CheckDestinations(ctx context.Context, destinations ...string) error {
	conn, err := s.connection(ctx)
	if err != nil {
		return fmt.Errorf("sink %s: %w", s.name, err)
	}
	var errs []error
	for _, d := range destinations {
		if len(d) > maxShortString {
			errs = append(errs, fmt.Errorf("sink %s: routing key %.40q… is %d bytes, over AMQP's limit of %d", s.name, d, len(d), maxShortString))
			continue
		}
		if s.exchange.templated() || s.exchange.fixed != "" {
			continue
		}
		// A failed passive declare closes its channel: one channel each.
		err := onChannel(ctx, conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(d, false, false, false, false, nil)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("sink %s: routing key %q on the default exchange: no queue of that name: %w", s.name, d, classify(err)))
		}
	}
	return errors.Join(errs...)
}

// onChannel runs f on a channel of its own, closed afterwards, and gives up
// waiting when ctx ends (the library's calls take no context).
func onChannel(ctx context.Context, conn *amqp.Connection, f func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return classify(fmt.Errorf("opening a channel: %w", err))
	}
	done := make(chan error, 1)
	go func() {
		err := f(ch)
		_ = ch.Close()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Publish sends events and returns one result per event, each recorded as
// its confirm arrives; see the package documentation for delivery, order
// and error classes.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, nil)
	pc, ok := sinks.Connect(res, s.channel)
	if !ok {
		return res.Errors()
	}
	b := &batch{sink: s, res: res, events: events, pc: pc, returns: pc.returns,
		returned: map[string]amqp.Return{}, slots: make(chan struct{}, s.cfg.MaxPending)}
	b.run(ctx)
	s.release(pc, b.unsettled.Load())
	return res.Errors()
}

// batch is one Publish call in progress: run publishes from the calling
// goroutine while another awaits the confirms, in the order the broker
// sends them, and settles each event.
type batch struct {
	sink   *Sink
	res    *sinks.Results
	events []sinks.Event
	pc     *pubChannel
	render bytes.Buffer // the exchange template's output
	// slots bounds the unconfirmed messages to max_pending, which the
	// returns buffer is sized for.
	slots chan struct{}
	// unsettled says the channel may still owe confirms or is closed.
	unsettled atomic.Bool

	// Only the goroutine awaiting confirms uses what follows.
	returns  <-chan amqp.Return
	returned map[string]amqp.Return // returned messages by message id
	// closeErr is the error of the events left unconfirmed once the channel
	// closed, after the first of them took the close's own error.
	closeErr error
	// abandonErr is the error of the events still unconfirmed once the
	// wait for a confirm timed out or the context ended.
	abandonErr error
}

// pending is one published message awaiting its confirm.
type pending struct {
	i        int
	exchange string
	dc       *amqp.DeferredConfirmation
}

func (b *batch) run(ctx context.Context) {
	s, res := b.sink, b.res
	published := make(chan pending, s.cfg.MaxPending)
	awaited := make(chan struct{})
	go func() {
		defer close(awaited)
		for p := range published {
			b.await(ctx, p)
			<-b.slots
		}
	}()
	defer func() {
		close(published)
		<-awaited
	}()
	for i, e := range b.events {
		if res.Blocked(i) {
			continue
		}
		exchange, err := s.exchange.render(e, &b.render)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		msg, err := encode(e, s.cfg)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			res.Blocked(i) // records that the call ended
			continue
		}
		// A confirm settled meanwhile may have failed the key or stopped
		// the call.
		if res.Blocked(i) {
			<-b.slots
			continue
		}
		dc, err := b.pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, e.Destination, *s.cfg.Mandatory, false, msg)
		if err != nil {
			// A publish fails only when the frame cannot be written: the
			// channel or connection is gone, for this event and the rest.
			<-b.slots
			b.unsettled.Store(true)
			err = classify(err)
			res.Fail(i, err)
			res.Stop(err)
			continue
		}
		published <- pending{i, exchange, dc}
	}
}

// await waits for p's confirm, bounded by confirm_timeout and ctx, reading
// returned messages meanwhile, and records p's result.
func (b *batch) await(ctx context.Context, p pending) {
	if b.abandonErr != nil {
		select {
		case <-p.dc.Done():
			b.settle(p)
		default:
			b.res.Fail(p.i, b.abandonErr)
		}
		return
	}
	timer := time.NewTimer(b.sink.cfg.ConfirmTimeout)
	defer timer.Stop()
	for {
		select {
		case r, ok := <-b.returns:
			b.noteReturn(r, ok)
			continue
		case <-p.dc.Done():
			b.settle(p)
		case <-timer.C:
			b.abandon(p, fmt.Errorf("no confirm within confirm_timeout (%s): the broker may have stored the message", b.sink.cfg.ConfirmTimeout))
		case <-ctx.Done():
			b.abandon(p, fmt.Errorf("waiting for the confirm: %w (the broker may have stored the message)", ctx.Err()))
		}
		return
	}
}

// abandon gives up waiting for confirms: p and every later message not
// confirmed yet fail with err, and nothing more is sent.
func (b *batch) abandon(p pending, err error) {
	b.unsettled.Store(true)
	b.abandonErr = err
	b.res.Stop(err)
	b.res.Fail(p.i, err)
}

// noteReturn records a returned message; ok false means the library closed
// the returns channel (the channel closed).
func (b *batch) noteReturn(r amqp.Return, ok bool) {
	if !ok {
		b.returns = nil
		return
	}
	b.returned[r.MessageId] = r
}

// settle records the result of p, whose confirm arrived. The broker sends a
// message's return before its confirm, and the library hands the return
// over before it processes the confirm, so it is in the buffer by now.
func (b *batch) settle(p pending) {
	for drained := false; !drained; {
		select {
		case r, ok := <-b.returns:
			b.noteReturn(r, ok)
			drained = !ok
		default:
			drained = true
		}
	}
	e := b.events[p.i]
	if p.dc.Acked() {
		if r, ok := b.returned[e.ID]; ok {
			b.res.Fail(p.i, sinks.Permanent(fmt.Errorf("%w: exchange %q, routing key %q: %d %s (no queue is bound to receive it)",
				ErrReturned, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)))
			return
		}
		b.res.Delivered(p.i)
		return
	}
	if !b.pc.ch.IsClosed() {
		b.res.Fail(p.i, fmt.Errorf("%w: a queue may be full (x-overflow: reject-publish) or the broker failed to store it", ErrNacked))
		return
	}
	b.unsettled.Store(true)
	if b.closeErr != nil {
		b.res.Fail(p.i, b.closeErr)
		return
	}
	// The broker handles a channel's messages in order and acknowledged
	// the earlier ones, so the first unconfirmed message is the one it
	// closed the channel for; the later ones were not handled.
	reason := b.pc.closeReason()
	var amqpErr *amqp.Error
	if errors.As(reason, &amqpErr) && amqpErr.Code == amqp.NotFound {
		// On basic.publish the one thing that can be missing is the
		// exchange.
		b.sink.noteMissing(p.exchange)
	}
	err := classify(fmt.Errorf("the broker closed the channel on the message to %s: %w", describeExchange(p.exchange), reason))
	b.res.Fail(p.i, err)
	if sinks.IsUnavailable(err) {
		b.closeErr = err
	} else {
		b.closeErr = fmt.Errorf("not confirmed: the channel closed because of an earlier message (%w)", errors.Unwrap(err))
	}
	b.res.Stop(b.closeErr)
}

// describeExchange names an exchange in an error.
func describeExchange(exchange string) string {
	if exchange == "" {
		return "the default exchange"
	}
	return fmt.Sprintf("exchange %q", exchange)
}

// classify marks err as Unavailable, Permanent or leaves it retryable.
func classify(err error) error {
	if err == nil || sinks.IsUnavailable(err) || sinks.IsPermanent(err) {
		return err
	}
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		switch {
		case amqpErr.Code == amqp.NotFound:
			return sinks.Unavailable(fmt.Errorf("%w (declare it: the sink does not create exchanges or queues)", err))
		case amqpErr.Code == amqp.AccessRefused, amqpErr.Code == amqp.NotAllowed, !amqpErr.Recover:
			// Refused credentials, vhost or permission, and every hard
			// (connection-level) error, which ends the connection.
			return sinks.Unavailable(err)
		case amqpErr.Code == amqp.PreconditionFailed, amqpErr.Code == amqp.ContentTooLarge:
			return sinks.Permanent(err)
		}
		return err
	}
	var netErr net.Error
	if errors.As(err, &netErr) && !errors.Is(err, context.DeadlineExceeded) {
		return sinks.Unavailable(err)
	}
	return err
}

// Close closes the channels and the connection, within ctx's deadline (or
// confirm_timeout when ctx has none). Publish waits for nothing after
// returning, so there is nothing to flush. Publish and Check fail with
// ErrClosed (Unavailable) afterwards. Close is idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.idleMu.Lock()
	for _, pc := range s.idle {
		_ = pc.ch.Close()
	}
	s.idle = nil
	s.idleMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.conn == nil || s.conn.IsClosed() {
		return nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.cfg.ConfirmTimeout)
	}
	if err := s.conn.CloseDeadline(deadline); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("closing sink %s: %w", s.name, err)
	}
	return nil
}
