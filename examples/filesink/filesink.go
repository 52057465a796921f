//go:build unix

// Package filesink is an example of a sink written outside Herald: it
// appends each event as a JSON line to a file per destination in a
// directory, and shows how a sink reports its failures so that the relay
// can act on them:
//
//   - sinks.Permanent for what no retry can fix (a destination that is not
//     a plain file name, a payload over the size limit): dead letter at once;
//   - sinks.Unavailable for the destination itself being down (the
//     directory is missing or not writable): the relay pauses the sink and
//     counts no attempt;
//   - sinks.RetryAfter for a failure with a known wait (the file's consumer
//     holds its lock while it rotates the file): the attempt counts and the
//     next one comes no sooner than the wait;
//   - anything else (a failed fsync) is retried with the relay's backoff.
//
// It records its results in a sinks.Results, which keeps the rest of the
// contract: the later events of a key whose event failed in the same call
// are not written (sinks.ErrSkipped: that would put them before their
// predecessor), nothing more is written once the directory is found
// unavailable, nor once the call's context ended (sinks.ErrNotSent), and
// each result is reported as soon as it is known.
//
// An event is acknowledged (nil) only after its line is written and synced
// to disk. Consumers that rotate a file take an exclusive flock(2) on it
// while they do.
package filesink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// Config configures a Sink.
type Config struct {
	// Dir is the directory the files are in. It must exist. Required.
	Dir string
	// MaxEventBytes is the largest payload written. Defaults to 1 MiB.
	MaxEventBytes int
	// LockedRetry is how long to wait before writing again to a file whose
	// consumer holds its lock. Defaults to 5 seconds.
	LockedRetry time.Duration
}

// Line is one event as written, one JSON object per line.
type Line struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Key         string            `json:"key,omitempty"`
	ContentType string            `json:"content_type"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	Payload     []byte            `json:"payload"` // base64, byte for byte
}

// Sink appends events to files. It implements sinks.Sink.
type Sink struct {
	name string
	cfg  Config
}

// New returns a sink called name writing into cfg.Dir.
func New(name string, cfg Config) (*Sink, error) {
	if cfg.Dir == "" {
		return nil, errors.New("filesink: dir: required")
	}
	if cfg.MaxEventBytes < 0 || cfg.LockedRetry < 0 {
		return nil, errors.New("filesink: max_event_bytes and locked_retry must not be negative")
	}
	if cfg.MaxEventBytes == 0 {
		cfg.MaxEventBytes = 1 << 20
	}
	if cfg.LockedRetry == 0 {
		cfg.LockedRetry = 5 * time.Second
	}
	return &Sink{name: name, cfg: cfg}, nil
}

// Name implements sinks.Sink.
func (s *Sink) Name() string { return s.name }

// Close implements sinks.Sink. Publish leaves nothing open or buffered.
func (s *Sink) Close(context.Context) error { return nil }

// Publish implements sinks.Sink: it writes the events in order, each
// destination's under that file's lock, and syncs each file before
// acknowledging the events written to it.
func (s *Sink) Publish(ctx context.Context, events []sinks.Event) []error {
	res := sinks.NewResults(ctx, events, nil)
	files := map[string]*file{}
	defer func() {
		for _, f := range files {
			f.close()
		}
	}()
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		f, err := s.write(files, e)
		if err != nil {
			res.Fail(i, err)
			continue
		}
		f.written = append(f.written, i)
	}
	for _, f := range files {
		err := f.f.Sync()
		for _, i := range f.written {
			if err != nil {
				res.Fail(i, fmt.Errorf("syncing %s: %w", f.f.Name(), err))
			} else {
				res.Delivered(i)
			}
		}
	}
	return res.Errors()
}

// write appends e's line to its destination's file.
func (s *Sink) write(files map[string]*file, e sinks.Event) (*file, error) {
	if len(e.Payload) > s.cfg.MaxEventBytes {
		return nil, sinks.TooLarge(len(e.Payload), s.cfg.MaxEventBytes)
	}
	f, err := s.open(files, e.Destination)
	if err != nil {
		return nil, err
	}
	line, err := json.Marshal(Line{ID: e.ID, Topic: e.Topic, Key: e.Key, ContentType: e.ContentType,
		Headers: e.Headers, CreatedAt: e.CreatedAt, Payload: e.Payload})
	if err != nil {
		return nil, sinks.Permanent(fmt.Errorf("encoding: %w", err))
	}
	if _, err := f.f.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("writing %s: %w", f.f.Name(), err)
	}
	return f, nil
}

// file is a destination's file, locked for the length of one Publish call.
type file struct {
	f       *os.File
	written []int // indices of the events written to it
}

func (f *file) close() {
	_ = syscall.Flock(int(f.f.Fd()), syscall.LOCK_UN)
	_ = f.f.Close()
}

// open returns the destination's file, opened and locked once per call.
func (s *Sink) open(files map[string]*file, destination string) (*file, error) {
	if f, ok := files[destination]; ok {
		return f, nil
	}
	// Destinations come from event data: only a plain name may become a
	// path, or an event could write anywhere the relay can.
	if destination == "" || len(destination) > 200 || strings.ContainsAny(destination, "/\\\x00") || strings.HasPrefix(destination, ".") {
		return nil, sinks.Permanent(fmt.Errorf("destination %q is not a plain file name", destination))
	}
	path := filepath.Join(s.cfg.Dir, destination+".jsonl")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			// The directory is gone or not ours: no event can be written
			// until an operator fixes it, so pause the sink.
			return nil, sinks.Unavailable(fmt.Errorf("opening %s: %w", path, err))
		}
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, sinks.RetryAfter(fmt.Errorf("%s is locked by its consumer", path), s.cfg.LockedRetry)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	files[destination] = &file{f: f}
	return files[destination], nil
}
