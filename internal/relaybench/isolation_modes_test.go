package relaybench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/pgtest"
	"github.com/heraldhq/herald/internal/relaybench"
	"github.com/heraldhq/herald/relay"
)

// TestSlow: both webhook sinks get every event, each event reaches the
// fast receiver once counted, and the slow sink never has more requests in
// flight than its concurrency.
func TestSlow(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Mode: relaybench.ModeSlow, Rate: 200, Duration: time.Second, Keys: 20,
		AnswerAfter: 50 * time.Millisecond, WebhookConcurrency: 4})
	s := res.Slow
	if s == nil || len(res.Sinks) != 2 || res.Sinks[0].Name != relaybench.SinkFast || res.Sinks[1].Name != relaybench.SinkSlow {
		t.Fatalf("result %+v, sinks %+v", s, res.Sinks)
	}
	if s.FastArrival == nil || s.FastArrival.Count != res.Events || s.SlowArrival == nil || s.SlowArrival.Count != res.Events {
		t.Fatalf("arrivals for %d events: fast %+v, slow %+v", res.Events, s.FastArrival, s.SlowArrival)
	}
	if s.SlowEvents != res.Events || s.SlowSeconds <= 0 || s.SlowEventsPerSecond <= 0 || s.Concurrency != 4 {
		t.Fatalf("slow sink %+v for %d events", s, res.Events)
	}
	if s.SlowPeakInFlight < 1 || s.SlowPeakInFlight > 4 {
		t.Fatalf("the slow receiver held %d requests at once, with a concurrency of 4", s.SlowPeakInFlight)
	}
	if res.Latency == nil || res.Latency.Count != res.Events {
		t.Fatalf("fast sink latency %+v for %d events", res.Latency, res.Events)
	}
}

// TestRecovery: every event of the second phase waited in hook's queue
// when it came back, and both phases were delivered to both sinks.
func TestRecovery(t *testing.T) {
	t.Parallel()
	res := run(t, relaybench.Config{Mode: relaybench.ModeRecovery, Events: 300, Keys: 10,
		AnswerAfter: 5 * time.Millisecond, PauseMax: 200 * time.Millisecond})
	rc := res.Recovery
	if rc == nil || rc.EventsEach != 300 || res.Events != 600 {
		t.Fatalf("result %+v, %d events", rc, res.Events)
	}
	if rc.QueueDepth != 300 {
		t.Fatalf("%d deliveries waited for hook when it came back, want the 300 committed while it was down", rc.QueueDepth)
	}
	if rc.FlowingSeconds <= 0 || rc.QueuedSeconds <= 0 || rc.ProbeWaitSeconds > rc.QueuedSeconds ||
		rc.FlowingFirstArrivalSeconds > rc.FlowingSeconds || rc.FlowingAfterFirstEventsPerSecond < rc.FlowingEventsPerSecond {
		t.Fatalf("phases %+v", rc)
	}
	if want := rc.QueuedAfterProbeEventsPerSecond / rc.FlowingAfterFirstEventsPerSecond; rc.DrainRatio != want {
		t.Fatalf("drain ratio %v, want %v", rc.DrainRatio, want)
	}
	if rc.PeakInFlight < 1 || rc.PeakInFlight > int64(relaybench.Config{}.WithDefaults().WebhookConcurrency) {
		t.Fatalf("hook's receiver held %d requests at once", rc.PeakInFlight)
	}
	// Each phase's receiver held requests for at least its events'
	// answer time (300 × 5 ms), and never more than the concurrency
	// allows.
	flowingQueued := [][2]float64{{rc.FlowingBusy, rc.FlowingSeconds}, {rc.QueuedAfterProbeBusy, rc.QueuedSeconds - rc.ProbeWaitSeconds}}
	for i, p := range flowingQueued {
		held := p[0] * float64(rc.Concurrency) * p[1]
		if p[0] > 1.01 || held < 300*0.005 {
			t.Errorf("phase %d: the receiver held %.3f of what hook may have in flight (%.3fs of requests)", i, p[0], held)
		}
	}
}

