package relayconfig

import (
	"log/slog"
	"os"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/email"
	"github.com/heraldhq/herald/sinks/kafka"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/nats"
	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sns"
	"github.com/heraldhq/herald/sinks/sqs"
	"github.com/heraldhq/herald/sinks/webhook"
)

// newSinkFunc creates a configured sink; the sink's own settings are bound
// in it.
type newSinkFunc func(name string, logger *slog.Logger) (sinks.Sink, error)

// SinkType decodes and validates the keys of one sink entry (without name
// and type) and returns the function creating the sink. prefix names the
// entry in errors ("sinks[1] (events-kafka)"). SinkTypeOf makes one.
type SinkType func(d *decoder, n *yaml.Node, prefix string) (newSinkFunc, error)

// sinkTypes are the built-in values of a sink entry's type key.
var sinkTypes = map[string]SinkType{
	"stdout": SinkTypeOf(func(name string, _ noConfig, _ *slog.Logger) (*sinks.Stdout, error) {
		return sinks.NewStdout(name, os.Stdout), nil
	}),
	"discard": SinkTypeOf(func(name string, _ noConfig, _ *slog.Logger) (*sinks.Discard, error) {
		return sinks.NewDiscard(name), nil
	}),
	"kafka":    SinkTypeOf(kafka.New),
	"nats":     SinkTypeOf(nats.New),
	"webhook":  SinkTypeOf(webhook.New),
	"email":    SinkTypeOf(email.New),
	"rabbitmq": SinkTypeOf(rabbitmq.New),
	"redis":    SinkTypeOf(redis.New),
	"mqtt":     SinkTypeOf(mqtt.New),
	"pubsub":   SinkTypeOf(pubsub.New),
	"sqs":      SinkTypeOf(sqs.New),
	"sns":      SinkTypeOf(sns.New),
}

// noConfig is the settings of a sink type that has none.
type noConfig struct{}

func (noConfig) Validate() error { return nil }

// SinkTypeOf adapts a sink package's Config and New to SinkType: the keys
// of a sink entry are decoded into a C as they are for the built-in sinks
// (by yaml tags, strictly, with ${NAME} expansion), checked with its
// Validate, and given to newSink with the sink's name.
func SinkTypeOf[C interface{ Validate() error }, S sinks.Sink](newSink func(string, C, *slog.Logger) (S, error)) SinkType {
	return func(d *decoder, n *yaml.Node, prefix string) (newSinkFunc, error) {
		var cfg C
		if err := d.decode(n, reflect.ValueOf(&cfg).Elem(), prefix); err != nil {
			return nil, err
		}
		if err := cfg.Validate(); err != nil {
			return nil, prefixErr(prefix, err)
		}
		return func(name string, logger *slog.Logger) (sinks.Sink, error) {
			s, err := newSink(name, cfg, logger)
			if err != nil {
				return nil, err
			}
			return s, nil
		}, nil
	}
}

// sinkType returns the type of sink named typ: a built-in one or one of
// the Loader's.
func (d *decoder) sinkType(typ string) (SinkType, bool) {
	if st, ok := sinkTypes[typ]; ok {
		return st, true
	}
	st, ok := d.sinkTypes[typ]
	return st, ok
}

// knownSinkTypes returns the names of the sink types, sorted.
func (d *decoder) knownSinkTypes() []string {
	names := make([]string, 0, len(sinkTypes)+len(d.sinkTypes))
	for name := range sinkTypes {
		names = append(names, name)
	}
	for name := range d.sinkTypes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
