package sinks

import "context"

// Discard acknowledges every event without sending it anywhere. It exists to
// measure the relay itself.
type Discard struct {
	name string
}

// NewDiscard returns a Discard sink called name.
func NewDiscard(name string) *Discard { return &Discard{name: name} }

// Name implements Sink.
func (d *Discard) Name() string { return d.name }

// Publish implements Sink: every event succeeds.
func (d *Discard) Publish(_ context.Context, events []Event) []error {
	return make([]error, len(events))
}

// Close implements Sink.
func (d *Discard) Close(context.Context) error { return nil }
