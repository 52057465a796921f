package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Format is how an event becomes a message.
type Format string

const (
	// FormatHerald is the message described in the package documentation:
	// the payload, message_id, content_type, herald-topic, herald-key and
	// the event's headers. The default.
	FormatHerald Format = "herald"
	// FormatCloudEvents is a CloudEvent per the CloudEvents AMQP protocol
	// binding (cloudEvents_ headers), in the content mode cloudevents.mode
	// selects.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of the optional settings.
const (
	// DefaultConfirmTimeout is the default ConfirmTimeout.
	DefaultConfirmTimeout = 5 * time.Second
	// DefaultMaxPending is the default MaxPending.
	DefaultMaxPending = 1024
	// DefaultMaxMessageSize is the default MaxMessageSize: RabbitMQ's own
	// default max_message_size (128 MiB, since 3.8).
	DefaultMaxMessageSize = 128 << 20
)

// maxShortString is the longest AMQP 0-9-1 short string (exchange names,
// routing keys, header names): its length travels in one byte.
const maxShortString = 255

// Config is a RabbitMQ sink's entry in the YAML `sinks:` list (without
// `name` and `type`).
type Config struct {
	// URL is the broker's AMQP URI, amqp://user:password@host:5672/vhost or
	// amqps:// for TLS. It is a secret (it usually holds the password): it
	// is redacted wherever it is printed. Required.
	URL sinkconfig.Secret `yaml:"url"`
	// Exchange names the exchange each event is published to; the route's
	// destination is the routing key. It is a template in the language of
	// the route's destination (text/template over .ID, .Topic, .Key and
	// .Headers; a missing header fails the event permanently), so one sink
	// can publish to an exchange per tenant or per topic; a text without
	// actions is a fixed exchange. It must exist (the sink does not declare
	// topology). Defaults to "", the default exchange, which routes to the
	// queue named by the routing key; a template rendering "" means it too.
	Exchange string `yaml:"exchange"`
	// Mandatory publishes with the mandatory flag, so that the broker
	// returns a message no queue is bound to receive, and the sink reports
	// that event as a permanent failure. With false the broker drops such a
	// message silently and the event counts as delivered. Defaults to true.
	Mandatory *bool `yaml:"mandatory"`
	// TLS configures TLS. An amqps:// URL turns TLS on by itself.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// ConfirmTimeout bounds the wait for each publisher confirm, on top of
	// the deadline of the Publish context. Defaults to 5s.
	ConfirmTimeout time.Duration `yaml:"confirm_timeout"`
	// MaxPending is the most messages in flight (published, not yet
	// confirmed) at once; a larger batch waits for the oldest confirms
	// before sending more. Defaults to 1024.
	MaxPending int `yaml:"max_pending"`
	// MaxMessageSize is the largest payload sent; a larger event fails
	// permanently without being sent. Keep it at or below the broker's
	// max_message_size. Defaults to 134217728 (128 MiB, RabbitMQ's default).
	MaxMessageSize int `yaml:"max_message_size"`
	// Format is herald or cloudevents. Defaults to herald.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	raw := c.URL.Reveal()
	if raw == "" {
		return errors.New("url: required (for example amqp://guest:guest@127.0.0.1:5672/)")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("url: %q is not an AMQP URI such as amqp://user:password@host:5672/", sinkconfig.RedactURL(raw))
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return fmt.Errorf("url: %q: the scheme must be amqp or amqps", sinkconfig.RedactURL(raw))
	}
	if _, err := parseExchange(c.Exchange); err != nil {
		return err
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("confirm_timeout", c.ConfirmTimeout),
		sinkconfig.NotNegative("max_pending", c.MaxPending),
		sinkconfig.NotNegative("max_message_size", c.MaxMessageSize),
	); err != nil {
		return err
	}
	if err := c.CloudEvents.ValidateFormat(string(c.Format)); err != nil {
		return err
	}
	if _, err := c.TLS.Build("tls"); err != nil {
		return err
	}
	return nil
}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Mandatory == nil {
		on := true
		c.Mandatory = &on
	}
	c.ConfirmTimeout = cmp.Or(c.ConfirmTimeout, DefaultConfirmTimeout)
	c.MaxPending = cmp.Or(c.MaxPending, DefaultMaxPending)
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, DefaultMaxMessageSize)
	return c
}
