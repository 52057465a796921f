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

// sinkType decodes and validates the keys of one sink entry (without name
// and type) and returns the function creating the sink. prefix names the
// entry in errors ("sinks[1] (events-kafka)").
type sinkType func(d *decoder, n *yaml.Node, prefix string) (newSinkFunc, error)

// sinkTypes are the known values of a sink entry's type key.
var sinkTypes = map[string]sinkType{
	"stdout": sinkTypeOf(func(name string, _ noConfig, _ *slog.Logger) (*sinks.Stdout, error) {
		return sinks.NewStdout(name, os.Stdout), nil
	}),
	"discard": sinkTypeOf(func(name string, _ noConfig, _ *slog.Logger) (*sinks.Discard, error) {
		return sinks.NewDiscard(name), nil
	}),
	"kafka":    sinkTypeOf(kafka.New),
	"nats":     sinkTypeOf(nats.New),
	"webhook":  sinkTypeOf(webhook.New),
	"email":    sinkTypeOf(email.New),
	"rabbitmq": sinkTypeOf(rabbitmq.New),
	"redis":    sinkTypeOf(redis.New),
	"mqtt":     sinkTypeOf(mqtt.New),
	"pubsub":   sinkTypeOf(pubsub.New),
	"sqs":      sinkTypeOf(sqs.New),
	"sns":      sinkTypeOf(sns.New),
}

// noConfig is the settings of a sink type that has none.
type noConfig struct{}

func (noConfig) Validate() error { return nil }

// sinkTypeOf adapts a sink package's Config and New to sinkType.
func sinkTypeOf[C interface{ Validate() error }, S sinks.Sink](newSink func(string, C, *slog.Logger) (S, error)) sinkType {
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

func knownSinkTypes() []string {
	names := make([]string, 0, len(sinkTypes))
	for name := range sinkTypes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
