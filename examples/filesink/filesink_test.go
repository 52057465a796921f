//go:build unix

package filesink_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/heraldhq/herald/examples/filesink"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// read returns the lines of dir's file for destination.
func read(t *testing.T, dir, destination string) []filesink.Line {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, destination+".jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []filesink.Line
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var l filesink.Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

func newSink(t *testing.T, dir string) *filesink.Sink {
	t.Helper()
	s, err := filesink.New("files", filesink.Config{Dir: dir, MaxEventBytes: 64 << 10, LockedRetry: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	sinktest.Run(t, sinktest.Harness{
		NewSink:     func(t *testing.T, _ string) sinks.Sink { return newSink(t, dir) },
		Unreachable: func(t *testing.T, _ string) sinks.Sink { return newSink(t, filepath.Join(dir, "missing")) },
		Received: func(t *testing.T, destination string) []sinktest.Received {
			var out []sinktest.Received
			for _, l := range read(t, dir, destination) {
				out = append(out, sinktest.Received{ID: l.ID, Key: l.Key, Destination: destination, Payload: l.Payload, Headers: l.Headers})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Oversized(destination, key, 64<<10+1)
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
	})
}

// TestLockedFileAsksForItsWait: while a consumer holds a file's lock, its
// events fail with the configured wait (sinks.RetryAfter), the later events
// of their key are not written, and other files are written.
func TestLockedFileAsksForItsWait(t *testing.T) {
	dir := t.TempDir()
	s := newSink(t, dir)
	locked, err := os.OpenFile(filepath.Join(dir, "rotating.jsonl"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer locked.Close()
	if err := syscall.Flock(int(locked.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	events := []sinks.Event{
		sinktest.Event("rotating", "k", []byte(`{"n":1}`)),
		sinktest.Event("rotating", "k", []byte(`{"n":2}`)),
		sinktest.Event("other", "j", []byte(`{"n":3}`)),
	}
	errs := s.Publish(context.Background(), events)
	if d, ok := sinks.RetryDelay(errs[0]); !ok || d != 7*time.Second || sinks.IsPermanent(errs[0]) || sinks.IsUnavailable(errs[0]) {
		t.Fatalf("locked file: %v (delay %s, %t), want a 7s RetryAfter", errs[0], d, ok)
	}
	if !errors.Is(errs[1], sinks.ErrSkipped) || errs[2] != nil {
		t.Fatalf("results %v, want the key's next event skipped and the other file written", errs)
	}
	if got := read(t, dir, "rotating"); len(got) != 0 {
		t.Fatalf("%d lines written to the locked file", len(got))
	}
	if got := read(t, dir, "other"); len(got) != 1 || got[0].ID != events[2].ID {
		t.Fatalf("other file holds %+v, want event %s", got, events[2].ID)
	}

	if err := syscall.Flock(int(locked.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if errs := s.Publish(context.Background(), events[:2]); errs[0] != nil || errs[1] != nil {
		t.Fatalf("after the consumer let go: %v", errs)
	}
	if got := read(t, dir, "rotating"); len(got) != 2 || got[0].ID != events[0].ID || got[1].ID != events[1].ID {
		t.Fatalf("rotating file holds %+v, want both events in order", got)
	}
}

func TestFailureKinds(t *testing.T) {
	dir := t.TempDir()
	s := newSink(t, dir)
	for _, dest := range []string{"../escape", "a/b", ".hidden", ""} {
		err := s.Publish(context.Background(), []sinks.Event{sinktest.Event(dest, "", []byte(`{}`))})[0]
		if !sinks.IsPermanent(err) {
			t.Fatalf("destination %q: %v, want permanent", dest, err)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a destination escaped the directory: %v", err)
	}

	gone := newSink(t, filepath.Join(dir, "missing"))
	err := gone.Publish(context.Background(), []sinks.Event{sinktest.Event("x", "", []byte(`{}`))})[0]
	if !sinks.IsUnavailable(err) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing directory: %v, want unavailable wrapping ErrNotExist", err)
	}

	if _, err := filesink.New("files", filesink.Config{}); err == nil || err.Error() != "filesink: dir: required" {
		t.Fatalf("New without a directory: %v", err)
	}
}
