package awssink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go"

	"github.com/heraldhq/herald/sinks"
)

func event(i int, dest, key string, payload string) sinks.Event {
	return sinks.Event{ID: fmt.Sprintf("id-%d", i), Topic: "t", Destination: dest, Key: key,
		Payload: []byte(payload), ContentType: sinks.ContentTypeJSON}
}

// publishAll publishes events through send, at most inFlight requests at
// once.
func publishAll(events []sinks.Event, send SendFunc, inFlight int) []error {
	ctx := context.Background()
	return publish(ctx, sinks.NewResults(ctx, events, nil), events, send, sinks.NewLimiter(inFlight))
}

// recorder is a SendFunc that records each request and answers with what
// answer returns for it.
type recorder struct {
	mu       sync.Mutex
	requests [][]string // the event ids of each request, in the order sent
	answer   func(dest string, entries []Entry) ([]error, error)
}

func (r *recorder) send(_ context.Context, dest string, entries []Entry) ([]error, error) {
	var ids []string
	for _, en := range entries {
		ids = append(ids, en.Event.ID)
	}
	r.mu.Lock()
	r.requests = append(r.requests, ids)
	r.mu.Unlock()
	if r.answer != nil {
		return r.answer(dest, entries)
	}
	return make([]error, len(entries)), nil
}

// TestRequestsHoldTenAndFitTheSizeLimit: 23 small events make requests of
// 10, 10 and 3; events of about 100 KiB go two per request.
func TestRequestsHoldTenAndFitTheSizeLimit(t *testing.T) {
	var events []sinks.Event
	for i := range 23 {
		events = append(events, event(i, "q", "", `{}`))
	}
	r := &recorder{}
	for i, err := range publishAll(events, r.send, 1) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	var sizes []int
	for _, ids := range r.requests {
		sizes = append(sizes, len(ids))
	}
	slices.Sort(sizes)
	if fmt.Sprint(sizes) != "[3 10 10]" {
		t.Fatalf("requests %v, want 10, 10 and 3 entries", r.requests)
	}
	big := `"` + strings.Repeat("x", 100<<10) + `"`
	r = &recorder{}
	publishAll([]sinks.Event{event(0, "q", "", big), event(1, "q", "", big), event(2, "q", "", big)}, r.send, 1)
	if len(r.requests) != 2 || len(r.requests[0])+len(r.requests[1]) != 3 {
		t.Fatalf("requests %v, want two events then one", r.requests)
	}
}

// TestRequestsKeepKeyOrder: events of one key go out in slice order
// whatever their destination, however many requests run at once; events
// of other keys join the open request of their destination.
func TestRequestsKeepKeyOrder(t *testing.T) {
	events := []sinks.Event{event(0, "a", "k", `{}`), event(1, "b", "k", `{}`), event(2, "a", "k", `{}`),
		event(3, "a", "x", `{}`), event(4, "b", "y", `{}`)}
	for range 20 {
		r := &recorder{}
		publishAll(events, r.send, 8)
		sent := fmt.Sprint(r.requests)
		if sent != "[[id-0] [id-1 id-4] [id-2 id-3]]" {
			t.Fatalf("requests %v: want [id-0], [id-1 id-4], [id-2 id-3] in this order (key k's events)", r.requests)
		}
	}
}

// TestEntryFailureSkipsLaterEventsOfItsKey: an entry refused in the first
// request makes its key's events in later requests not sent; its key's
// events in the same request were sent and are reported as answered.
func TestEntryFailureSkipsLaterEventsOfItsKey(t *testing.T) {
	var events []sinks.Event
	for i := range 14 {
		key := "other"
		if i == 2 || i == 5 || i == 12 {
			key = "k"
		}
		events = append(events, event(i, "q", key, `{}`))
	}
	r := &recorder{answer: func(_ string, entries []Entry) ([]error, error) {
		results := make([]error, len(entries))
		for j, en := range entries {
			if en.Index == 2 {
				results[j] = EntryError("InternalError", "try again", false)
			}
		}
		return results, nil
	}}
	errs := publishAll(events, r.send, 1)
	if errs[2] == nil || sinks.IsPermanent(errs[2]) || sinks.IsUnavailable(errs[2]) {
		t.Fatalf("event 2: %v, want retryable", errs[2])
	}
	if errs[5] != nil {
		t.Fatalf("event 5, sent in the same request: %v, want delivered as answered", errs[5])
	}
	if !errors.Is(errs[12], sinks.ErrSkipped) {
		t.Fatalf("event 12, in a later request: %v, want skipped", errs[12])
	}
	if strings.Contains(fmt.Sprint(r.requests), "id-12") {
		t.Fatalf("event 12 was sent: %v", r.requests)
	}
}

// TestPermanentRequestIsRetriedOneByOne: a request refused as a whole is
// sent again one event per request, so only the refused event fails.
func TestPermanentRequestIsRetriedOneByOne(t *testing.T) {
	events := []sinks.Event{event(0, "q", "a", `{}`), event(1, "q", "b", `"bad"`), event(2, "q", "b", `{}`), event(3, "q", "c", `{}`)}
	r := &recorder{answer: func(_ string, entries []Entry) ([]error, error) {
		for _, en := range entries {
			if string(en.Event.Payload) == `"bad"` {
				return nil, &smithy.GenericAPIError{Code: "InvalidParameterValue", Message: "too long", Fault: smithy.FaultClient}
			}
		}
		return make([]error, len(entries)), nil
	}}
	errs := publishAll(events, r.send, 1)
	if errs[0] != nil || errs[3] != nil || !sinks.IsPermanent(errs[1]) || !errors.Is(errs[2], sinks.ErrSkipped) {
		t.Fatalf("results %v", errs)
	}
	if fmt.Sprint(r.requests) != "[[id-0 id-1 id-2 id-3] [id-0] [id-1] [id-3]]" { // one request: in order
		t.Fatalf("requests %v", r.requests)
	}
}

