package sinks_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// nested returns a JSON value of depth arrays inside one another.
func nested(depth int) []byte {
	return []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth))
}

// TestStdoutExplainsDeepJSON covers the stdout sink given a JSON payload
// nested past MaxJSONDepth: the event fails permanently, saying it nests
// too deep, and the next event is still written.
func TestStdoutExplainsDeepJSON(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s := sinks.NewStdout("console", &out)
	events := []sinks.Event{
		{ID: "deep", Topic: "t", Destination: "t", ContentType: sinks.ContentTypeJSON, Payload: nested(sinkconfig.MaxJSONDepth + 1)},
		{ID: "fine", Topic: "t", Destination: "t", ContentType: sinks.ContentTypeJSON, Payload: []byte(`{"a":1}`)},
	}
	errs := s.Publish(context.Background(), events)
	if !sinks.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "deeper than 10000 levels") {
		t.Fatalf("deep payload: %v, want permanent saying it nests deeper than 10000 levels", errs[0])
	}
	if errs[1] != nil || !strings.Contains(out.String(), `"id":"fine"`) {
		t.Fatalf("next event: %v, output %q", errs[1], out.String())
	}
}

// TestStdoutSkipsBehindAFailedKey: after an event of a key fails, the key's
// later events in the call are not written (sinks.ErrSkipped); other keys
// are.
func TestStdoutSkipsBehindAFailedKey(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s := sinks.NewStdout("console", &out)
	events := []sinks.Event{
		{ID: "bad", Topic: "t", Key: "k", ContentType: sinks.ContentTypeJSON, Payload: []byte(`{`)},
		{ID: "behind", Topic: "t", Key: "k", ContentType: sinks.ContentTypeJSON, Payload: []byte(`{}`)},
		{ID: "other", Topic: "t", Key: "j", ContentType: sinks.ContentTypeJSON, Payload: []byte(`{}`)},
	}
	errs := s.Publish(context.Background(), events)
	if !sinks.IsPermanent(errs[0]) || !errors.Is(errs[1], sinks.ErrSkipped) || errs[2] != nil {
		t.Fatalf("results %v, want permanent, skipped, delivered", errs)
	}
	if strings.Contains(out.String(), `"id":"behind"`) || !strings.Contains(out.String(), `"id":"other"`) {
		t.Fatalf("output %q, want the other key's event and not the skipped one", out.String())
	}
}
