package sinks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func keyed(keys ...string) []Event {
	out := make([]Event, len(keys))
	for i, k := range keys {
		out[i] = Event{ID: fmt.Sprintf("e%d", i), Key: k, Destination: "d"}
	}
	return out
}

func TestResultsHoldBackAFailedKey(t *testing.T) {
	events := keyed("a", "a", "b", "")
	res := NewResults(context.Background(), events, nil)
	res.Fail(0, errors.New("refused"))
	if !res.Blocked(1) {
		t.Fatal("the second event of a failed key is not blocked")
	}
	if res.Blocked(2) || res.Blocked(3) {
		t.Fatal("another key, or no key, is blocked")
	}
	res.Delivered(2)
	errs := res.Errors()
	if errs[0] == nil || errors.Is(errs[0], ErrSkipped) {
		t.Errorf("event 0: %v, want its failure", errs[0])
	}
	if !errors.Is(errs[1], ErrSkipped) {
		t.Errorf("event 1: %v, want ErrSkipped", errs[1])
	}
	if errs[2] != nil {
		t.Errorf("event 2: %v, want delivered", errs[2])
	}
	if errs[3] == nil || !errors.Is(errs[3], errNoResult) {
		t.Errorf("event 3 (no result set): %v, want errNoResult", errs[3])
	}
}

func TestResultsReportEarlyAndOnce(t *testing.T) {
	var mu sync.Mutex
	got := map[int][]error{}
	ctx := WithResultFunc(context.Background(), func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		got[i] = append(got[i], err)
	})
	events := keyed("a", "b")
	res := NewResults(ctx, events, nil)
	res.Delivered(1)
	mu.Lock()
	if len(got[1]) != 1 || got[1][0] != nil {
		t.Fatalf("a delivery was not reported when set: %v", got)
	}
	mu.Unlock()
	res.Fail(1, errors.New("too late")) // a result is final
	res.Errors()
	mu.Lock()
	defer mu.Unlock()
	if len(got[1]) != 1 || got[1][0] != nil {
		t.Errorf("event 1 reported %v, want one delivery", got[1])
	}
	if len(got[0]) != 1 || got[0][0] == nil {
		t.Errorf("event 0 reported %v, want one failure (no result set)", got[0])
	}
	if errs := res.Errors(); errs[1] != nil {
		t.Errorf("Errors()[1] = %v, want the result reported first", errs[1])
	}
}

func TestPublishEachKeepsKeyOrderAndStopsAKey(t *testing.T) {
	events := keyed("a", "b", "a", "a", "b", "")
	var mu sync.Mutex
	var sent []string
	errs := NewResults(context.Background(), events, nil).PublishEach(NewLimiter(4), func(ctx context.Context, e *Event) error {
		mu.Lock()
		sent = append(sent, e.ID)
		mu.Unlock()
		if e.ID == "e2" {
			return errors.New("refused")
		}
		return nil
	})
	order := map[string]int{}
	for i, id := range sent {
		order[id] = i
	}
	if _, ok := order["e3"]; ok {
		t.Errorf("e3 was sent after e2 of its key failed: %v", sent)
	}
	if order["e0"] > order["e2"] || order["e1"] > order["e4"] {
		t.Errorf("a key's events were sent out of order: %v", sent)
	}
	want := []bool{true, true, false, false, true, true} // delivered?
	for i, err := range errs {
		if (err == nil) != want[i] {
			t.Errorf("event %d: %v", i, err)
		}
	}
	if !errors.Is(errs[3], ErrSkipped) {
		t.Errorf("event 3: %v, want ErrSkipped", errs[3])
	}
}

