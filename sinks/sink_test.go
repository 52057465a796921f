package sinks_test

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
)

func TestRetryAfterMark(t *testing.T) {
	t.Parallel()
	base := &fs.PathError{Op: "write", Path: "/x", Err: errors.New("throttled")}
	cases := []struct {
		name                   string
		err                    error
		delay                  time.Duration
		marked                 bool
		permanent, unavailable bool
	}{
		{name: "plain", err: sinks.RetryAfter(base, 3*time.Second), delay: 3 * time.Second, marked: true},
		{name: "negative is zero", err: sinks.RetryAfter(base, -time.Second), delay: 0, marked: true},
		{name: "wrapped", err: fmtWrap(sinks.RetryAfter(base, time.Minute)), delay: time.Minute, marked: true},
		{name: "in permanent", err: sinks.Permanent(sinks.RetryAfter(base, time.Minute)), delay: time.Minute, marked: true, permanent: true},
		{name: "over unavailable", err: sinks.RetryAfter(sinks.Unavailable(base), time.Minute), delay: time.Minute, marked: true, unavailable: true},
		{name: "outermost wins", err: sinks.RetryAfter(sinks.RetryAfter(base, time.Hour), time.Minute), delay: time.Minute, marked: true},
		{name: "unmarked", err: base},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, ok := sinks.RetryDelay(c.err)
			if ok != c.marked || d != c.delay {
				t.Fatalf("RetryDelay(%v) = %s, %t; want %s, %t", c.err, d, ok, c.delay, c.marked)
			}
			if !errors.Is(c.err, base) {
				t.Fatalf("errors.Is(%v, base) = false: the mark must keep the chain", c.err)
			}
			var pe *fs.PathError
			if !errors.As(c.err, &pe) || pe != base {
				t.Fatalf("errors.As did not find the *fs.PathError under %v", c.err)
			}
			if sinks.IsPermanent(c.err) != c.permanent || sinks.IsUnavailable(c.err) != c.unavailable {
				t.Fatalf("IsPermanent %t, IsUnavailable %t; want %t, %t", sinks.IsPermanent(c.err), sinks.IsUnavailable(c.err), c.permanent, c.unavailable)
			}
			if c.marked && !strings.Contains(c.err.Error(), "retry after") {
				t.Fatalf("message %q does not say the delay", c.err)
			}
		})
	}
	if sinks.RetryAfter(nil, time.Second) != nil {
		t.Fatal("RetryAfter(nil, d) must be nil")
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("publishing"), err) }
