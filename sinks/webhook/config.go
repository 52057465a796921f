package webhook

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Format is how an event becomes a request body.
type Format string

const (
	// FormatEnvelope sends a JSON object describing the event (see the
	// package documentation). It is the default.
	FormatEnvelope Format = "envelope"
	// FormatRaw sends the payload bytes as they are, with the event's
	// content type, for endpoints that expect a body of their own shape.
	FormatRaw Format = "raw"
	// FormatCloudEvents sends a CloudEvent per the CloudEvents HTTP
	// protocol binding, in the content mode cloudevents.mode selects (see
	// the package documentation).
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of Config fields left at their zero value.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultConcurrency  = 16
	DefaultMaxBodyBytes = 1 << 20
)

// secretPrefix starts every Standard Webhooks signing secret.
const secretPrefix = "whsec_"

// Config is a webhook sink's entry in the YAML `sinks:` list, without the
// `name` and `type` keys.
type Config struct {
	// URL is the endpoint every event is POSTed to (http or https). Required.
	// It never comes from event data: an event's Destination is ignored.
	URL string `yaml:"url"`
	// Secret signs requests per the Standard Webhooks specification: it is
	// "whsec_" followed by the base64 of the key bytes. Optional; without any
	// secret, requests carry no webhook-signature header.
	Secret sinkconfig.Secret `yaml:"secret"`
	// Secrets are more signing secrets, for rotation: every request carries
	// one signature per secret (Secret first, then Secrets in order).
	Secrets []sinkconfig.Secret `yaml:"secrets"`
	// Format is envelope, raw or cloudevents. Defaults to envelope.
	Format Format `yaml:"format"`
	// CloudEvents sets the CloudEvents source and content mode; source is
	// required when Format is cloudevents, and the block is refused with
	// any other format.
	CloudEvents cloudevents.Config `yaml:"cloudevents"`
	// Timeout bounds each request, from connecting to reading the response
	// status. Defaults to 10s.
	Timeout time.Duration `yaml:"timeout"`
	// Concurrency is the most requests in flight to the endpoint at once
	// (events of one key still go one after the other). Defaults to 16.
	Concurrency int `yaml:"concurrency"`
	// Headers are static headers added to every request (an Authorization
	// token, a tenant id). Values are secrets: they never print. Headers the
	// sink sets itself (Content-Type, User-Agent, the webhook-* and trace
	// headers…) are refused.
	Headers map[string]sinkconfig.Secret `yaml:"headers"`
	// TLS configures https endpoints: extra roots, a client certificate.
	// Certificates are always verified unless tls.insecure_skip_verify.
	TLS sinkconfig.TLSConfig `yaml:"tls"`
	// FollowRedirects follows 307 and 308 redirects (which keep the method
	// and body) within the endpoint's origin (scheme, host and port), up to
	// 10 of them. Other redirects, redirects to another origin (which would
	// carry Headers and the signatures there), or any redirect when false,
	// are permanent failures naming the Location. Defaults to false.
	FollowRedirects bool `yaml:"follow_redirects"`
	// RetryOn lists response status codes (300–599) to treat as retryable,
	// overriding the defaults.
	RetryOn []int `yaml:"retry_on"`
	// PermanentOn lists response status codes (300–599) to treat as
	// permanent failures, overriding the defaults.
	PermanentOn []int `yaml:"permanent_on"`
	// MaxBodyBytes is the largest request body sent (the envelope, or the
	// raw payload); a larger event fails permanently. Defaults to 1 MiB.
	MaxBodyBytes int `yaml:"max_body_bytes"`
}

// reservedHeaders are set by the sink and cannot be configured in Headers.
var reservedHeaders = []string{"Content-Type", "Content-Length", "Host", "Transfer-Encoding", "Connection", "User-Agent",
	"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature", "Traceparent", "Tracestate"}

// WithDefaults returns c with the defaults of unset fields filled in.
func (c Config) WithDefaults() Config {
	c.Format = cmp.Or(c.Format, FormatEnvelope)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	return c
}

