package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"strconv"
	"strings"
	"sync"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Sink sends one email per event through an SMTP server. It implements
// sinks.Sink.
type Sink struct {
	name   string
	cfg    Config
	from   *mail.Address
	domain string // right part of Message-IDs
	tmpl   *templates
	tls    *tls.Config // nil with TLSNone
	addr   string
	logger *slog.Logger

	// turn lets one message at a time use the connection, over all calls.
	turn *sinks.Limiter

	mu     sync.Mutex   // guards client, between sending and Check or Close
	client *smtp.Client // nil until connected, and after a connection error
}

// New validates cfg, parses the templates of cfg.TemplatesDir and returns the
// sink called name. It does not connect: the first Publish does. A nil logger
// means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	from, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	s := &Sink{
		name:   name,
		cfg:    cfg,
		from:   from,
		domain: from.Address[strings.LastIndexByte(from.Address, '@')+1:],
		addr:   net.JoinHostPort(cfg.SMTP.Host, strconv.Itoa(cfg.SMTP.Port)),
		logger: logger,
		turn:   sinks.NewLimiter(1),
	}
	if cfg.SMTP.TLS != TLSNone {
		s.tls, err = cfg.SMTP.TLSConfig.Build("smtp.tls_config")
		if err != nil {
			return nil, err
		}
		if s.tls == nil {
			s.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if s.tls.ServerName == "" {
			s.tls.ServerName = cfg.SMTP.Host
		}
	}
	if s.tmpl, err = loadTemplates(cfg.TemplatesDir); err != nil {
		return nil, err
	}
	if cfg.Template != "" && !s.tmpl.names[cfg.Template] {
		return nil, fmt.Errorf("template: no %s.txt or %s.html in templates_dir %s", cfg.Template, cfg.Template, cfg.TemplatesDir)
	}
	return s, nil
}

// Name implements sinks.Sink.
func (s *Sink) Name() string { return s.name }

// Publish implements sinks.Sink: it sends the events one at a time over
// one SMTP connection, a key's events in order, each result recorded as the
// server answers (sinks.Results.PublishEach). See the package documentation
// for how failures are classified.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	return sinks.NewResults(ctx, events, s.where).PublishEach(s.turn, s.send)
}

// where names the sink in errors: recipients come from payloads.
func (s *Sink) where(*sinks.Event) string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: concurrent
// calls take turns on the connection, one message at a time.
func (s *Sink) PublishesConcurrently() bool { return true }

// send renders and delivers one event.
func (s *Sink) send(ctx context.Context, e *sinks.Event) error {
	m, err := s.render(*e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A connection kept from an earlier call may have been closed by the
	// server meanwhile. A network error before the message's final dot
	// delivered nothing, so it is retried once on a fresh connection.
	for retried := false; ; retried = true {
		fresh := s.client == nil
		if fresh {
			if err := s.connect(ctx); err != nil {
				return err
			}
		}
		c := s.client
		// The client's calls take no context: closing the connection is
		// how ctx interrupts them.
		stop := context.AfterFunc(ctx, func() { c.Close() })
		sent, err := s.transact(m)
		if !stop() {
			s.drop()
		}
		var smtpErr *smtp.SMTPError
		switch {
		case err == nil:
			return nil
		case sinks.IsPermanent(err):
			return err // checked before MAIL: nothing to reset
		case errors.As(err, &smtpErr) && smtpErr.Code != 421 && s.client != nil:
			return s.refused(smtpErr, err)
		}
		// The connection broke, or the server is closing it (421).
		s.drop()
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w (%w)", err, cerr)
		}
		if !fresh && !sent && !retried {
			s.logger.InfoContext(ctx, "email: reconnecting after the server closed the connection", "sink", s.name, "error", err)
			continue
		}
		if smtpErr != nil && !sent {
			return sinks.Unavailable(err) // 421 on a fresh connection
		}
		// After the final dot the outcome is unknown: the retry may
		// duplicate the email (at-least-once).
		return err
	}
}