// TestSkew: with the relay's clock an hour ahead or behind, each event is
// attempted exactly FailAttempts+1 times and no retry comes before its
// configured delay (on the database's clock). A relay timing retries by
// its own clock fails here: ahead, the retries wait an hour (the run times
// out); behind, they come at once.
func TestSkew(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(offset.String(), func(t *testing.T) {
			t.Parallel()
			const events, fail = 30, 2
			res := run(t, relaybench.Config{Mode: relaybench.ModeSkew, Events: events, ClockOffset: offset, ClockOffsetSet: true,
				FailAttempts: fail, BackoffMax: 400 * time.Millisecond})
			s := res.Skew
			if s == nil || s.ClockOffsetSeconds != offset.Seconds() || len(s.Retries) != fail {
				t.Fatalf("result %+v", s)
			}
			if s.Attempts != events*(fail+1) {
				t.Fatalf("%d attempts, want %d (%d events, each failed %d times then acknowledged)", s.Attempts, events*(fail+1), events, fail)
			}
			for _, rs := range s.Retries {
				if rs.Observed == nil || rs.Observed.Count != events {
					t.Fatalf("retry after attempt %d: %+v", rs.After, rs)
				}
				// The database timestamps to the microsecond.
				if rs.MinMS < rs.ConfiguredMS-0.01 {
					t.Fatalf("retry after attempt %d came %.3fms after it, before its configured %.0fms", rs.After, rs.MinMS, rs.ConfiguredMS)
				}
			}
			if s.Retries[1].ConfiguredMS <= s.Retries[0].ConfiguredMS {
				t.Fatalf("the backoff does not grow: %+v", s.Retries)
			}
		})
	}
}

var (
	relayBinOnce sync.Once
	relayBin     string
	relayBinErr  error
)

// relayBinary builds the relay binary once for the package's tests.
func relayBinary(t *testing.T) string {
	t.Helper()
	relayBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "relaybench-test")
		if err != nil {
			relayBinErr = err
			return
		}
		relayBin = filepath.Join(dir, "relay")
		// -trimpath, as the other tests build it: the packages compiled for one
		// are in the build cache for the others.
		out, err := exec.Command("go", "build", "-trimpath", "-o", relayBin, "github.com/heraldhq/herald/cmd/relay").CombinedOutput()
		if err != nil {
			relayBinErr = fmt.Errorf("building relay: %v\n%s", err, out)
		}
	})
	if relayBinErr != nil {
		t.Fatal(relayBinErr)
	}
	return relayBin
}

// TestBinary: relay run, started by the bench, publishes every committed
// event by its own counter and leaves the outbox empty.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the relay binary")
	}
	t.Parallel()
	bin := relayBinary(t)
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := relaybench.Run(ctx, relaybench.Config{DatabaseURL: pgtest.URL(t), Mode: relaybench.ModeBinary,
		Events: 3000, Keys: 50, RelayBinary: bin, Timeout: time.Minute, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	b := res.Binary
	if b == nil || b.Binary != bin || b.Published < 3000 || res.Events != 3000 || res.RowsLeft != 0 || res.Verification.Lost != 0 {
		t.Fatalf("result %+v, binary %+v", res, b)
	}
	if b.MetricsUpSeconds <= 0 || b.MetricsUpSeconds > res.ElapsedSeconds || res.CPUSeconds <= 0 {
		t.Fatalf("timings: metrics up after %.3fs, elapsed %.3fs, cpu %.3fs", b.MetricsUpSeconds, res.ElapsedSeconds, res.CPUSeconds)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil || !strings.Contains(text.String(), "counted by herald_events_published_total: ") {
		t.Fatalf("text (%v):\n%s", err, text.String())
	}
	var exists bool
	if err := pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", res.Schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s still exists (%v)", res.Schema, err)
	}
}

// TestBinaryCaptureWAL: --mode binary --capture wal emits the backlog into
// a slot made before it and times relay run reading it, with no outbox row.
func TestBinaryCaptureWAL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the relay binary")
	}
	t.Parallel()
	pool := pgtest.WALPool(t)
	pgtest.RequireLogicalWAL(t, pool)
	bin := relayBinary(t)
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := relaybench.Run(ctx, relaybench.Config{DatabaseURL: pgtest.WALURL(t), Mode: relaybench.ModeBinary, Capture: relay.CaptureWAL,
		Events: 2000, Keys: 50, RelayBinary: bin, Timeout: time.Minute, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if b := res.Binary; b == nil || b.Published < 2000 || res.RowsLeft != 0 || res.Verification.Lost != 0 {
		t.Fatalf("result %+v, binary %+v", res, b)
	}
	var slots int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name, $1)", "herald_"+res.Schema).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots of schema %s left (%v)", slots, res.Schema, err)
	}
}

