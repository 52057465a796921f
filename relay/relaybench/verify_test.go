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
		{func(c *Config) { c.Mode = ModeLive; c.Rate = 10_000_000; c.Duration = time.Hour }, "--rate, --duration"},
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
