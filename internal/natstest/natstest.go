// Package natstest is test support for code that talks to NATS: the URL of
// the shared NATS server (skipping or failing when it is down), throwaway
// JetStream streams with a reader for what they hold, and in-process servers
// that a test may stop and restart.
//
// Tests share one NATS server and run in parallel across packages, so every
// stream and subject prefix natstest creates is unique and deleted in cleanup.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/localpeer"
)

// DefaultURL is the shared server's URL when NATS_URL is not set.
const DefaultURL = "nats://127.0.0.1:4222"

// URL returns the shared NATS server's URL: $NATS_URL, or DefaultURL. When
// no server answers there, the test fails if CI=true and is skipped
// otherwise, with what to start.
func URL(t testing.TB) string {
	t.Helper()
	return shared.URL(t)
}

var shared = localpeer.Service{Name: "NATS server", Env: "NATS_URL", Default: DefaultURL,
	Start: "nats-server -a 127.0.0.1 -p 4222 -js"}

// Connect connects to url and closes the connection in cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestStream is a JetStream stream made for one test.
type TestStream struct {
	// Name is the stream's unique name.
	Name string
	// Prefix is the unique subject prefix the stream covers by default
	// (its subjects are Prefix + ".>" unless the caller changed them).
	Prefix string
	// Subjects are the subjects the stream covers.
	Subjects []string

	js jetstream.JetStream
}

// Message is one message read back from a stream.
type Message struct {
	// Subject is where the message was published.
	Subject string
	// Seq is its stream sequence number.
	Seq uint64
	// Data is the payload.
	Data []byte
	// Header holds its headers (nil when it has none).
	Header nats.Header
}

// Stream creates a stream with a unique name covering a unique subject
// prefix (memory storage, a 2-minute duplicate window) and deletes it in
// cleanup. configure may change the configuration before creation (file
// storage for a test that restarts the server, other subjects…).
func Stream(t testing.TB, nc *nats.Conn, configure ...func(*jetstream.StreamConfig)) *TestStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: JetStream context: %v", err)
	}
	id := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	cfg := jetstream.StreamConfig{
		Name:       "HERALD_TEST_" + id,
		Subjects:   []string{"herald_test." + id + ".>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: 2 * time.Minute,
	}
	for _, f := range configure {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("natstest: creating stream %s on %v: %v", cfg.Name, cfg.Subjects, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := js.DeleteStream(ctx, cfg.Name)
		switch {
		case err == nil, errors.Is(err, jetstream.ErrStreamNotFound):
		case !nc.IsConnected():
			t.Logf("natstest: stream %s not deleted: the connection is down (%v)", cfg.Name, err)
		default:
			t.Errorf("natstest: deleting stream %s: %v", cfg.Name, err)
		}
	})
	return &TestStream{Name: cfg.Name, Prefix: "herald_test." + id, Subjects: cfg.Subjects, js: js}
}

// Subject returns Prefix followed by tokens, dot-separated.
func (s *TestStream) Subject(tokens ...string) string {
	return strings.Join(append([]string{s.Prefix}, tokens...), ".")
}

// Messages returns every message the stream holds, in stream order, with
// headers.
func (s *TestStream) Messages(t testing.TB) []Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	str, err := s.js.Stream(ctx, s.Name)
	if err != nil {
		t.Fatalf("natstest: stream %s: %v", s.Name, err)
	}
	state := str.CachedInfo().State
	if state.Msgs == 0 {
		return nil
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("natstest: reading stream %s: %v", s.Name, err)
	}
	out := make([]Message, 0, state.Msgs)
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("natstest: reading stream %s: %v", s.Name, err)
		}
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				t.Fatalf("natstest: reading stream %s: %v", s.Name, err)
			}
			out = append(out, Message{Subject: msg.Subject(), Seq: meta.Sequence.Stream, Data: msg.Data(), Header: msg.Headers()})
			if meta.Sequence.Stream >= state.LastSeq {
				return out
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("natstest: reading stream %s: %v", s.Name, err)
		}
		if ctx.Err() != nil {
			t.Fatalf("natstest: reading stream %s: got %d of %d messages before the deadline", s.Name, len(out), state.Msgs)
		}
	}
}

// Server is an in-process NATS server with JetStream, for tests that stop
// and restart a server. It keeps its port and store directory across
// restarts.
type Server struct {
	opts *server.Options
	mu   sync.Mutex
	srv  *server.Server
}

// StartServer starts a server with JetStream on a free port of 127.0.0.1 and
// a temporary store directory, shut down in cleanup. configure may change
// the options first (an authorization token, a smaller max_payload…).
func StartServer(t testing.TB, configure ...func(*server.Options)) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	for _, f := range configure {
		f(opts)
	}
	s := &Server{opts: opts}
	s.start(t)
	// Later starts reuse the port the first one got.
	addr, ok := s.srv.Addr().(*net.TCPAddr)
	if !ok {
		s.Shutdown()
		t.Fatalf("natstest: server address %v is not TCP", s.srv.Addr())
	}
	s.opts.Port = addr.Port
	t.Cleanup(s.Shutdown)
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	srv, err := server.NewServer(s.opts)
	if err != nil {
		t.Fatalf("natstest: creating server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatalf("natstest: server on port %d not ready after 10s", s.opts.Port)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
}

// URL returns the server's client URL (nats://127.0.0.1:port), the same
// across restarts.
func (s *Server) URL() string {
	return fmt.Sprintf("nats://%s:%d", s.opts.Host, s.opts.Port)
}

// Shutdown stops the server, closing every client connection, and waits
// until it stopped. Calling it on a stopped server does nothing.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts the server again, on the same port with the same store
// directory (file-stored streams survive), after Shutdown. Clients
// configured to reconnect find it again.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Shutdown()
	s.start(t)
}
