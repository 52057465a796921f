package sinks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Stdout writes one JSON object per event and line to a writer (standard
// output in the CLI). JSON payloads are embedded as JSON; other payloads as
// base64 strings.
type Stdout struct {
	name string
	mu   sync.Mutex
	w    *bufio.Writer
}

// NewStdout returns a sink called name writing to w.
func NewStdout(name string, w io.Writer) *Stdout {
	return &Stdout{name: name, w: bufio.NewWriter(w)}
}

// stdoutLine is the shape of one line written by Stdout.
type stdoutLine struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Destination string            `json:"destination,omitempty"`
	Key         string            `json:"key,omitempty"`
	ContentType string            `json:"content_type"`
	Headers     map[string]string `json:"headers,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	Attempt     int               `json:"attempt"`
	Payload     any               `json:"payload"`
}

// Name implements Sink.
func (s *Stdout) Name() string { return s.name }

// PublishesConcurrently implements ConcurrentPublisher: calls take turns
// on the writer.
func (s *Stdout) PublishesConcurrently() bool { return true }

// Publish implements Sink. An event whose JSON payload does not parse is a
// permanent failure; a write error fails the rest of the batch. The events
// written are delivered once the writer is flushed.
func (s *Stdout) Publish(ctx context.Context, events []Event) []error {
	res := NewResults(ctx, events, func(*Event) string { return s.name })
	s.mu.Lock()
	defer s.mu.Unlock()
	enc := json.NewEncoder(s.w)
	var written []int
	for i, e := range events {
		if res.Blocked(i) {
			continue
		}
		line := stdoutLine{ID: e.ID, Topic: e.Topic, Key: e.Key, ContentType: e.ContentType,
			Headers: e.Headers, CreatedAt: e.CreatedAt, Attempt: e.Attempt}
		if e.Destination != e.Topic {
			line.Destination = e.Destination
		}
		if IsJSON(e.ContentType) {
			if err := sinkconfig.CheckJSON(e.Payload); err != nil {
				res.Fail(i, Permanent(err))
				continue
			}
			line.Payload = json.RawMessage(e.Payload)
		} else {
			line.Payload = e.Payload // encoding/json writes []byte as base64
		}
		if err := enc.Encode(line); err != nil {
			err = fmt.Errorf("writing: %w", err)
			res.Fail(i, err)
			res.Stop(err)
			continue
		}
		written = append(written, i)
	}
	err := s.w.Flush()
	for _, i := range written {
		if err != nil {
			res.Fail(i, fmt.Errorf("flushing: %w", err))
		} else {
			res.Delivered(i)
		}
	}
	return res.Errors()
}

// Close implements Sink.
func (s *Stdout) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Flush()
}
