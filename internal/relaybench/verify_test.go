package relaybench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/sinks"
)

func all(n int) []bool {
	c := make([]bool, n)
	for i := range c {
		c[i] = true
	}
	return c
}

func TestVerify(t *testing.T) {
	t.Parallel()
	// Events 0..3: keys 0,1,0,1; seq = index + 10.
	rec := func(idx int64) Record { return Record{Index: idx, Seq: idx + 10, Key: idx % 2} }
	cases := []struct {
		name                          string
		records                       []Record
		committed                     []bool
		ok                            bool
		lost, dups, order, unexpected int
		problem                       string
	}{
		{name: "in order", records: []Record{rec(0), rec(1), rec(2), rec(3)}, committed: all(4), ok: true},
		{name: "keys interleave freely", records: []Record{rec(1), rec(0), rec(3), rec(2)}, committed: all(4), ok: true},
		{name: "redelivered range counts as duplicates", records: []Record{rec(0), rec(2), rec(0), rec(2), rec(1), rec(3)},
			committed: all(4), ok: true, dups: 2},
		{name: "missing event", records: []Record{rec(0), rec(1), rec(3)}, committed: all(4), lost: 1,
			problem: "event 2 was committed and never acknowledged"},
		{name: "out of key order", records: []Record{rec(2), rec(0), rec(1), rec(3)}, committed: all(4), order: 1,
			problem: "key k0: seq 10 (event 0) delivered after seq 12"},
		{name: "out of order after a duplicate", records: []Record{rec(0), rec(2), rec(2), rec(1), rec(3), rec(0)},
			committed: all(4), ok: true, dups: 2},
		{name: "not committed", records: []Record{rec(0), rec(1), rec(2)}, committed: []bool{true, true, false}, unexpected: 1,
			problem: "event index 2 (seq 12) was not committed"},
		{name: "foreign event", records: []Record{rec(0), {Index: -1, Seq: 99, Key: -1}}, committed: all(1), unexpected: 1},
		{name: "nothing arrived", committed: all(2), lost: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v := Verify(c.records, c.committed)
			if v.OK() != c.ok || v.Lost != c.lost || v.Duplicates != c.dups || v.OrderViolations != c.order || v.Unexpected != c.unexpected {
				t.Fatalf("got %+v", v)
			}
			if v.KeyOrderIntact != (c.order == 0) {
				t.Fatalf("KeyOrderIntact = %v with %d violations", v.KeyOrderIntact, v.OrderViolations)
			}
			err := v.Err()
			if c.ok {
				want := "verified: " + itoa(len(c.committed)) + " events, 0 lost, " + itoa(c.dups) + " duplicates, key order intact"
				if err != nil || v.String() != want {
					t.Fatalf("Err() = %v, String() = %q, want %q", err, v.String(), want)
				}
				return
			}
			if err == nil || !strings.HasPrefix(v.String(), "NOT verified") {
				t.Fatalf("Err() = nil or String() = %q for a failed verification", v.String())
			}
			if c.problem != "" && !strings.Contains(err.Error(), c.problem) {
				t.Fatalf("error %q lacks %q", err, c.problem)
			}
		})
	}
}

func itoa(n int) string { return keyName(int64(n))[1:] }

func TestIDCodec(t *testing.T) {
	t.Parallel()
	c := newIDCodec([8]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4})
	other := newIDCodec([8]byte{1})
	for _, idx := range []int64{0, 1, 255, 1 << 20, 1<<40 + 7} {
		id := uuid.UUID(c.id(idx)).String()
		if got := c.index(id); got != idx {
			t.Fatalf("index(%s) = %d, want %d", id, got, idx)
		}
		if got := other.index(id); got != -1 {
			t.Fatalf("another run's codec decoded %s as %d", id, got)
		}
	}
	for _, bad := range []string{"", "not-a-uuid", uuid.UUID(c.id(5)).String()[:35] + "g"} {
		if got := c.index(bad); got != -1 {
			t.Fatalf("index(%q) = %d, want -1", bad, got)
		}
	}
	if c.nonceHex() != "deadbeef01020304" {
		t.Fatalf("nonceHex() = %s", c.nonceHex())
	}
}

// halfFailing acknowledges even-indexed events of each call only.
type halfFailing struct{ *sinks.Discard }