// TestUnavailableStopsTheCall: the events not sent yet get the error.
func TestUnavailableStopsTheCall(t *testing.T) {
	events := []sinks.Event{event(0, "missing", "a", `{}`), event(1, "q", "b", `{}`)}
	r := &recorder{answer: func(dest string, entries []Entry) ([]error, error) {
		return nil, &smithy.GenericAPIError{Code: "QueueDoesNotExist", Message: "no queue"}
	}}
	errs := publishAll(events, r.send, 1)
	if len(r.requests) != 1 || !sinks.IsUnavailable(errs[0]) || !sinks.IsUnavailable(errs[1]) {
		t.Fatalf("requests %v, results %v", r.requests, errs)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		code  string
		class string
	}{
		{"QueueDoesNotExist", "unavailable"}, {"AWS.SimpleQueueService.NonExistentQueue", "unavailable"},
		{"NotFound", "unavailable"}, {"InvalidClientTokenId", "unavailable"},
		{"SignatureDoesNotMatch", "unavailable"}, {"AccessDenied", "unavailable"}, {"AuthorizationError", "unavailable"},
		{"InvalidParameterValue", "permanent"}, {"BatchRequestTooLong", "permanent"},
		{"Throttling", "retryable"}, {"ThrottlingException", "retryable"}, {"InternalError", "retryable"},
		{"ServiceUnavailable", "retryable"},
	} {
		err := Classify(&smithy.GenericAPIError{Code: c.code})
		if got := class(err); got != c.class {
			t.Errorf("%s: %s, want %s", c.code, got, c.class)
		}
	}
	for _, c := range []struct {
		code   string
		sender bool
		class  string
	}{
		{"InvalidMessageContents", true, "permanent"}, {"MessageTooLong", true, "permanent"},
		{"InternalError", false, "retryable"}, {"KMS.ThrottlingException", false, "retryable"},
		{"KMSAccessDenied", true, "unavailable"},
	} {
		if got := class(EntryError(c.code, "m", c.sender)); got != c.class {
			t.Errorf("entry %s (sender fault %v): %s, want %s", c.code, c.sender, got, c.class)
		}
	}
	if err := EntryError("X", "bad\nline "+strings.Repeat("y", 1000), true); strings.Contains(err.Error(), "\n") || len(err.Error()) > 400 {
		t.Errorf("a peer's message is not cleaned and bounded: %q", err)
	}
}

func class(err error) string {
	switch {
	case sinks.IsUnavailable(err):
		return "unavailable"
	case sinks.IsPermanent(err):
		return "permanent"
	}
	return "retryable"
}

func TestResultsMapAnswerToEntries(t *testing.T) {
	results := Answer{Accepted: []string{"2"}, Failed: []Failure{{ID: "0", Code: "InvalidMessageContents", Message: "m", SenderFault: true}}}.Results(3)
	if !sinks.IsPermanent(results[0]) || results[1] == nil || results[2] != nil {
		t.Fatalf("results %v: want permanent, missing (retryable), delivered", results)
	}
}

func TestEncode(t *testing.T) {
	for _, c := range []struct {
		payload string
		base64  bool
	}{{`{"a":1}`, false}, {"plain text é", false}, {"\x00\x01", true}, {"\xff", true}, {"", true}} {
		m, err := Encode(sinks.Event{ID: "i", Payload: []byte(c.payload), ContentType: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if (m.Attributes[AttrEncoding] == "base64") != c.base64 {
			t.Errorf("%q: attributes %v", c.payload, m.Attributes)
		}
		back, err := Decode(m.Body, m.Attributes)
		if err != nil || string(back) != c.payload {
			t.Errorf("%q decoded back as %q, %v", c.payload, back, err)
		}
	}
}

// blockingService is a Service whose Send waits for release, counting the
// requests in flight.
type blockingService struct {
	running, peak atomic.Int32
	reached       chan struct{}
	release       chan struct{}
	once          sync.Once
	want          int32
}

func (b *blockingService) Send(_ context.Context, _ string, entries []Entry) ([]error, error) {
	n := b.running.Add(1)
	defer b.running.Add(-1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	if n == b.want {
		b.once.Do(func() { close(b.reached) })
	}
	<-b.release
	return make([]error, len(entries)), nil
}

func (b *blockingService) Ping(context.Context) error                     { return nil }
func (b *blockingService) CheckDestination(context.Context, string) error { return nil }
func (b *blockingService) Describe(d string) string                       { return d }

// TestMaxInFlightBoundsAllCalls: three concurrent calls of a sink with
// max_in_flight 2 never have more than two requests in flight together,
// and have two.
func TestMaxInFlightBoundsAllCalls(t *testing.T) {
	svc := &blockingService{reached: make(chan struct{}), release: make(chan struct{}), want: 2}
	s, err := New("test", "t", Config{Region: "us-east-1", AccessKeyID: "k", SecretAccessKey: "s", MaxInFlight: 2}, nil,
		func(aws.Config) Service { return svc })
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() {
			events := []sinks.Event{event(c, fmt.Sprintf("q%d", c), "", `{}`)}
			for i, err := range s.Publish(context.Background(), events) {
				if err != nil {
					t.Errorf("call %d, event %d: %v", c, i, err)
				}
			}
		})
	}
	<-svc.reached
	close(svc.release)
	wg.Wait()
	if p := svc.peak.Load(); p != 2 {
		t.Fatalf("peak requests in flight over three calls: %d, want 2", p)
	}
}
