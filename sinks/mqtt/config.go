package mqtt

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Format is how an event becomes a message.
type Format string

const (
	// FormatHerald is the message described in the package documentation:
	// the payload, Content Type, Herald-Id, Herald-Topic, Herald-Key and
	// the event's headers as user properties. The default.
	FormatHerald Format = "herald"
	// FormatCloudEvents is a CloudEvent per the CloudEvents MQTT protocol
	// binding (MQTT 5), in the content mode cloudevents.mode selects.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of the optional settings.
const (
	// DefaultAckTimeout is the default AckTimeout.
	DefaultAckTimeout = 10 * time.Second
	// DefaultConnectTimeout is the default ConnectTimeout.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultKeepAlive is the default KeepAlive.
	DefaultKeepAlive = 30 * time.Second
)

// Config is an MQTT sink's entry in the YAML `sinks:` list (without `name`
// and `type`).
type Config struct {
	// URL is the broker: mqtt://host:port (or tcp://) in clear,
	// mqtts://host:port (or ssl://, tls://) over TLS. The port defaults to
	// 1883 in clear and 8883 over TLS. User information in the URL
	// (mqtt://user:password@host) is the same as Username and Password.
	// Required.
	URL string `yaml:"url"`
	// Username and Password authenticate the connection. Defaults to none
	// (anonymous), or the URL's user information.
	Username string            `yaml:"username"`
	Password sinkconfig.Secret `yaml:"password"`
	// ClientID is the MQTT client identifier. Brokers disconnect the older
	// of two clients with one identifier, so two relays must not share it.
	// Defaults to "herald-<sink name>-<random>".
	ClientID string `yaml:"client_id"`
	// TLS configures TLS. An mqtts://, ssl:// or tls:// URL turns TLS on by
	// itself.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// AckTimeout bounds the wait for each message's PUBACK, on top of the
	// deadline of the Publish context. Defaults to 10s.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// ConnectTimeout bounds dialling and the CONNECT/CONNACK exchange, on
	// top of the deadline of the calling context. Defaults to 10s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// KeepAlive is the MQTT keep-alive interval the sink asks for (the
	// broker may impose its own). Defaults to 30s.
	KeepAlive time.Duration `yaml:"keep_alive"`
	// Retain publishes every message with the retain flag, so that a new
	// subscriber gets the last message of each topic. Defaults to false.
	Retain bool `yaml:"retain"`
	// Format is herald or cloudevents. Defaults to herald.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
}

// broker is a parsed URL: the address to dial and whether TLS is on.
type broker struct {
	addr     string
	tls      bool
	username string
	password string
	hasUser  bool
}

// parseURL parses raw, naming the url key and redacting user information
// in errors.
func parseURL(raw string) (broker, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return broker{}, fmt.Errorf("url: %q is not a broker URL such as mqtt://127.0.0.1:1883", sinkconfig.RedactURL(raw))
	}
	var b broker
	port := "1883"
	switch u.Scheme {
	case "mqtt", "tcp":
	case "mqtts", "ssl", "tls":
		b.tls, port = true, "8883"
	default:
		return broker{}, fmt.Errorf("url: %q: the scheme must be mqtt, tcp, mqtts, ssl or tls", sinkconfig.RedactURL(raw))
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return broker{}, fmt.Errorf("url: %q: an MQTT broker URL has no path or query (topics come from the route's destination)", sinkconfig.RedactURL(raw))
	}
	if u.Port() != "" {
		port = u.Port()
	}
	b.addr = net.JoinHostPort(u.Hostname(), port)
	if u.User != nil {
		b.hasUser = true
		b.username = u.User.Username()
		b.password, _ = u.User.Password()
	}
	return b, nil
}

// Validate reports the first configuration problem, naming the key.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("url: required (for example mqtt://127.0.0.1:1883)")
	}
	b, err := parseURL(c.URL)
	if err != nil {
		return err
	}
	if b.hasUser && (c.Username != "" || c.Password != "") {
		return errors.New("username, password: give the credentials in url or in username/password, not both")
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("password: requires username")
	}
	if !utf8.ValidString(c.ClientID) || len(c.ClientID) > 65535 {
		return fmt.Errorf("client_id: %q must be UTF-8 text of at most 65535 bytes", c.ClientID)
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("ack_timeout", c.AckTimeout),
		sinkconfig.NotNegative("connect_timeout", c.ConnectTimeout),
	); err != nil {
		return err
	}
	if c.KeepAlive < 0 || c.KeepAlive > 65535*time.Second {
		return fmt.Errorf("keep_alive: %s must be between 0 and 65535s", c.KeepAlive)
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
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.KeepAlive = cmp.Or(c.KeepAlive, DefaultKeepAlive)
	return c
}

// String implements fmt.Stringer with the URL's user information redacted,
// so that printing a Config (or a struct holding one) shows no password.
func (c Config) String() string {
	c.URL = sinkconfig.RedactURL(c.URL)
	type plain Config // without this method, so that %+v does not recurse
	return fmt.Sprintf("%+v", plain(c))
}

// LogValue implements slog.LogValuer with the URL's user information
// redacted.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }
