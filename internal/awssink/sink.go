package awssink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Service is what an sqs or sns sink does with its service's client; Sink
// does the rest.
type Service interface {
	// Send is a SendFunc: it sends one batch request.
	Send(ctx context.Context, destination string, entries []Entry) ([]error, error)
	// Ping makes a request that needs the endpoint to answer and the
	// credentials to be accepted (listing one queue or topic).
	Ping(ctx context.Context) error
	// CheckDestination checks that destination exists and that its
	// attributes are readable.
	CheckDestination(ctx context.Context, destination string) error
	// Describe names destination in errors: queue "orders".
	Describe(destination string) string
}

// Sink is an sqs or sns sink: its settings and state, and what it does the
// same way for both services; the service's own part is its Service. It
// implements sinks.ConcurrentPublisher and sinks.DestinationChecker.
type Sink struct {
	name    string
	kind    string // the service's name in logs: sqs, sns
	cfg     Config
	logger  *slog.Logger
	service Service
	// limit bounds the requests in flight over every Publish call.
	limit *sinks.Limiter

	mu     sync.Mutex // guards closed
	closed bool
}

var (
	_ sinks.ConcurrentPublisher = (*Sink)(nil)
	_ sinks.DestinationChecker  = (*Sink)(nil)
)

// New validates cfg, fills its defaults and returns the sink called name of
// the service kind ("sqs", "sns"), whose Service connect makes from the AWS
// configuration. It connects lazily (Check or the first Publish). A nil
// logger means slog.Default().
func New(kind, name string, cfg Config, logger *slog.Logger, connect func(aws.Config) Service) (*Sink, error) {
	cfg, logger, err := sinkconfig.Prepare(cfg, logger)
	if err != nil {
		return nil, err
	}
	awsCfg, err := cfg.Load(context.Background())
	if err != nil {
		return nil, fmt.Errorf("sink %s: %w", name, err)
	}
	return &Sink{name: name, kind: kind, cfg: cfg, logger: logger, service: connect(awsCfg),
		limit: sinks.NewLimiter(cfg.MaxInFlight)}, nil
}

// Name implements sinks.Sink.
func (s *Sink) Name() string { return s.name }

// PublishesConcurrently implements sinks.ConcurrentPublisher: the client
// runs each request on a connection of its own, and max_in_flight bounds
// the requests of all calls together.
func (s *Sink) PublishesConcurrently() bool { return true }

func (s *Sink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Check implements sinks.Checker with the Service's Ping.
func (s *Sink) Check(ctx context.Context) error {
	if s.isClosed() {
		return sinks.Unavailable(ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.service.Ping(ctx); err != nil {
		return CheckError(fmt.Errorf("sink %s at %s: %w", s.name, s.cfg.Shown(), err))
	}
	return nil
}

// CheckDestinations implements sinks.DestinationChecker: it checks each
// destination with the Service, after Check.
func (s *Sink) CheckDestinations(ctx context.Context, destinations ...string) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, d := range destinations {
		if err := s.service.CheckDestination(ctx, d); err != nil {
			errs = append(errs, CheckError(fmt.Errorf("sink %s: %s: %w", s.name, s.service.Describe(d), err)))
		}
	}
	return errors.Join(errs...)
}

// Publish implements sinks.Sink: it sends events in batch requests and
// records each event's result as its request is answered (see publish).
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	res := sinks.NewResults(ctx, events, func(e *sinks.Event) string { return s.service.Describe(e.Destination) })
	if len(events) == 0 || res.Ended() {
		return res.Errors()
	}
	if s.isClosed() {
		res.FailRest(sinks.Unavailable(ErrClosed))
		return res.Errors()
	}
	errs := publish(ctx, res, events, s.service.Send, s.limit)
	for _, err := range errs {
		if sinks.IsUnavailable(err) {
			s.logger.WarnContext(ctx, s.kind+" sink: unavailable", "sink", s.name, "endpoint", s.cfg.Shown(), "error", err)
			break
		}
	}
	return errs
}

// Close marks the sink closed; nothing is buffered between calls. Publish
// fails with Unavailable afterwards. Close is idempotent.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