// transact runs MAIL, RCPT and DATA for m. sent reports whether the whole
// message was written, after which a network error leaves the outcome
// unknown.
func (s *Sink) transact(m *message) (sent bool, err error) {
	c := s.client
	if limit, ok := c.MaxMessageSize(); ok && limit > 0 && len(m.data) > limit {
		return false, fmt.Errorf("the server's SIZE: %w", sinks.TooLarge(len(m.data), limit))
	}
	opts := &smtp.MailOptions{Size: int64(len(m.data))}
	if m.utf8 {
		if ok, _ := c.Extension("SMTPUTF8"); !ok {
			return false, sinks.Permanent(errors.New("a recipient address is not ASCII and the server does not support SMTPUTF8"))
		}
		opts.UTF8 = true
	}
	if err := c.Mail(s.from.Address, opts); err != nil {
		return false, senderError{fmt.Errorf("MAIL FROM:<%s>: %w", s.from.Address, err)}
	}
	for _, to := range m.to {
		if err := c.Rcpt(to, nil); err != nil {
			return false, fmt.Errorf("recipient <%s>: %w", to, err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return false, fmt.Errorf("DATA: %w", err)
	}
	if _, err := w.Write(m.data); err != nil {
		return false, err
	}
	if err := w.Close(); err != nil {
		return true, fmt.Errorf("message: %w", err)
	}
	return true, nil
}

// refused turns the server's refusal of e into the sink's error: 5xx is
// permanent, 4xx retryable, and a refusal of the client itself
// (authentication, the configured sender) unavailable. It resets the transaction so the connection
// serves the next event.
func (s *Sink) refused(smtpErr *smtp.SMTPError, err error) error {
	var sender senderError
	if isAuthCode(smtpErr.Code) || errors.As(err, &sender) && smtpErr.Code >= 500 && smtpErr.Code != 552 {
		// The sender is the same for every event: its refusal (other than
		// for the message's size) is a configuration problem, not the
		// event's.
		s.drop()
		return sinks.Unavailable(err)
	}
	if rerr := s.client.Reset(); rerr != nil {
		s.drop()
	}
	if smtpErr.Code >= 500 {
		return sinks.Permanent(err)
	}
	return err
}

// senderError marks the server's answer to MAIL FROM.
type senderError struct{ err error }

func (e senderError) Error() string { return e.err.Error() }
func (e senderError) Unwrap() error { return e.err }

// isAuthCode reports the replies that refuse this client rather than one
// message: authentication required, too weak, failed or needing encryption.
func isAuthCode(code int) bool {
	return code == 530 || code == 534 || code == 535 || code == 538 || code == 454
}

// Check implements sinks.Checker: unless connected, it dials the server,
// secures the connection, greets it (EHLO) and authenticates as Publish
// would, and keeps the connection for the next event.
func (s *Sink) Check(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		if err := s.client.Noop(); err == nil {
			return nil
		}
		s.drop()
	}
	return s.connect(ctx)
}

// connect dials the server, secures the connection and authenticates. Every
// failure is sinks.Unavailable: the destination, not an event, is at fault.
func (s *Sink) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	c, err := s.dial(ctx)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w (%v)", cerr, err)
		}
		return sinks.Unavailable(fmt.Errorf("connecting sink %s to SMTP server %s: %w", s.name, s.addr, err))
	}
	c.CommandTimeout = s.cfg.Timeout
	c.SubmissionTimeout = s.cfg.Timeout
	s.client = c
	s.logger.DebugContext(ctx, "email: connected", "sink", s.name, "addr", s.addr, "tls", s.cfg.SMTP.TLS)
	return nil
}

func (s *Sink) dial(ctx context.Context) (*smtp.Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return nil, err
	}
	// Closing the connection is how ctx interrupts the greeting, STARTTLS
	// and AUTH.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	c, err := s.handshake(ctx, conn)
	if !stop() && err == nil {
		c.Close()
		err = ctx.Err()
	}
	return c, err
}

// handshake greets the server on conn, secures the connection and
// authenticates, as configured.
func (s *Sink) handshake(ctx context.Context, conn net.Conn) (*smtp.Client, error) {
	var err error
	var c *smtp.Client
	switch s.cfg.SMTP.TLS {
	case TLSImplicit:
		tc := tls.Client(conn, s.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		c = smtp.NewClient(tc)
	case TLSStartTLS:
		c, err = smtp.NewClientStartTLS(conn, s.tls)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("STARTTLS: %w", err)
		}
	default:
		c = smtp.NewClient(conn)
	}
	// Greet (again, after STARTTLS: this runs the TLS handshake).
	if err := c.Hello("localhost"); err != nil {
		c.Close()
		return nil, fmt.Errorf("EHLO: %w", err)
	}
	if s.cfg.SMTP.Username != "" {
		if !c.SupportsAuth(sasl.Plain) {
			c.Close()
			return nil, errors.New("AUTH: the server does not offer AUTH PLAIN")
		}
		if err := c.Auth(sasl.NewPlainClient("", s.cfg.SMTP.Username, s.cfg.SMTP.Password.Reveal())); err != nil {
			c.Close()
			return nil, fmt.Errorf("AUTH PLAIN as %s: %w", s.cfg.SMTP.Username, err)
		}
	}
	return c, nil
}

// drop closes the connection after an error; the next event reconnects.
func (s *Sink) drop() {
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
}

// Close implements sinks.Sink: it says QUIT and closes the connection.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.client
	if c == nil {
		return nil
	}
	s.client = nil
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := c.Quit(); err != nil {
		c.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("closing sink %s: %w", s.name, ctx.Err())
		}
		// The server may have closed an idle connection already: nothing
		// is lost.
		s.logger.DebugContext(ctx, "email: QUIT failed", "sink", s.name, "error", err)
	}
	return nil
}