// TestBinaryRelayMissing: a binary that cannot start is an error naming the
// flag.
func TestBinaryRelayMissing(t *testing.T) {
	t.Parallel()
	_, err := relaybench.Run(context.Background(), relaybench.Config{DatabaseURL: pgtest.URL(t), Mode: relaybench.ModeBinary,
		Events: 10, RelayBinary: filepath.Join(t.TempDir(), "no-such-relay")})
	if err == nil || !strings.Contains(err.Error(), "--relay-binary: ") {
		t.Fatalf("Run: %v", err)
	}
}

func TestIsolationModesValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  relaybench.Config
		flag string
	}{
		{relaybench.Config{Mode: relaybench.ModeSlow, Sink: relaybench.SinkKafka, KafkaBrokers: []string{"127.0.0.1:9092"}}, "--sink: "},
		{relaybench.Config{Mode: relaybench.ModeSkew, FailAttempts: 10}, "--fail-attempts: "},
		{relaybench.Config{Mode: relaybench.ModeSkew, ClockOffset: 48 * time.Hour}, "--clock-offset: "},
		{relaybench.Config{Mode: relaybench.ModeRecovery, WebhookConcurrency: -1}, "--webhook-concurrency: "},
		{relaybench.Config{Mode: relaybench.ModeSlow, AnswerAfter: -time.Second}, "--answer-after: "},
		{relaybench.Config{Mode: relaybench.ModeBinary, Relays: 2}, "--relays: "},
		{relaybench.Config{Mode: relaybench.ModeIdle, DatabaseURL: "mysql://root@127.0.0.1:3306/test"}, "--mode: "},
		{relaybench.Config{Mode: relaybench.ModeOutage, Capture: relay.CaptureWAL}, "--capture wal: "},
		{relaybench.Config{Capture: "binlog"}, "--capture: "},
		{relaybench.Config{History: -1}, "--history: "},
		{relaybench.Config{Mode: relaybench.ModeLive, History: 10}, "--history: "},
		{relaybench.Config{History: 10, DatabaseURL: "mysql://root@127.0.0.1:3306/test"}, "--history: "},
	} {
		cfg := c.cfg
		if cfg.DatabaseURL == "" {
			cfg.DatabaseURL = "postgres://postgres@127.0.0.1:5432/test"
		}
		if err := cfg.WithDefaults().Validate(); err == nil || !strings.HasPrefix(err.Error(), c.flag) {
			t.Errorf("%+v: %v, want an error starting %q", c.cfg, err, c.flag)
		}
	}
}

// TestCaptureWAL: --capture wal drains a backlog emitted into the WAL, and
// serves producers that emit, every event verified, with nothing written to
// the outbox table.
func TestCaptureWAL(t *testing.T) {
	t.Parallel()
	pgtest.RequireLogicalWAL(t, pgtest.WALPool(t))
	for _, mode := range []relaybench.Mode{relaybench.ModeDrain, relaybench.ModeLive} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			res := run(t, relaybench.Config{DatabaseURL: pgtest.WALURL(t), Mode: mode, Capture: relay.CaptureWAL, Events: 500, Keys: 20, KeysSet: true,
				Rate: 200, Duration: 2 * time.Second})
			if res.Events == 0 || res.Verification.Lost != 0 || res.RowsLeft != 0 {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// TestIdle: relays at rest still renew their lanes (every 2 s at most), so
// a window of a few seconds counts their round trips; the text report
// says what was counted.
func TestIdle(t *testing.T) {
	t.Parallel()
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Not run's checks: there is no event to verify.
	res, err := relaybench.Run(ctx, relaybench.Config{DatabaseURL: pgtest.URL(t), Mode: relaybench.ModeIdle,
		Duration: 5 * time.Second, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	in := res.Idle
	if in == nil || in.Seconds < 5 || in.RoundTrips < 1 || in.Statements < 1 || res.Events != 0 {
		t.Fatalf("idle result %+v, %d events", in, res.Events)
	}
	if in.RoundTripsPerSecond != float64(in.RoundTrips)/in.Seconds {
		t.Fatalf("round trips per second %v for %d in %vs", in.RoundTripsPerSecond, in.RoundTrips, in.Seconds)
	}
	var text strings.Builder
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d round trips", in.RoundTrips); !strings.Contains(text.String(), want) {
		t.Fatalf("text report without %q:\n%s", want, text.String())
	}
}
