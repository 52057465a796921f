package email_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"mime"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// serverOpts configure a test SMTP server.
type serverOpts struct {
	tls         *tls.Config // offers STARTTLS (or implicit TLS with implicit)
	implicit    bool
	user, pass  string // AUTH PLAIN required when set
	maxBytes    int64
	readTimeout time.Duration
	utf8        bool
}

// received is one message a test server accepted.
type received struct {
	from string
	to   []string
	data []byte
	tls  bool
	user string
	msg  *mail.Message
}

// header returns the decoded value of a header of the message.
func (r received) header(name string) string {
	v, err := new(mime.WordDecoder).DecodeHeader(r.msg.Header.Get(name))
	if err != nil {
		return "undecodable: " + err.Error()
	}
	return v
}

// testServer is a real go-smtp server on a free 127.0.0.1 port whose
// backend stores what it accepts. It refuses the sender blocked@ (553). Recipients steer failures by their local
// part: reject550@, busy451@ (RCPT), rejectdata554@, busydata452@ (DATA),
// hang@ (DATA never answers until the test ends).
type testServer struct {
	host string
	port int
	opts serverOpts

	release chan struct{} // closed at cleanup: unblocks hang@ recipients

	mu       sync.Mutex
	msgs     []received
	sessions int
	ended    int // sessions whose connection closed
}

func startServer(t *testing.T, opts serverOpts) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{host: "127.0.0.1", port: ln.Addr().(*net.TCPAddr).Port, opts: opts, release: make(chan struct{})}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		ts.mu.Lock()
		ts.sessions++
		ts.mu.Unlock()
		return &session{ts: ts, conn: c}, nil
	}))
	srv.Domain = "localhost"
	srv.MaxMessageBytes = opts.maxBytes
	srv.ReadTimeout = opts.readTimeout
	srv.EnableSMTPUTF8 = opts.utf8
	srv.ErrorLog = log.New(io.Discard, "", 0)
	if opts.implicit {
		ln = tls.NewListener(ln, opts.tls)
	} else {
		srv.TLSConfig = opts.tls
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		close(ts.release)
		srv.Close()
		<-done
	})
	return ts
}

// messages returns what the server accepted so far.
func (ts *testServer) messages() []received {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]received(nil), ts.msgs...)
}

func (ts *testServer) sessionCount() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.sessions
}

// endedCount is how many sessions' connections have closed.
func (ts *testServer) endedCount() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.ended
}

type session struct {
	ts   *testServer
	conn *smtp.Conn
	from string
	to   []string
	user string
}

func (s *session) AuthMechanisms() []string {
	if s.ts.opts.user == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, username, password string) error {
		if username != s.ts.opts.user || password != s.ts.opts.pass {
			return smtp.ErrAuthFailed
		}
		s.user = username
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.ts.opts.user != "" && s.user == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	if strings.HasPrefix(from, "blocked@") {
		return &smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Sender address rejected"}
	}
	s.from = from
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	switch {
	case strings.HasPrefix(to, "reject550@"):
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "No such user"}
	case strings.HasPrefix(to, "busy451@"):
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Try again later"}
	}
	s.to = append(s.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	for _, to := range s.to {
		switch {
		case strings.HasPrefix(to, "rejectdata554@"):
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "Message refused"}
		case strings.HasPrefix(to, "busydata452@"):
			return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 3, 1}, Message: "Mailbox full"}
		case strings.HasPrefix(to, "hang@"):
			<-s.ts.release
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Released"}
		}
	}
	msg, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "unparsable message: " + err.Error()}
	}
	_, isTLS := s.conn.TLSConnectionState()
	s.ts.mu.Lock()
	s.ts.msgs = append(s.ts.msgs, received{from: s.from, to: s.to, data: data, tls: isTLS, user: s.user, msg: msg})
	s.ts.mu.Unlock()
	return nil
}

func (s *session) Reset() { s.from, s.to = "", nil }

func (s *session) Logout() error {
	s.ts.mu.Lock()
	s.ts.ended++
	s.ts.mu.Unlock()
	return nil
}

// selfSignedCert returns a server TLS config for 127.0.0.1 and the path of
// a PEM file trusting it.
func selfSignedCert(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "herald test SMTP"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}
	return cfg, path
}
