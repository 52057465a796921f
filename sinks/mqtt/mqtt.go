// Package mqtt is Herald's MQTT sink: it publishes each event with QoS 1 to
// the MQTT 5 topic named by its Destination (the event's topic unless a
// route's destination template says otherwise), through
// github.com/eclipse/paho.golang.
//
// # Messages
//
// The payload is the event's payload, byte for byte. Properties:
//
//	Content Type             the payload's media type
//	Payload Format Indicator 1 (UTF-8) for JSON payloads, absent otherwise
//	User property Herald-Id     the event id (the consumer's dedupe key)
//	User property Herald-Topic  the event's topic
//	User property Herald-Key    the event's key (absent when it has none)
//
// plus one user property per event header, under its own name, in name
// order. An event header named like one of the sink's (in any case) is
// dropped for the sink's value.
//
// # CloudEvents
//
// With format: cloudevents each message is a CloudEvent per the CloudEvents
// MQTT protocol binding for MQTT 5 (package cloudevents, Binding MQTT). In
// the binary mode the payload is the event's, Content Type =
// datacontenttype, and every other attribute is a user property of its own
// name, unprefixed (specversion, id, source, type, subject, time,
// traceparent, extensions). The spec's example also lists datacontenttype
// as a user property; its normative text (3.1.1, 3.1.3) puts it in Content
// Type only, and so does the sink. In the structured mode the payload is the
// JSON event format with Content Type application/cloudevents+json. Either
// way there are no Herald- properties (consumers dedupe on id), and the
// payload format indicator is set for JSON as above.
//
// # Delivery
//
// An event is reported delivered when the broker answered its PUBLISH with
// a PUBACK whose reason code is below 0x80 (0x10, no matching subscribers,
// is a success: the broker accepted the message). Publish writes the whole
// batch on one connection, in slice order, as fast as the broker's Receive
// Maximum (its in-flight window) lets it, and records each event's result
// as its PUBACK arrives (each bounded by ack_timeout and by the context),
// reporting it at once to a caller that asked (sinks.WithResultFunc): no
// round trip per event. Concurrent calls share the connection. QoS 1
// is at least once: a PUBACK lost with the connection leaves the event to
// be sent again, and consumers dedupe by Herald-Id.
//
// # Order
//
// Events of one key are written in slice order on one connection, and a
// broker forwards one client's QoS 1 messages of a topic in the order it
// received them; Publish waits for a batch's PUBACKs before returning, so
// order holds across calls too. Once an event of key K failed (refused
// before it was written, no connection, or refused by a PUBACK), the later
// events of K in the call not written yet are not sent (sinks.ErrSkipped).
// An event of K refused by its PUBACK may have later events of K already
// accepted: they are reported as they went, and the relay sends them again
// after the failed one.
//
// # Connection
//
// The sink connects on first use (Check at the relay's start, or Publish)
// with a clean session, and, when the connection drops, connects again on
// the next Check or Publish: messages of the dropped connection whose
// PUBACK had not arrived are reported Unavailable (ErrConnectionLost) and
// sent again by the relay. The sink does not use autopaho: its queue and
// background reconnection hide from the caller which message the broker
// acknowledged, while the relay needs one truthful result per event and
// already pauses a sink that is down (sinks.Unavailable) and retries.
//
// # Errors
//
//   - connection refused or lost, DNS or TLS failure, a CONNACK refusal
//     (bad user name or password, not authorized, server unavailable…), a
//     PUBACK 0x87 (not authorized: the ACL refuses the topic), a broker
//     whose maximum QoS is 0: sinks.Unavailable (the relay pauses the sink).
//   - a destination that is not a topic a message can be published to
//     (empty, a wildcard + or #, starting with $, not UTF-8), a header that
//     is not UTF-8, a message over the maximum packet size the broker
//     announced, a PUBACK 0x90 (topic name invalid), 0x95 (packet too
//     large) or 0x99 (payload format invalid): permanent.
//   - no PUBACK within ack_timeout, a PUBACK 0x97 (quota exceeded), 0x80 or
//     0x83 (unspecified or implementation-specific error): retryable.
package mqtt

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Sink publishes events to an MQTT 5 broker. Create it with New.
type Sink struct {
	name     string
	cfg      Config
	broker   broker
	shown    string // the URL with user information redacted, for errors and logs
	clientID string
	tls      *tls.Config // nil in clear
	logger   *slog.Logger

	mu     sync.Mutex // guards conn and closed
	conn   *conn
	closed bool
}

var (
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
	_ sinks.DestinationChecker  = (*Sink)(nil)
)

