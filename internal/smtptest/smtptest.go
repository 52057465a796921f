// Package smtptest runs a real SMTP server (github.com/emersion/go-smtp) in
// the calling process that keeps every message it accepts, so tests, the
// orders example and the demo can check what the email sink really sent.
package smtptest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/mail"
	"strconv"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
)

// Message is one accepted message.
type Message struct {
	From string
	To   []string
	// Data is the message as received (headers and body).
	Data []byte
}

// Header parses the message and returns one header's value ("" if absent
// or unparsable).
func (m Message) Header(name string) string {
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		return ""
	}
	return msg.Header.Get(name)
}

// Server is a running SMTP server on 127.0.0.1.
type Server struct {
	srv  *smtp.Server
	ln   net.Listener
	mu   sync.Mutex
	msgs []Message
	// Reject, when set, is asked about every recipient: a non-nil error
	// (use *smtp.SMTPError for a specific code) refuses it.
	reject func(to string) error
}

// Start listens on a free port of 127.0.0.1 and serves until Close.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("smtptest: listening: %w", err)
	}
	s := &Server{ln: ln}
	s.srv = smtp.NewServer(backend{s})
	s.srv.Domain = "localhost"
	s.srv.AllowInsecureAuth = true
	s.srv.ReadTimeout = 30 * time.Second
	s.srv.WriteTimeout = 30 * time.Second
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Host and Port are where the server listens.
func (s *Server) Host() string { return "127.0.0.1" }

// Port is the server's TCP port.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.ln.Addr().String())
	n, _ := strconv.Atoi(p)
	return n
}

// SetReject installs (or, with nil, removes) a recipient filter.
func (s *Server) SetReject(f func(to string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reject = f
}

// Messages returns the messages accepted so far, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }

type backend struct{ s *Server }

func (b backend) NewSession(*smtp.Conn) (smtp.Session, error) { return &session{s: b.s}, nil }

type session struct {
	s    *Server
	from string
	to   []string
}

func (x *session) Reset()        { x.from, x.to = "", nil }
func (x *session) Logout() error { return nil }

func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.from = from
	return nil
}

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.s.mu.Lock()
	reject := x.s.reject
	x.s.mu.Unlock()
	if reject != nil {
		if err := reject(to); err != nil {
			return err
		}
	}
	x.to = append(x.to, to)
	return nil
}

func (x *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if len(x.to) == 0 {
		return errors.New("smtptest: no recipients")
	}
	x.s.mu.Lock()
	x.s.msgs = append(x.s.msgs, Message{From: x.from, To: append([]string(nil), x.to...), Data: data})
	x.s.mu.Unlock()
	return nil
}
