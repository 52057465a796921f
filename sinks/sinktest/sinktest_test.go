package sinktest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// peer is an in-memory destination: what it received, per destination.
type peer struct {
	mu   sync.Mutex
	got  map[string][]sinktest.Received
	down bool
}

func (p *peer) receive(e *sinks.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got == nil {
		p.got = map[string][]sinktest.Received{}
	}
	p.got[e.Destination] = append(p.got[e.Destination], sinktest.Received{ID: e.ID, Key: e.Key,
		Destination: e.Destination, Payload: e.Payload, Headers: e.Headers})
}

func (p *peer) received(dest string) []sinktest.Received {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]sinktest.Received(nil), p.got[dest]...)
}

// maxPayload is the memory sink's limit: sinktest.Oversized events over it
// are refused.
const maxPayload = 64

// fault is a way a sink can break the contract; "" is none.
type fault string

const (
	// downIsPlain reports a peer that is down as a plain error, which
	// would cost each event an attempt.
	downIsPlain fault = "down-is-plain"
	// sendsPastAFailedKey keeps sending a key's events after one failed.
	sendsPastAFailedKey fault = "sends-past-a-failed-key"
	// refusalIsRetryable reports a refused event as retryable.
	refusalIsRetryable fault = "refusal-is-retryable"
	// ignoresTheContext sends although the call's context ended.
	ignoresTheContext fault = "ignores-the-context"
	// rewritesFailures returns failures other than those it reported early.
	rewritesFailures fault = "rewrites-failures"
)

// failingSubtest is the subtest of the suite each fault must fail.
var failingSubtest = map[fault]string{
	downIsPlain:         "PeerDownIsUnavailable",
	sendsPastAFailedKey: "RefusedIsPermanentAndStopsItsKey",
	refusalIsRetryable:  "RefusedIsPermanentAndStopsItsKey",
	ignoresTheContext:   "CancelledContextDeliversNothing",
	rewritesFailures:    "RefusedIsPermanentAndStopsItsKey",
}

// memorySink publishes to a peer in memory, one event at a time, with
// fault.
type memorySink struct {
	peer  *peer
	fault fault
	limit *sinks.Limiter
}

func (s *memorySink) Name() string                { return "memory" }
func (s *memorySink) Close(context.Context) error { return nil }

// PublishesConcurrently implements sinks.ConcurrentPublisher: the peer is
// guarded, and the limit is shared by the calls.
func (s *memorySink) PublishesConcurrently() bool { return true }

func (s *memorySink) send(ctx context.Context, e *sinks.Event) error {
	switch {
	case s.peer.down && s.fault == downIsPlain:
		return errors.New("connection refused")
	case s.peer.down:
		return sinks.Unavailable(errors.New("connection refused"))
	case len(e.Payload) > maxPayload && s.fault == refusalIsRetryable:
		return fmt.Errorf("max_payload: message of %d bytes", len(e.Payload))
	case len(e.Payload) > maxPayload:
		return fmt.Errorf("max_payload: %w", sinks.TooLarge(len(e.Payload), maxPayload))
	case ctx.Err() != nil && s.fault != ignoresTheContext:
		return ctx.Err()
	}
	s.peer.receive(e)
	return nil
}

func (s *memorySink) Publish(ctx context.Context, events []sinks.Event) []error {
	switch s.fault {
	case sendsPastAFailedKey, ignoresTheContext:
		// Its own loop, without sinks.Results's rules.
		errs := make([]error, len(events))
		for i := range events {
			errs[i] = s.send(ctx, &events[i])
		}
		return errs
	case rewritesFailures:
		errs := sinks.NewResults(ctx, events, nil).PublishEach(s.limit, s.send)
		for i, err := range errs {
			if err != nil {
				errs[i] = fmt.Errorf("%w", err)
			}
		}
		return errs
	}
	return sinks.NewResults(ctx, events, nil).PublishEach(s.limit, s.send)
}

// harness runs the suite on memory sinks with f.
func harness(f fault) sinktest.Harness {
	p, down := &peer{}, &peer{down: true}
	return sinktest.Harness{
		NewSink: func(*testing.T, string) sinks.Sink {
			return &memorySink{peer: p, fault: f, limit: sinks.NewLimiter(4)}
		},
		Unreachable: func(*testing.T, string) sinks.Sink {
			return &memorySink{peer: down, fault: f, limit: sinks.NewLimiter(4)}
		},
		Received: func(_ *testing.T, dest string) []sinktest.Received { return p.received(dest) },
		Refused: func(dest, key string) sinks.Event {
			return sinktest.Oversized(dest, key, maxPayload+1)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: f == ""},
		Timeout:  2 * time.Second,
	}
}

func TestSuitePassesACorrectSink(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, harness(""))
}

// faultEnv names the fault TestSuiteOnAWrongSink runs the suite with.
const faultEnv = "HERALD_SINKTEST_FAULT"

// TestSuiteOnAWrongSink is TestSuiteFailsWrongSinks's helper process: it
// runs the suite on a memory sink with the fault the environment names,
// and must fail.
func TestSuiteOnAWrongSink(t *testing.T) {
	f := fault(os.Getenv(faultEnv))
	if f == "" {
		t.Skip("the helper process of TestSuiteFailsWrongSinks, run by it")
	}
	sinktest.Run(t, harness(f))
}

// TestSuiteFailsWrongSinks runs the suite, in a process of its own, on a
// sink with each fault, and checks that it fails, in the subtest that
// checks what the fault breaks.
func TestSuiteFailsWrongSinks(t *testing.T) {
	t.Parallel()
	for f, subtest := range failingSubtest {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteOnAWrongSink$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), faultEnv+"="+string(f))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite on a sink that %s did not fail (%v):\n%s", f, err, out)
			}
			if want := "--- FAIL: TestSuiteOnAWrongSink/" + subtest + " "; !strings.Contains(string(out), want) {
				t.Fatalf("the suite on a sink that %s did not fail %s:\n%s", f, subtest, out)
			}
		})
	}
}