// conn is one MQTT connection and its session.
type conn struct {
	client    *paho.Client
	session   *state.State
	maxPacket uint32      // the broker's Maximum Packet Size, 0 when it announced none
	closing   atomic.Bool // Close disconnects: the read error that follows is no news
}

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily, on the first Check or Publish, so a relay starts while the broker
// is down. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	b, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if !b.hasUser {
		b.username, b.password = cfg.Username, cfg.Password.Reveal()
	}
	tlsCfg, err := cfg.TLS.Build("tls")
	if err != nil {
		return nil, err
	}
	if b.tls && tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if tlsCfg != nil && tlsCfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(b.addr)
		tlsCfg.ServerName = host
	}
	clientID := cfg.ClientID
	if clientID == "" {
		suffix := make([]byte, 4)
		if _, err := rand.Read(suffix); err != nil {
			return nil, fmt.Errorf("making a client id: %w", err)
		}
		clientID = "herald-" + name + "-" + hex.EncodeToString(suffix)
	}
	return &Sink{name: name, cfg: cfg, broker: b, shown: sinkconfig.RedactURL(cfg.URL), clientID: clientID, tls: tlsCfg, logger: logger}, nil
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// ackKey is the context key under which Publish hands ackSession the
// channel that is to receive one message's PUBACK.
type ackKey struct{}

// ackSession is paho's in-memory session, except that a PUBLISH's
// acknowledgement goes to the channel its context carries. paho's
// asynchronous publish returns once the PUBLISH is written and offers no
// way to learn its PUBACK; with this, Publish writes a batch in order from
// one goroutine and collects the PUBACKs afterwards, instead of waiting a
// round trip per event.
type ackSession struct{ *state.State }

// AddToSession implements session.SessionManager.
func (a ackSession) AddToSession(ctx context.Context, p session.Packet, resp chan<- packets.ControlPacket) error {
	if ack, ok := ctx.Value(ackKey{}).(chan packets.ControlPacket); ok {
		resp = ack
	}
	return a.State.AddToSession(ctx, p, resp)
}

// connect returns the connection, dialling a new one on first use and
// after the previous one dropped.
func (s *Sink) connect(ctx context.Context) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sinks.Unavailable(ErrClosed)
	}
	if s.conn != nil {
		select {
		case <-s.conn.client.Done():
			s.logger.InfoContext(ctx, "mqtt sink: reconnecting", "sink", s.name, "broker", s.shown)
			s.conn.session.Close()
			s.conn = nil
		default:
			return s.conn, nil
		}
	}
	c, err := s.dial(ctx)
	if err != nil {
		return nil, classifyConnect(fmt.Errorf("connecting to %s: %w", s.shown, err))
	}
	s.conn = c
	s.logger.InfoContext(ctx, "mqtt sink: connected", "sink", s.name, "broker", s.shown, "client_id", s.clientID)
	return c, nil
}

// dial opens the network connection and makes the MQTT CONNECT exchange,
// within connect_timeout.
func (s *Sink) dial(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", s.broker.addr)
	if err != nil {
		return nil, err
	}
	if s.tls != nil {
		tc := tls.Client(nc, s.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	sess := state.NewInMemory()
	c := &conn{session: sess}
	client := paho.NewClient(paho.ClientConfig{
		ClientID:      s.clientID,
		Conn:          nc,
		Session:       ackSession{sess},
		PacketTimeout: s.cfg.AckTimeout,
		OnServerDisconnect: func(d *paho.Disconnect) {
			s.logger.Warn("mqtt sink: the broker disconnected", "sink", s.name,
				"reason", fmt.Sprintf("0x%02X (%s)", d.ReasonCode, reasonText(d.ReasonCode)))
		},
		OnClientError: func(err error) {
			if c.closing.Load() {
				return
			}
			s.logger.Warn("mqtt sink: connection lost", "sink", s.name, "broker", s.shown, "error", err)
		},
	})
	cp := &paho.Connect{ClientID: s.clientID, CleanStart: true, KeepAlive: uint16(s.cfg.KeepAlive / time.Second)}
	if s.broker.username != "" {
		cp.Username, cp.UsernameFlag = s.broker.username, true
	}
	if s.broker.password != "" {
		cp.Password, cp.PasswordFlag = []byte(s.broker.password), true
	}
	ca, err := client.Connect(ctx, cp)
	if err != nil {
		sess.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			return nil, &ReasonError{Packet: "CONNACK", Code: ca.ReasonCode}
		}
		return nil, err
	}
	c.client = client
	if ca.Properties != nil {
		if ca.Properties.MaximumQoS != nil && *ca.Properties.MaximumQoS < 1 {
			_ = client.Disconnect(&paho.Disconnect{})
			sess.Close()
			return nil, errors.New("the broker's maximum QoS is 0: the sink needs QoS 1 to know a message arrived")
		}
		if ca.Properties.MaximumPacketSize != nil {
			c.maxPacket = *ca.Properties.MaximumPacketSize
		}
	}
	return c, nil
}

// Check implements sinks.Checker: it connects, or connects again when the
// connection dropped. A broker offers no way to ask whether a topic may be
// published to short of publishing, so this is all it can check.
func (s *Sink) Check(ctx context.Context) error {
	_, err := s.connect(ctx)
	return err
}

// CheckDestinations implements sinks.DestinationChecker: it connects and
// checks each topic is one Publish accepts (no wildcard, not under $, UTF-8
// without NUL). Whether the broker's ACL allows the topic shows on the
// first publish (PUBACK 0x87, Unavailable).
func (s *Sink) CheckDestinations(ctx context.Context, topics ...string) error {
	if _, err := s.connect(ctx); err != nil {
		return fmt.Errorf("sink %s: %w", s.name, err)
	}
	var errs []error
	for _, topic := range topics {
		if err := checkTopic(topic); err != nil {
			errs = append(errs, fmt.Errorf("sink %s: %w", s.name, sinks.Permanent(err)))
		}
	}
	return errors.Join(errs...)
}

// PublishesConcurrently implements sinks.ConcurrentPublisher: calls write
// on the one connection, whose in-flight window the broker bounds; each
// message's PUBACK goes to its own call (ackSession).
func (s *Sink) PublishesConcurrently() bool { return true }

// Publish sends events and returns one result per event, each recorded as
// its PUBACK arrives; see the package documentation for delivery, order and
// error classes.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, nil)
	c, ok := sinks.Connect(res, s.connect)
	if !ok {
		return res.Errors()
	}
	// The broker answers a connection's PUBLISHes in the order it got them
	// (MQTT 5, 4.6), so one goroutine awaits them in that order while the
	// rest are written.
	written := make(chan inflight, len(events))
	awaited := make(chan struct{})
	go func() {
		defer close(awaited)
		for f := range written {
			s.await(ctx, c, res, f)
		}
	}()
	s.send(ctx, c, res, events, written)
	close(written)
	<-awaited
	return res.Errors()
}