func (halfFailing) Publish(_ context.Context, events []sinks.Event) []error {
	errs := make([]error, len(events))
	for i := range errs {
		if i%2 == 1 {
			errs[i] = errors.New("refused")
		}
	}
	return errs
}

func TestRecorderKeepsAcknowledgedEventsOnly(t *testing.T) {
	t.Parallel()
	ids := newIDCodec([8]byte{9})
	rec := newRecording(ids, time.Now(), 4)
	r := &Recorder{Sink: halfFailing{sinks.NewDiscard("half")}, rec: rec}
	var events []sinks.Event
	for i := range int64(4) {
		events = append(events, sinks.Event{ID: uuid.UUID(ids.id(i)).String(), Seq: 100 + i, Key: keyName(i % 2)})
	}
	events = append(events, sinks.Event{ID: uuid.NewString(), Seq: 200}) // not the run's
	errs := r.Publish(context.Background(), events)
	if len(errs) != 5 || errs[0] != nil || errs[1] == nil {
		t.Fatalf("the wrapped sink's results were not passed on: %v", errs)
	}
	got := rec.all()
	if len(got) != 3 || got[0].Index != 0 || got[1].Index != 2 || got[2].Index != -1 ||
		got[0].Seq != 100 || got[1].Seq != 102 || got[1].Key != 0 || got[2].Key != -1 || got[0].AckNanos <= 0 {
		t.Fatalf("records %+v", got)
	}
	if rec.Unique() != 2 {
		t.Fatalf("Unique() = %d, want 2", rec.Unique())
	}
	v := Verify(got, all(4))
	if v.Lost != 2 || v.Unexpected != 1 || v.OK() {
		t.Fatalf("verification of a half-failed publish: %+v", v)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	base := Config{DatabaseURL: "postgres://u@127.0.0.1/db"}
	cases := []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.DatabaseURL = "" }, "--database-url: required"},
		{func(c *Config) { c.Mode = "soak" }, `--mode: "soak"`},
		{func(c *Config) { c.Events = -1 }, "--events"},
		{func(c *Config) { c.Keys = -1 }, "--keys"},
		{func(c *Config) { c.PayloadBytes = 5 }, "--payload-bytes"},
		{func(c *Config) { c.Relays = 65 }, "--relays"},
		{func(c *Config) { c.Sink = "email" }, `--sink: "email"`},
		{func(c *Config) { c.Sink = SinkKafka }, "--kafka-brokers: required with --sink kafka"},
		{func(c *Config) { c.Sink = SinkKafka; c.KafkaBrokers = []string{"127.0.0.1:9092", "kafka"} }, `--kafka-brokers: broker 2 "kafka"`},
		{func(c *Config) { c.Sink = SinkWebhook; c.WebhookURL = "127.0.0.1:8099/hook" }, `--webhook-url: "127.0.0.1:8099/hook" is not an http(s) URL`},
		{func(c *Config) { c.Mode = ModeLive; c.Rate = 10_000_000; c.Duration = time.Hour }, "--rate, --duration"},
		{func(c *Config) { c.Mode = ModeOutage; c.Outage = -time.Second }, "--outage: must be positive"},
		{func(c *Config) { c.OutageAfter = -time.Second }, "--outage-after"},
		{func(c *Config) { c.PauseMax = -time.Second }, "--pause-max"},
		{func(c *Config) { c.BackoffMax = -time.Second }, "--backoff-max"},
		{func(c *Config) { c.Mode = ModeHotKey; c.HotEvents = -1 }, "--hot-events"},
		{func(c *Config) { c.Sink = SinkSNS; c.AWSInstant = true }, "--aws-instant: only with --sink sqs"},
		{func(c *Config) { c.Sink = SinkSQS; c.AWSInstant = true; c.AWSEndpoint = "http://127.0.0.1:4566" }, "without --aws-endpoint"},
		{func(c *Config) { c.Mode = ModeIsolation; c.Duration = 5 * time.Minute }, "--duration: 5m0s must be longer than --outage-after (1m0s) plus --outage (5m0s)"},
	}
	for _, c := range cases {
		cfg := base
		c.edit(&cfg)
		err := cfg.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
	if err := base.WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg := (Config{KeysSet: true}).WithDefaults(); cfg.Keys != 0 {
		t.Fatalf("Keys 0 given explicitly became %d", cfg.Keys)
	}
	if cfg := (Config{Mode: ModeHotKey, HotEventsSet: true}).WithDefaults(); cfg.HotEvents != 0 || cfg.Events != DefaultHotKeyEvents ||
		cfg.BackoffMax != time.Second || cfg.PauseMax != 0 {
		t.Fatalf("hotkey defaults: %+v", cfg)
	}
	if cfg := (Config{Mode: ModeOutage}).WithDefaults(); cfg.Outage != time.Minute || cfg.PauseMax != time.Second ||
		cfg.Events != DefaultEvents || cfg.BackoffMax != 0 {
		t.Fatalf("outage defaults: %+v", cfg)
	}
	if cfg := (Config{Mode: ModeIsolation, OutageAfter: 30 * time.Second}).WithDefaults(); cfg.Outage != 5*time.Minute ||
		cfg.Duration != 30*time.Second+5*time.Minute+2*time.Minute || cfg.PauseMax != time.Second {
		t.Fatalf("isolation defaults: %+v", cfg)
	}
	for _, mode := range []Mode{ModeDrain, ModeLive, ModeOutage, ModeIsolation, ModeHotKey} {
		if err := (Config{DatabaseURL: base.DatabaseURL, Mode: mode}).WithDefaults().Validate(); err != nil {
			t.Errorf("defaults of mode %s: %v", mode, err)
		}
	}
}

