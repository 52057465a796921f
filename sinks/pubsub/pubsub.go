// Package pubsub is Herald's Google Cloud Pub/Sub sink: it publishes each
// event to the topic its Destination names (a topic id in the configured
// project), with the event key as the ordering key, through
// cloud.google.com/go/pubsub/v2.
//
// # Messages
//
// In the herald format (the default) the data is the event's payload, byte
// for byte; the ordering key is the event's key (none when it is empty).
// Attributes: every event header under its own name, plus
//
//	herald-id      the event id (the consumers' dedupe key)
//	herald-topic   the event's topic
//	content-type   the payload's media type
//
// A destination that is not a valid topic id (3 to 255 characters, starting
// with a letter, of letters, digits and - _ . ~ + %, not starting with
// "goog"), a header Pub/Sub cannot carry as an attribute (a name starting
// with "goog", over 256 bytes, a value over 1024 bytes), a key over 1024
// bytes or a message over 10 MB fails the event permanently, unsent.
//
// # CloudEvents
//
// With format: cloudevents each message is a CloudEvent per the Google
// Cloud Pub/Sub protocol binding for CloudEvents (package cloudevents,
// Binding PubSub; the binding is Google's, listed but not hosted by the
// CloudEvents spec). In the binary mode the data is the event's payload,
// the content-type attribute is datacontenttype, and every other attribute
// is a ce- attribute (ce-specversion, ce-id, ce-source, ce-type,
// ce-subject, ce-time, ce-traceparent, ce-<extension>). The binding's
// example also lists ce-datacontenttype; its normative text (3.1.1) puts the
// value in content-type, and so does the sink. In the structured mode the
// data is the JSON event format and the only attribute is content-type:
// application/cloudevents+json; charset=UTF-8. Either way the ordering key
// is the event key and there are no herald- attributes (consumers dedupe on
// the id attribute).
//
// # Delivery
//
// Publish hands the whole batch to the client library, which bundles the
// messages of a topic (per ordering key, up to 1000 messages or 5 MB a
// request), flushes them at the end of the call and reports a result per
// message; an event is delivered when Pub/Sub acknowledged its message,
// recorded as soon as the acknowledgement arrives and reported at once to a
// caller that asked (sinks.WithResultFunc).
// The library retries transient errors itself within timeout; Publish
// waits for every result or the end of its context.
//
// # Order
//
// Publishers have message ordering enabled: Pub/Sub keeps the messages of
// one ordering key in publish order for subscriptions with ordering
// enabled. After a failed request the library pauses the key, so later
// messages of the key in the call fail unsent (sinks.ErrSkipped); the sink
// resumes the key once it has reported the failure, so the relay's retry
// goes through.
//
// # Connection
//
// The client is created on first use (Check or Publish). gRPC reconnects
// by itself after the connection drops; while the endpoint refuses
// connections, publishing fails as Unavailable. One publisher is kept per
// topic, up to max_topics, and stopped (flushed) on Close.
//
// # Errors
//
//   - connection refused or the endpoint unreachable, credentials missing
//     or refused (Unauthenticated, PermissionDenied), the topic does not
//     exist (NotFound): sinks.Unavailable (the relay pauses the sink).
//     These are setup errors that affect every event.
//   - InvalidArgument from Pub/Sub, or a message refused before sending
//     (see Messages): permanent.
//   - Unavailable, DeadlineExceeded, ResourceExhausted and other transient
//     codes once the library's own retries ran out within timeout, or the
//     context ending first: retryable.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// bundleBytes is the request size at which the library sends a bundle
// before the end of the call: half of Pub/Sub's 10 MB request limit, so a
// bundle of small messages and one large one still fits.
const bundleBytes = 5_000_000

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("pubsub: sink closed")

// ErrKeyPaused is reported (wrapped, retryable) for the first event of a
// key in a call when the library still held the key paused after a failure
// the previous call had stopped waiting for. The sink resumes the key, so
// the next attempt is sent.
var ErrKeyPaused = errors.New("pubsub: ordering key paused after an earlier failed publish")

// Sink publishes events to Pub/Sub. Create it with New.
type Sink struct {
	name   string
	cfg    Config
	server string // where the client connects, for messages
	logger *slog.Logger

	// dialErr holds the last failure to open a connection, nil once one
	// opened: it tells a refused connection (Unavailable) from a transient
	// error of a connected server (retryable), which gRPC reports alike.
	dialErr atomic.Pointer[error]

	mu       sync.Mutex // guards client, closed, pubs and tick
	client   *pubsub.Client
	closed   bool
	pubs     map[string]*topicPublisher
	tick     uint64
	flushing sync.WaitGroup // flushes still running after their call
}

// topicPublisher is a cached publisher with its users, so that eviction
// never stops one a call is publishing through.
type topicPublisher struct {
	p        *pubsub.Publisher
	users    int
	lastUsed uint64
}

var (
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
	_ sinks.DestinationChecker  = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns the sink. It connects
// lazily, on the first Check or Publish, so a relay starts while Pub/Sub is
// unreachable. A nil logger means slog.Default().
func New(name string, cfg Config, logger *slog.Logger) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	server := cfg.Endpoint
	if server == "" {
		server = "pubsub.googleapis.com"
	}
	return &Sink{name: name, cfg: cfg, server: server, logger: logger, pubs: map[string]*topicPublisher{}}, nil
}

// Name returns the sink's name.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: the library's
// publishers are safe for concurrent use, and concurrent calls never share
// a key, so each key's messages still leave in order.
func (s *Sink) PublishesConcurrently() bool { return true }

// connect returns the client, creating it on first use. Creating it opens
// no connection (gRPC dials on the first request) but finds the
// credentials, which fails at once when there are none.
func (s *Sink) connect(ctx context.Context) (*pubsub.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sinks.Unavailable(ErrClosed)
	}
	if s.client != nil {
		return s.client, nil
	}
	opts := []option.ClientOption{option.WithGRPCDialOption(grpc.WithContextDialer(s.dial))}
	if s.cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(s.cfg.Endpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	} else if s.cfg.CredentialsFile != "" {
		t, err := credentialsType(s.cfg.CredentialsFile)
		if err != nil {
			return nil, sinks.Unavailable(fmt.Errorf("credentials_file: %w", err))
		}
		opts = append(opts, option.WithAuthCredentialsFile(t, s.cfg.CredentialsFile))
	}
	// The client outlives the call that creates it.
	client, err := pubsub.NewClient(context.WithoutCancel(ctx), s.cfg.Project, opts...)
	if err != nil {
		return nil, sinks.Unavailable(fmt.Errorf("connecting to Pub/Sub at %s: %w", s.server, err))
	}
	s.logger.InfoContext(ctx, "pubsub sink: client ready", "sink", s.name, "server", s.server, "project", s.cfg.Project)
	s.client = client
	return client, nil
}

// dial opens gRPC's connections and records the outcome in dialErr,
// logging when the endpoint stops or starts answering.
func (s *Sink) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if s.dialErr.Swap(&err) == nil {
			s.logger.WarnContext(ctx, "pubsub sink: cannot connect", "sink", s.name, "server", s.server, "error", err)
		}
		return nil, err
	}
	if s.dialErr.Swap(nil) != nil {
		s.logger.InfoContext(ctx, "pubsub sink: connected again", "sink", s.name, "server", s.server)
	}
	return conn, nil
}

// acquire returns the publisher of topic, creating it (and stopping the
// least recently used idle one beyond max_topics); release gives it back.
// It fails once Close has begun.
func (s *Sink) acquire(client *pubsub.Client, topic string) (*topicPublisher, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, sinks.Unavailable(ErrClosed)
	}
	s.tick++
	tp, ok := s.pubs[topic]
	if !ok {
		p := client.Publisher(topic)
		p.EnableMessageOrdering = true
		p.PublishSettings.Timeout = s.cfg.Timeout
		p.PublishSettings.CountThreshold = pubsub.MaxPublishRequestCount
		p.PublishSettings.ByteThreshold = bundleBytes
		// Publish flushes at the end of each call: a bundle is sent when
		// full or then, not when a timer cuts a batch into pieces.
		p.PublishSettings.DelayThreshold = s.cfg.Timeout
		tp = &topicPublisher{p: p}
		s.pubs[topic] = tp
	}
	tp.users++
	tp.lastUsed = s.tick
	var evicted *pubsub.Publisher
	if len(s.pubs) > s.cfg.MaxTopics {
		var oldest string
		for t, c := range s.pubs {
			if c.users == 0 && (oldest == "" || c.lastUsed < s.pubs[oldest].lastUsed) {
				oldest = t
			}
		}
		if oldest != "" {
			evicted = s.pubs[oldest].p
			delete(s.pubs, oldest)
		}
	}
	s.mu.Unlock()
	if evicted != nil {
		// Idle: Stop has nothing left to send but the goroutines to end.
		evicted.Stop()
	}
	return tp, nil
}

func (s *Sink) release(tp *topicPublisher) {
	s.mu.Lock()
	tp.users--
	s.mu.Unlock()
}

// orderKey is a key's queue in Pub/Sub: ordering holds per topic and key.
type orderKey struct{ topic, key string }

// sent is an event handed to the library, awaiting its result.
type sent struct {
	i      int
	result *pubsub.PublishResult
}

// Publish implements sinks.Sink: each event's result is recorded as
// Pub/Sub acknowledges its message.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, topic)
	client, ok := sinks.Connect(res, s.connect)
	if !ok {
		return res.Errors()
	}
	used := map[string]*topicPublisher{}
	// The messages handed to the library, one queue per ordering key (the
	// library completes a key's messages in order) and one per keyless
	// message.
	queues := map[orderKey][]sent{}
	var keyless [][]sent
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		if err := checkTopicID(e.Destination); err != nil {
			res.Fail(i, sinks.Permanent(fmt.Errorf("destination: %w", err)))
			continue
		}
		msg, err := encode(e, s.cfg)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		tp, ok := used[e.Destination]
		if !ok {
			if tp, err = s.acquire(client, e.Destination); err != nil {
				res.Fail(i, err)
				continue
			}
			used[e.Destination] = tp
		}
		p := sent{i: i, result: tp.p.Publish(ctx, msg)}
		if e.Key == "" {
			keyless = append(keyless, []sent{p})
			continue
		}
		k := orderKey{e.Destination, e.Key}
		queues[k] = append(queues[k], p)
	}

	// Send the bundles now rather than after the library's delay. Flush
	// takes no context, so it runs apart; the publishers stay acquired
	// (not evicted, not stopped) until it returns, which the library's
	// timeout bounds.
	s.flushing.Add(1)
	go func() {
		defer s.flushing.Done()
		for _, tp := range used {
			tp.p.Flush()
			s.release(tp)
		}
	}()

	var wg sync.WaitGroup
	for _, q := range keyless {
		wg.Go(func() { s.settle(ctx, res, q) })
	}
	for k, q := range queues {
		wg.Go(func() {
			if s.settle(ctx, res, q) {
				// The library keeps a failed key paused until told
				// otherwise: the failure is reported, and the relay
				// decides when to send the key again.
				used[k.topic].p.ResumePublish(k.key)
			}
		})
	}
	wg.Wait()
	return res.Errors()
}

// topic names an event's topic in errors.
func topic(e *sinks.Event) string { return "topic " + strconv.Quote(e.Destination) }

// settle records the results of one queue's messages, in order, as they
// arrive, and reports whether one failed.
func (s *Sink) settle(ctx context.Context, res *sinks.Results, queue []sent) (failed bool) {
	for _, p := range queue {
		_, err := p.result.Get(ctx)
		var paused pubsub.ErrPublishingPaused
		switch {
		case err == nil:
			res.Delivered(p.i)
			continue
		case errors.As(err, &paused):
			// Not sent: skipped behind a failure of this call, or paused
			// by one of an earlier call.
			if !res.Blocked(p.i) {
				res.Fail(p.i, ErrKeyPaused)
			}
		default:
			res.Fail(p.i, s.classify(err))
		}
		failed = true
	}
	return failed
}

// classify marks err (from the library, a request or the context) with the
// relay's error class.
func (s *Sink) classify(err error) error {
	if errors.Is(err, pubsub.ErrOversizedMessage) {
		return sinks.Permanent(err)
	}
	if errors.Is(err, pubsub.ErrPublisherStopped) {
		return sinks.Unavailable(err)
	}
	switch status.Code(err) {
	case codes.NotFound:
		return sinks.Unavailable(fmt.Errorf("%w (create the topic in project %q)", err, s.cfg.Project))
	case codes.PermissionDenied, codes.Unauthenticated:
		return sinks.Unavailable(err)
	case codes.InvalidArgument:
		return sinks.Permanent(err)
	}
	if p := s.dialErr.Load(); p != nil {
		// A request that failed while no connection could be opened
		// failed for that reason, whatever gRPC or the context said.
		return sinks.Unavailable(fmt.Errorf("%w: cannot connect to %s: %w", err, s.server, *p))
	}
	return err
}

// Check implements sinks.Checker: it creates the client and lists one topic
// of the project, which proves the endpoint answers and accepts the
// credentials. PermissionDenied passes: a publisher's role may lack the
// right to list topics, and the server has checked the credentials before
// answering it.
func (s *Sink) Check(ctx context.Context) error {
	client, err := s.connect(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	it := client.TopicAdminClient.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/" + s.cfg.Project, PageSize: 1})
	if _, err := it.Next(); err != nil && !errors.Is(err, iterator.Done) && status.Code(err) != codes.PermissionDenied {
		return s.classify(fmt.Errorf("listing the topics of project %q on %s: %w", s.cfg.Project, s.server, err))
	}
	return nil
}

// CheckDestinations implements sinks.DestinationChecker: each destination
// must be a valid topic id, and the topic must exist. A topic the
// credentials may not look up (PermissionDenied: publishers usually hold
// only the right to publish) is left to publishing to check.
func (s *Sink) CheckDestinations(ctx context.Context, destinations ...string) error {
	client, err := s.connect(ctx)
	if err != nil {
		return fmt.Errorf("sink %s: %w", s.name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, d := range destinations {
		if err := checkTopicID(d); err != nil {
			errs = append(errs, fmt.Errorf("sink %s: %w", s.name, err))
			continue
		}
		_, err := client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: "projects/" + s.cfg.Project + "/topics/" + d})
		switch status.Code(err) {
		case codes.OK:
		case codes.PermissionDenied:
			s.logger.DebugContext(ctx, "pubsub sink: not allowed to look the topic up; publishing will tell", "sink", s.name, "topic", d)
		case codes.NotFound:
			errs = append(errs, fmt.Errorf("sink %s: topic %q does not exist in project %q", s.name, d, s.cfg.Project))
		default:
			errs = append(errs, fmt.Errorf("sink %s: looking up topic %q: %w", s.name, d, s.classify(err)))
		}
	}
	return errors.Join(errs...)
}

// Close implements sinks.Sink: it waits for the flushes of earlier calls,
// stops every publisher (which sends what they still hold) and closes the
// client, giving up waiting when ctx ends.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	client, pubs := s.client, s.pubs
	s.client, s.pubs = nil, nil
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.flushing.Wait()
		for _, tp := range pubs {
			tp.p.Stop()
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("closing pubsub sink %s: publishers still flushing: %w", s.name, ctx.Err())
	}
	if client == nil {
		return nil
	}
	if err := client.Close(); err != nil {
		return fmt.Errorf("closing pubsub sink %s: %w", s.name, err)
	}
	return nil
}