// inflight is one written PUBLISH awaiting its PUBACK.
type inflight struct {
	i    int
	ack  chan packets.ControlPacket
	sent time.Time
}

// send writes the events in order, each PUBLISH as soon as the broker's
// in-flight window has room, handing each to written.
func (s *Sink) send(ctx context.Context, c *conn, res *sinks.Results, events []sinks.Event, written chan<- inflight) {
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		p, err := encode(e, s.cfg, c.maxPacket)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		ack := make(chan packets.ControlPacket, 1)
		_, err = c.client.PublishWithOptions(context.WithValue(ctx, ackKey{}, ack), p,
			paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		switch {
		case err == nil:
			written <- inflight{i: i, ack: ack, sent: time.Now()}
		case errors.Is(err, paho.ErrNetworkErrorAfterStored), errors.Is(err, session.ErrNoConnection), isNetwork(err):
			res.Fail(i, sinks.Unavailable(fmt.Errorf("%w: %w", ErrConnectionLost, err)))
		case errors.Is(err, paho.ErrInvalidArguments):
			// QoS or retain beyond what the broker offers: every event
			// would fail alike.
			res.Fail(i, sinks.Unavailable(err))
		default: // ctx or ack_timeout ended while the window was full
			err = fmt.Errorf("waiting for room in the broker's in-flight window: %w", err)
			res.Fail(i, err)
			res.Stop(err)
		}
	}
}

// await waits for f's PUBACK, bounded by ack_timeout, the connection and
// ctx, and records the result.
func (s *Sink) await(ctx context.Context, c *conn, res *sinks.Results, f inflight) {
	timer := time.NewTimer(time.Until(f.sent.Add(s.cfg.AckTimeout)))
	defer timer.Stop()
	var resp packets.ControlPacket
	select {
	case resp = <-f.ack:
	case <-c.client.Done():
		select {
		case resp = <-f.ack: // it arrived just before the connection dropped
		default:
			res.Fail(f.i, sinks.Unavailable(ErrConnectionLost))
			return
		}
	case <-ctx.Done():
		res.Fail(f.i, fmt.Errorf("waiting for the PUBACK: %w (the broker may have the message)", ctx.Err()))
		return
	case <-timer.C:
		res.Fail(f.i, fmt.Errorf("no PUBACK within ack_timeout (%s): the broker may have the message", s.cfg.AckTimeout))
		return
	}
	puback, ok := resp.Content.(*packets.Puback)
	switch {
	case resp.Type == 0: // the session closed: the connection dropped and a new one replaced it
		res.Fail(f.i, sinks.Unavailable(ErrConnectionLost))
	case !ok:
		res.Fail(f.i, fmt.Errorf("mqtt: the broker answered a PUBLISH with packet type %d instead of PUBACK", resp.Type))
	case puback.ReasonCode >= 0x80:
		res.Fail(f.i, classifyReason(puback.ReasonCode))
	default:
		res.Delivered(f.i)
	}
}

// Close disconnects, within ctx's deadline. Nothing is buffered: Publish
// returns only once every message it wrote was acknowledged or reported
// failed. Publish fails with ErrClosed (Unavailable) afterwards. Close is
// idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.conn == nil {
		return nil
	}
	c := s.conn
	s.conn = nil
	defer c.session.Close()
	select {
	case <-c.client.Done():
		return nil
	default:
	}
	c.closing.Store(true)
	if err := c.client.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
		return fmt.Errorf("closing sink %s: disconnecting: %w", s.name, err)
	}
	select {
	case <-c.client.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("closing sink %s: waiting for the client to stop: %w", s.name, ctx.Err())
	}
}