// TestLimiterBoundsConcurrentCalls runs two calls sharing a Limiter of 3
// and checks that no more than 3 sends ever run at once, and that 3 do.
func TestLimiterBoundsConcurrentCalls(t *testing.T) {
	limit := NewLimiter(3)
	var running, peak atomic.Int32
	release := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	send := func(ctx context.Context, e *Event) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if n == 3 {
			once.Do(func() { close(reached) })
		}
		<-release
		return nil
	}
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Go(func() {
			evs := keyed("a", "b", "c", "d")
			for i := range evs {
				evs[i].Key = fmt.Sprintf("%d-%d", c, i)
			}
			for _, err := range NewResults(context.Background(), evs, nil).PublishEach(limit, send) {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	<-reached
	close(release)
	wg.Wait()
	if p := peak.Load(); p != 3 {
		t.Errorf("peak sends at once: %d, want 3", p)
	}
}

func TestPublishEachAfterTheDeadlineSendsNothing(t *testing.T) {
	limit := NewLimiter(1)
	limit.slots <- struct{}{} // another call holds the only slot
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := NewResults(ctx, keyed("a", "a", "b"), nil).PublishEach(limit, func(context.Context, *Event) error {
		t.Error("an event was sent after the call's context ended")
		return nil
	})
	if !errors.Is(errs[0], ErrNotSent) || !errors.Is(errs[2], ErrNotSent) {
		t.Errorf("results %v, want ErrNotSent for the first event of each key", errs)
	}
	if !errors.Is(errs[1], ErrSkipped) {
		t.Errorf("result %v, want ErrSkipped behind its key's first event", errs[1])
	}
}

func TestResultsNameTheEventAndWhere(t *testing.T) {
	events := keyed("a", "b")
	res := NewResults(context.Background(), events, nil)
	res.Fail(0, errors.New("refused"))
	res.Blocked(0)
	if got, want := res.Errors()[0].Error(), `publishing event e0 to "d": refused`; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	res = NewResults(context.Background(), events, func(e *Event) string { return "billing" })
	res.Fail(1, Permanent(errors.New("endpoint answered 410 Gone")))
	err := res.Errors()[1]
	if got, want := err.Error(), "publishing event e1 to billing: endpoint answered 410 Gone"; got != want || !IsPermanent(err) {
		t.Errorf("error %q (permanent %t), want %q, permanent", got, IsPermanent(err), want)
	}
}

func TestResultsUnavailableStopsTheCall(t *testing.T) {
	events := keyed("a", "b", "", "c")
	res := NewResults(context.Background(), events, nil)
	down := errors.New("connection refused")
	if res.Blocked(0) || res.Blocked(1) {
		t.Fatal("events blocked before any failure")
	}
	res.Fail(0, Unavailable(down)) // event 1 is in flight meanwhile
	for _, i := range []int{2, 3} {
		if !res.Blocked(i) {
			t.Fatalf("event %d (another key) is not blocked once the destination is unavailable", i)
		}
	}
	res.Delivered(1)
	errs := res.Errors()
	if errs[1] != nil {
		t.Errorf("the event in flight: %v, want its own result (delivered)", errs[1])
	}
	for _, i := range []int{0, 2, 3} {
		if !IsUnavailable(errs[i]) || !errors.Is(errs[i], down) || !strings.Contains(errs[i].Error(), events[i].ID) {
			t.Errorf("event %d: %v, want Unavailable naming it and wrapping the refusal", i, errs[i])
		}
	}
}

func TestResultsStopAndEndedContextBlock(t *testing.T) {
	events := keyed("a", "b", "c")
	ctx, cancel := context.WithCancel(context.Background())
	res := NewResults(ctx, events, nil)
	closed := errors.New("channel closed")
	res.Stop(closed)
	res.Stop(errors.New("a later reason"))
	if !res.Blocked(0) || !errors.Is(res.Errors()[0], closed) {
		t.Fatalf("after Stop: %v, want the first stop's error", res.Errors()[0])
	}
	res = NewResults(ctx, events, nil)
	cancel()
	if !res.Blocked(1) {
		t.Fatal("an event is not blocked after the call's context ended")
	}
	if err := res.Errors()[1]; !errors.Is(err, ErrNotSent) || !errors.Is(err, context.Canceled) {
		t.Fatalf("after the cancel: %v, want ErrNotSent wrapping context.Canceled", err)
	}
}

func TestPublishEachStopsOnceTheDestinationIsUnavailable(t *testing.T) {
	events := keyed("a", "b", "c", "")
	var sends atomic.Int32
	errs := NewResults(context.Background(), events, nil).PublishEach(NewLimiter(1), func(context.Context, *Event) error {
		sends.Add(1)
		return Unavailable(errors.New("connection refused"))
	})
	if n := sends.Load(); n != 1 {
		t.Errorf("%d events sent to an unavailable destination, want 1", n)
	}
	for i, err := range errs {
		if !IsUnavailable(err) {
			t.Errorf("event %d: %v, want Unavailable", i, err)
		}
	}
}

func TestPublishEachWithAnEndedContextSendsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := NewResults(ctx, keyed("a", "b", ""), nil).PublishEach(NewLimiter(8), func(context.Context, *Event) error {
		t.Error("an event was sent after the call's context ended")
		return nil
	})
	for i, err := range errs {
		if !errors.Is(err, ErrNotSent) {
			t.Errorf("event %d: %v, want ErrNotSent", i, err)
		}
	}
}

func TestResultsEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	res := NewResults(ctx, keyed("a", "b"), nil)
	if res.Ended() {
		t.Fatal("Ended before the cancel")
	}
	res.Delivered(0)
	cancel()
	if !res.Ended() {
		t.Fatal("not Ended after the cancel")
	}
	if errs := res.Errors(); errs[0] != nil || !errors.Is(errs[1], ErrNotSent) {
		t.Fatalf("results %v, want the delivery kept and ErrNotSent for the other", errs)
	}
}

func TestConnectOnlyForACallThatCanSend(t *testing.T) {
	calls := 0
	connect := func(context.Context) (string, error) {
		calls++
		return "conn", nil
	}
	if _, ok := Connect(NewResults(context.Background(), nil, nil), connect); ok || calls != 0 {
		t.Fatalf("a call with no events: ok %v after %d connects, want false without connecting", ok, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := NewResults(ctx, keyed("a"), nil)
	if _, ok := Connect(res, connect); ok || calls != 0 {
		t.Fatalf("an ended call: ok %v after %d connects, want false without connecting", ok, calls)
	}
	if errs := res.Errors(); !errors.Is(errs[0], ErrNotSent) {
		t.Fatalf("an ended call: %v, want ErrNotSent", errs[0])
	}
	refused := Unavailable(errors.New("connection refused"))
	res = NewResults(context.Background(), keyed("a", "b"), nil)
	if _, ok := Connect(res, func(context.Context) (string, error) { return "", refused }); ok {
		t.Fatal("a failed connect: ok, want false")
	}
	for i, err := range res.Errors() {
		if !errors.Is(err, refused) {
			t.Errorf("event %d after a failed connect: %v, want the connect's error", i, err)
		}
	}
	res = NewResults(context.Background(), keyed("a"), nil)
	if conn, ok := Connect(res, connect); !ok || conn != "conn" || calls != 1 {
		t.Fatalf("Connect = %q, %v after %d connects, want the connection", conn, ok, calls)
	}
}