// Validate checks the configuration; errors name the offending key. It never
// prints a secret.
func (c Config) Validate() error {
	if _, err := c.endpoint(); err != nil {
		return err
	}
	if _, err := c.keys(); err != nil {
		return err
	}
	switch c.Format {
	case "", FormatEnvelope, FormatRaw:
		if c.CloudEvents != (cloudevents.Config{}) {
			return fmt.Errorf("cloudevents: set, but format is %q (set format: cloudevents)", c.format())
		}
	case FormatCloudEvents:
		if err := c.CloudEvents.Validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("format: %q must be envelope, raw or cloudevents", c.Format)
	}
	if err := cmp.Or(
		sinkconfig.NotNegative("timeout", c.Timeout),
		sinkconfig.NotNegative("concurrency", c.Concurrency),
		sinkconfig.NotNegative("max_body_bytes", c.MaxBodyBytes),
	); err != nil {
		return err
	}
	for name, value := range c.Headers {
		if !validHeaderName(name) {
			return fmt.Errorf("headers: %q is not a valid header name", name)
		}
		for _, r := range reservedHeaders {
			if strings.EqualFold(name, r) {
				return fmt.Errorf("headers.%s: set by the sink itself, cannot be configured", name)
			}
		}
		if c.Format == FormatCloudEvents && len(name) >= 3 && strings.EqualFold(name[:3], cloudevents.HTTP.Prefix) {
			return fmt.Errorf("headers.%s: ce- headers carry CloudEvents attributes with format: cloudevents, cannot be configured", name)
		}
		if !validHeaderValue(value.Reveal()) {
			return fmt.Errorf("headers.%s: value must not contain control characters (CR, LF, NUL…)", name)
		}
	}
	seen := map[int]string{}
	for _, list := range []struct {
		field string
		codes []int
	}{{"retry_on", c.RetryOn}, {"permanent_on", c.PermanentOn}} {
		for i, code := range list.codes {
			if code < 300 || code > 599 {
				return fmt.Errorf("%s[%d]: %d is not a status code from 300 to 599", list.field, i, code)
			}
			if other, ok := seen[code]; ok && other != list.field {
				return fmt.Errorf("%s[%d]: %d is also listed in %s", list.field, i, code, other)
			}
			seen[code] = list.field
		}
	}
	if _, err := c.TLS.Build("tls"); err != nil {
		return err
	}
	if c.TLS.On() && strings.HasPrefix(strings.ToLower(c.URL), "http:") {
		return errors.New("tls: set, but url is http:// (use https://)")
	}
	return nil
}

// format is Format with its default.
func (c Config) format() Format {
	if c.Format == "" {
		return FormatEnvelope
	}
	return c.Format
}

// endpoint parses URL. The error shows the URL without its password.
func (c Config) endpoint() (*url.URL, error) {
	if c.URL == "" {
		return nil, errors.New("url: required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, errors.New("url: not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("url: %q is not an http(s) URL", u.Redacted())
	}
	return u, nil
}

// keys decodes Secret and Secrets into HMAC keys.
func (c Config) keys() ([][]byte, error) {
	var keys [][]byte
	if c.Secret != "" {
		k, err := decodeSecret(c.Secret)
		if err != nil {
			return nil, fmt.Errorf("secret: %w", err)
		}
		keys = append(keys, k)
	}
	for i, s := range c.Secrets {
		k, err := decodeSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secrets[%d]: %w", i, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// decodeSecret returns the key bytes of a "whsec_<base64>" secret. Its
// errors never include the secret.
func decodeSecret(s sinkconfig.Secret) ([]byte, error) {
	v, ok := strings.CutPrefix(s.Reveal(), secretPrefix)
	if !ok {
		return nil, errors.New(`must start with "whsec_"`)
	}
	k, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, errors.New(`the part after "whsec_" is not valid base64`)
	}
	if len(k) == 0 {
		return nil, errors.New(`no key bytes after "whsec_"`)
	}
	return k, nil
}

// validHeaderName reports whether name is an HTTP token (RFC 9110).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
