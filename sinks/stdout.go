package sinks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
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

// Publish implements Sink. An event whose JSON payload does not parse is a
// permanent failure; a write error fails the rest of the batch.
func (s *Stdout) Publish(_ context.Context, events []Event) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(events))
	enc := json.NewEncoder(s.w)
	for i, e := range events {
		line := stdoutLine{ID: e.ID, Topic: e.Topic, Key: e.Key, ContentType: e.ContentType,
			Headers: e.Headers, CreatedAt: e.CreatedAt, Attempt: e.Attempt}
		if e.Destination != e.Topic {
			line.Destination = e.Destination
		}
		if IsJSON(e.ContentType) {
			if err := CheckJSON(e.Payload); err != nil {
				errs[i] = Permanent(fmt.Errorf("event %s: %w", e.ID, err))
				continue
			}
			line.Payload = json.RawMessage(e.Payload)
		} else {
			line.Payload = e.Payload // encoding/json writes []byte as base64
		}
		if err := enc.Encode(line); err != nil {
			for j := i; j < len(errs); j++ {
				errs[j] = fmt.Errorf("writing event %s: %w", e.ID, err)
			}
			return errs
		}
	}
	if err := s.w.Flush(); err != nil {
		return Fill(len(events), fmt.Errorf("flushing stdout sink: %w", err))
	}
	return errs
}

// Close implements Sink.
func (s *Stdout) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Flush()
}
