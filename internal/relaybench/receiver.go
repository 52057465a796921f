package relaybench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/webhook"
)

// receiver is a webhook endpoint in the bench's process: it answers every
// request 204 after a fixed delay, and notes when each event of the run
// first arrived (by its webhook-id header), so that latency is measured
// where the endpoint sees the event rather than where the sink hears back.
// It records every arrival into its sink's Recording: the order in which
// events reach the endpoint is the delivery order the verification checks
// (a Publish call returns when its slowest event is answered, after the
// relay, hearing each event's result as it comes, may have sent a key's
// next event in another call).
type receiver struct {
	r     *run
	rec   *Recording // set by webhookSink
	delay time.Duration
	srv   *http.Server
	url   string
	// arrivals holds, by event index, when the event first arrived
	// (nanoseconds since the run's origin; 0: not yet).
	arrivals []int64
	requests atomic.Int64
	inFlight atomic.Int64
	// peak is the most requests the receiver held at once.
	peak atomic.Int64
	// busy is the sum of the time the receiver held each request
	// (nanoseconds), counted as each is answered: over a phase, busy
	// divided by the sink's concurrency and the phase's length is how
	// much of what the sink may have in flight it kept in flight.
	busy atomic.Int64
}

// startReceiver listens on a loopback port for events whose index is below
// events; close stops it.
func (r *run) startReceiver(delay time.Duration, events int) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting a webhook receiver: %w", err)
	}
	rv := &receiver{r: r, delay: delay, url: "http://" + ln.Addr().String() + "/hook", arrivals: make([]int64, events)}
	rv.srv = &http.Server{Handler: rv, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := rv.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Warn("relaybench: webhook receiver stopped", "error", err)
		}
	}()
	return rv, nil
}

// ServeHTTP implements http.Handler.
func (rv *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Since(rv.r.origin).Nanoseconds()
	n := rv.inFlight.Add(1)
	defer func() {
		rv.inFlight.Add(-1)
		rv.busy.Add(time.Since(rv.r.origin).Nanoseconds() - at)
	}()
	for p := rv.peak.Load(); n > p && !rv.peak.CompareAndSwap(p, n); p = rv.peak.Load() {
	}
	rv.requests.Add(1)
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	var env struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		http.Error(w, "not a webhook envelope", http.StatusBadRequest)
		return
	}
	idx := rv.r.ids.index(req.Header.Get("webhook-id"))
	if idx >= 0 && idx < int64(len(rv.arrivals)) {
		atomic.CompareAndSwapInt64(&rv.arrivals[idx], 0, max(at, 1))
	}
	if rv.rec != nil {
		rv.rec.addArrival(idx, keyNumber(env.Key), at)
	}
	if rv.delay > 0 {
		t := time.NewTimer(rv.delay)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// arrival returns when the event of index idx first arrived, or 0.
func (rv *receiver) arrival(idx int) int64 { return atomic.LoadInt64(&rv.arrivals[idx]) }

// firstArrival returns when the first of the events of index lo to hi-1
// arrived, or 0 when none did.
func (rv *receiver) firstArrival(lo, hi int) int64 {
	first := int64(0)
	for i := lo; i < hi; i++ {
		if a := rv.arrival(i); a != 0 && (first == 0 || a < first) {
			first = a
		}
	}
	return first
}

func (rv *receiver) close(ctx context.Context) error {
	return rv.srv.Shutdown(ctx)
}

// webhookSink adds a webhook sink called name to the route, posting to rv
// with cfg.WebhookConcurrency requests in flight; f, when not nil, makes it
// fail as the fault says.
func (r *run) webhookSink(name string, rv *receiver, events int, f *fault) *benchSink {
	s := r.addSink(name, events, func() (sinks.Sink, error) {
		s, err := webhook.New(name, webhook.Config{URL: rv.url, Concurrency: r.cfg.WebhookConcurrency}, slog.New(warnHandler{r.log.Handler()}))
		if err != nil || f == nil {
			return s, err
		}
		return &faultSink{Sink: s, f: f}, nil
	}, nil, f)
	s.recordedByReceiver = true
	rv.rec = s.rec
	return s
}
