package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldhq/herald/internal/smtptest"
	natssink "github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

// arrivals records, per sink, when each event id first reached the sink's
// peer, and how many copies arrived.
type arrivals struct {
	mu     sync.Mutex
	first  map[string]time.Time
	copies map[string]int
	dups   int
}

func newArrivals() *arrivals {
	return &arrivals{first: map[string]time.Time{}, copies: map[string]int{}}
}

func (a *arrivals) add(id string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.first[id]; ok {
		a.dups++
	} else {
		a.first[id] = at
	}
	a.copies[id]++
}

// count returns the distinct events and the extra copies received so far.
func (a *arrivals) count() (distinct, duplicates int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.first), a.dups
}

func (a *arrivals) snapshot() map[string]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]time.Time, len(a.first))
	for k, v := range a.first {
		out[k] = v
	}
	return out
}

// natsPeer is an embedded NATS server with JetStream, a stream covering the
// demo's subjects, and a subscriber recording what arrives.
type natsPeer struct {
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	got    *arrivals
}

// natsSubjectPrefix is what the demo's destination template puts in front
// of the topic; the stream covers natsSubjectPrefix.>.
const natsSubjectPrefix = "herald"

func startNATS(ctx context.Context, storeDir string) (*natsPeer, error) {
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: storeDir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the embedded NATS server: %w", err)
	}
	srv.Start()
	p := &natsPeer{srv: srv, stream: "HERALD_DEMO", got: newArrivals()}
	if !srv.ReadyForConnections(10 * time.Second) {
		p.close()
		return nil, errors.New("the embedded NATS server was not ready after 10s")
	}
	if p.nc, err = nats.Connect(srv.ClientURL()); err != nil {
		p.close()
		return nil, fmt.Errorf("connecting to the embedded NATS server: %w", err)
	}
	if p.js, err = jetstream.New(p.nc); err != nil {
		p.close()
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	if _, err := p.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: p.stream, Subjects: []string{natsSubjectPrefix + ".>"}, Storage: jetstream.MemoryStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		p.close()
		return nil, fmt.Errorf("creating stream %s: %w", p.stream, err)
	}
	// The subscriber sees each message as the server stores it.
	sub, err := p.nc.Subscribe(natsSubjectPrefix+".>", func(m *nats.Msg) {
		p.got.add(m.Header.Get(natssink.HeaderMsgID), time.Now())
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = p.nc.Flush()
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("subscribing to %s.>: %w", natsSubjectPrefix, err)
	}
	return p, nil
}

func (p *natsPeer) url() string { return p.srv.ClientURL() }

// stored returns how many messages the stream holds.
func (p *natsPeer) stored(ctx context.Context) (uint64, error) {
	s, err := p.js.Stream(ctx, p.stream)
	if err != nil {
		return 0, fmt.Errorf("reading stream %s: %w", p.stream, err)
	}
	return s.CachedInfo().State.Msgs, nil
}

func (p *natsPeer) close() {
	if p.nc != nil {
		p.nc.Close()
	}
	p.srv.Shutdown()
	p.srv.WaitForShutdown()
}

// webhookSecret signs the demo's webhook requests.
const webhookSecret = sinkconfig.Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")

// webhookPeer is an HTTP endpoint verifying signatures, that answers 503
// during an outage and 400 to the orders.paid events of rejected orders
// until it is fixed.
type webhookPeer struct {
	srv *http.Server
	ln  net.Listener
	got *arrivals

	outage      atomic.Bool
	fixed       atomic.Bool
	unavailable atomic.Int64 // 503 answers
	refused     atomic.Int64 // 400 answers

	mu       sync.Mutex
	rejected map[string]bool // order ids
}

func startWebhook() (*webhookPeer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the webhook receiver: %w", err)
	}
	p := &webhookPeer{ln: ln, got: newArrivals(), rejected: map[string]bool{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *webhookPeer) url() string { return "http://" + p.ln.Addr().String() + "/webhook" }

// reject makes the receiver refuse the orders.paid event of an order until
// fix is called.
func (p *webhookPeer) reject(orderID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rejected[orderID] = true
}

func (p *webhookPeer) isRejected(orderID string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rejected[orderID]
}

func (p *webhookPeer) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
	if err != nil {
		http.Error(w, "reading body", http.StatusBadRequest)
		return
	}
	if err := webhook.Verify(webhookSecret, r.Header, body, 5*time.Minute); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if p.outage.Load() {
		p.unavailable.Add(1)
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	var env struct {
		ID, Topic, Key string
	}
	if err := json.Unmarshal(body, &env); err != nil {
		http.Error(w, "not a Herald envelope", http.StatusBadRequest)
		return
	}
	if env.Topic == "orders.paid" && !p.fixed.Load() && p.isRejected(env.Key) {
		p.refused.Add(1)
		http.Error(w, "order "+env.Key+" is unknown to billing", http.StatusBadRequest)
		return
	}
	p.got.add(env.ID, at)
	w.WriteHeader(http.StatusNoContent)
}

func (p *webhookPeer) close(ctx context.Context) { _ = p.srv.Shutdown(ctx) }

// mailPeer is the in-process SMTP server, watched for new messages.
type mailPeer struct {
	srv  *smtptest.Server
	got  *arrivals
	seen int
	stop chan struct{}
	done chan struct{}
}

func startMail() (*mailPeer, error) {
	srv, err := smtptest.Start()
	if err != nil {
		return nil, err
	}
	p := &mailPeer{srv: srv, got: newArrivals(), stop: make(chan struct{}), done: make(chan struct{})}
	go p.watch()
	return p, nil
}

// watch records new messages every 5ms: the arrival times are within 5ms.
func (p *mailPeer) watch() {
	defer close(p.done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.poll()
			return
		case <-tick.C:
			p.poll()
		}
	}
}

func (p *mailPeer) poll() {
	msgs := p.srv.Messages()
	now := time.Now()
	for _, m := range msgs[p.seen:] {
		p.got.add(m.Header("X-Herald-Event-Id"), now)
	}
	p.seen = len(msgs)
}

func (p *mailPeer) close() {
	close(p.stop)
	<-p.done
	_ = p.srv.Close()
}
