package relay

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// callLog records every measurement it receives as a line.
type callLog struct {
	NopObserver
	calls []string
}

func (c *callLog) log(format string, args ...any) {
	c.calls = append(c.calls, fmt.Sprintf(format, args...))
}

func (c *callLog) Claimed(n int, d time.Duration)         { c.log("claimed %d %s", n, d) }
func (c *callLog) Published(s, t string, d time.Duration) { c.log("published %s %s %s", s, t, d) }
func (c *callLog) Failed(s, t, o string)                  { c.log("failed %s %s %s", s, t, o) }
func (c *callLog) DeadLettered(s, t string)               { c.log("dead %s %s", s, t) }
func (c *callLog) SinkPaused(s string, p bool)            { c.log("paused %s %v", s, p) }
func (c *callLog) Recorded(n int, d time.Duration)        { c.log("recorded %d %s", n, d) }
func (c *callLog) SinkPublish(s string, n int, d time.Duration) {
	c.log("publish %s %d %s", s, n, d)
}
func (c *callLog) SinkHandedOff(s string, n int) { c.log("handed off %s %d", s, n) }
func (c *callLog) SinkInFlight(s string, n int)  { c.log("in flight %s %d", s, n) }
func (c *callLog) RecordFenced(n int)            { c.log("fenced %d", n) }
func (c *callLog) HistoryLength(n int64)         { c.log("history %d", n) }

func TestObserversPassEveryMeasurementToEach(t *testing.T) {
	t.Parallel()
	a, b := &callLog{}, &callLog{}
	o := Observers(a, nil, b)
	o.Claimed(3, time.Millisecond)
	o.Published("hook", "orders", 2*time.Millisecond)
	o.Failed("hook", "orders", "retry")
	o.DeadLettered("hook", "orders")
	o.SinkPaused("hook", true)
	o.Recorded(3, 4*time.Millisecond)
	o.SinkPublish("hook", 3, 5*time.Millisecond)
	o.SinkHandedOff("hook", 2)
	o.SinkInFlight("hook", 7)
	o.RecordFenced(4)
	o.HistoryLength(9)
	want := []string{"claimed 3 1ms", "published hook orders 2ms", "failed hook orders retry", "dead hook orders",
		"paused hook true", "recorded 3 4ms", "publish hook 3 5ms", "handed off hook 2", "in flight hook 7",
		"fenced 4", "history 9"}
	for i, c := range []*callLog{a, b} {
		if !slices.Equal(c.calls, want) {
			t.Errorf("observer %d got %q, want %q", i, c.calls, want)
		}
	}
	if one := Observers(nil, a); one != Observer(a) {
		t.Errorf("Observers of one: %T, want the observer itself", one)
	}
	if _, ok := Observers(nil).(NopObserver); !ok {
		t.Errorf("Observers of none: want a NopObserver")
	}
}