func TestVerifyEach(t *testing.T) {
	t.Parallel()
	rec := func(idx, seq int64) Record { return Record{Index: idx, Seq: seq, Key: 0} }
	// Sink a has every event in order, once; sink b lacks event 2, has
	// event 0 twice and event 1 out of order.
	a := []Record{rec(0, 10), rec(1, 11), rec(2, 12)}
	b := []Record{rec(1, 11), rec(0, 10), rec(0, 10)}
	v, each := verifyEach([]string{"a", "b"}, [][]Record{a, b}, all(3))
	if !each[0].OK() || each[1].Lost != 1 || each[1].Duplicates != 1 || each[1].OrderViolations != 1 {
		t.Fatalf("each sink: %+v", each)
	}
	if v.Events != 3 || v.Delivered != 2 || v.Lost != 1 || v.Duplicates != 1 || v.OrderViolations != 1 || v.KeyOrderIntact || v.OK() {
		t.Fatalf("whole: %+v", v)
	}
	if len(v.Problems) == 0 || !strings.HasPrefix(v.Problems[0], "sink b: ") {
		t.Fatalf("problems %q", v.Problems)
	}
}

func TestFaultSink(t *testing.T) {
	t.Parallel()
	f := &fault{key: "hot"}
	s := &faultSink{Sink: sinks.NewDiscard("d"), f: f}
	events := []sinks.Event{{Key: "a"}, {Key: "hot"}, {Key: "b"}, {Key: "hot"}}
	if errs := s.Publish(context.Background(), events); errors.Join(errs...) != nil {
		t.Fatalf("healthy: %v", errs)
	}
	f.keyFails.Store(true)
	errs := s.Publish(context.Background(), events)
	if errs[0] != nil || !errors.Is(errs[1], errHotKey) || errs[2] != nil || !errors.Is(errs[3], sinks.ErrSkipped) ||
		sinks.IsUnavailable(errs[1]) || sinks.IsPermanent(errs[1]) || f.keyRefused.Load() != 1 {
		t.Fatalf("hot key failing: %v", errs)
	}
	f.down.Store(true)
	for i, err := range s.Publish(context.Background(), events) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("down: event %d: %v", i, err)
		}
	}
	if f.refused.Load() != 1 {
		t.Fatalf("%d calls refused, want 1", f.refused.Load())
	}
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	ns := make([]int64, 100)
	for i := range ns {
		ns[i] = int64(100-i) * 1e6 // 100ms down to 1ms
	}
	p := percentiles(ns)
	if p.Count != 100 || p.P50 != 50 || p.P90 != 90 || p.P99 != 99 || p.Max != 100 {
		t.Fatalf("%+v", p)
	}
	if percentiles(nil) != nil {
		t.Fatal("percentiles of nothing should be nil")
	}
}
